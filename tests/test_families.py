"""Every family TransformerLens converts: loaded offline, and patched exactly.

For each family a tiny random checkpoint is made with transformers' own config class
(``family_configs``: every feature the family brings switched on, prompts longer than the
sliding windows) and loaded with ``load_checkpoint``. Then:

* logits equal transformers' forward (<= 1e-4 in float32);
* activation patching (heads and MLPs at 0 and at the other positions, neurons), path patching
  (head, MLP and neuron senders into q, k, v and MLP-input receivers) and attribution equal the
  slow reference AND an independent patch written with plain TransformerLens hooks
  (``tests/oracle.py``, which shares no code with the engine).
"""

import logging

import pytest
import torch

import p0circuit as p0
import oracle as O
from p0circuit.core.types import Kind, Node
from family_configs import VOCAB, family_configs, feature_cover, make_checkpoint
from tiers import FAST
from tolerance import close, tolerance

FAMILIES = feature_cover() if FAST else sorted(family_configs())
"""Every family; the fast tier: a set of families that brings every architecture feature (``tiers``)."""
MOE = {"mixtral", "olmoe", "gpt_oss"}
POST_NORM_HEADS = {"gemma2", "gemma3", "olmo2", "olmo3"}  # a norm after the attention output


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="session", params=FAMILIES)
def family(request, root):
    logging.disable(logging.WARNING)
    path = make_checkpoint(request.param, root)
    return request.param, path, p0.load_checkpoint(path)


TOKENS = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(1))  # longer than windows of 4
METRIC_LAYER = 2
P0_DIM = 5


def test_logits_equal_transformers(family):
    from transformers import AutoModelForCausalLM

    name, path, model = family
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        theirs = hf(TOKENS).logits
        diff, scale = (theirs - model(TOKENS)).abs().max().item(), theirs.abs().max().item()
    assert diff <= tolerance(scale=scale), f"{name}: max logit difference {diff} (logits up to {scale:.3g})"


def test_parameters_own_their_memory(family):
    """The loader hands the converted tensors over without copying them, then unties what was tied
    (an unembedding that is the embedding's transpose, parallel blocks' shared norms): TransformerLens
    edits parameters in place, and centering the unembedding must not move the embedding."""
    name, _, model = family
    spans = sorted((p.untyped_storage().data_ptr(), p.untyped_storage().data_ptr() + p.untyped_storage().nbytes(), n)
                   for n, p in model.named_parameters())
    shared = [(a[2], b[2]) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    assert not shared, f"{name}: parameters sharing memory: {shared[:4]}"


def test_the_hook_order_traced_by_parts_decides_as_the_whole_model_trace(family):
    """Issue 52: one block per structure and a one-column unembedding decide every write/read pair, every
    layout and every suffix layout as a trace of the whole model does. Only between the experts of one
    block may they differ: which experts fire depends on the routing of the traced ids, and an expert the
    whole trace did not reach is ordered by its enclosing module (conservatively)."""
    import re

    from p0circuit.patching.order import trace

    name, _, model = family
    parts, whole = trace(model), trace(model, whole=True)
    assert parts.traced == "parts" and whole.traced == "whole"
    assert parts.positional == whole.positional and parts.new_only == whole.new_only

    def experts_of(hook):
        found = re.match(r"blocks\.(\d+)\.mlp\.experts\.", hook)
        return found and found.group(1)

    names = list(model.hook_dict)
    differ = [(w, r) for w in names for r in names if parts.can_change(w, r) != whole.can_change(w, r)
              and not (experts_of(w) and experts_of(w) == experts_of(r))]
    assert not differ, f"{name}: {len(differ)} pairs decided otherwise, e.g. {differ[:3]}"
    if name not in MOE:
        assert parts.facts() == whole.facts()


def nodes_of(name, model):
    nodes = [n.name for n in p0.candidate_nodes(model)]
    if name not in MOE:
        nodes += ["M0.N1@0", "M1.N7@0", "M1.N3@rest"]
    return nodes


def senders_of(name):
    senders = ["A0.H1@0", "M0@0", "A1.H2@0", "A0.H3@rest", "M1@rest"]
    return senders + ([] if name in MOE else ["M0.N2@0", "M1.N4@rest"])


def three_ways(name, model, method, what, names, dim=None, **plain_kw):
    """``method`` fast and reference against plain hooks on ``names`` (nodes or edges); the raw
    values. The metric is the norm ratio, or with ``dim`` that residual dimension at P0."""
    metric = p0.NormRatio(METRIC_LAYER) if dim is None else p0.ResidDim(METRIC_LAYER, dim)
    kw = {what: names, "corruption": p0.Shift(filler=(O.FILLER,)), "metric": metric, "min_signal": 0}
    if plain_kw.get("denoise"):
        kw["direction"] = "denoise"
    fn = getattr(p0, f"{method}_patch")
    fast, slow = fn(model, TOKENS, **kw), fn(model, TOKENS, reference=True, **kw)
    om = O.Metric("norm_ratio", layer=METRIC_LAYER) if dim is None else O.Metric("resid_dim", layer=METRIC_LAYER, dim=dim)
    plain = getattr(O, method)(model, TOKENS, names, O.Corr("shift"), om, kw.get("direction", "noise"))
    bad = [(n, fast.raw[n], slow.raw[n], plain[n]) for n in names
           if not (close(fast.raw[n], plain[n], slow.clean_metric) and close(slow.raw[n], plain[n], slow.clean_metric))]
    assert not bad, f"{name}: {len(bad)} of {len(names)} {what} differ (name, fast, reference, plain): {bad[:4]}"
    return fast


def test_activation_fast_reference_plain(family):
    name, _, model = family
    fast = three_ways(name, model, "activation", "nodes", nodes_of(name, model))
    assert max(abs(v - fast.clean_metric) for v in fast.raw.values()) > 1e-3  # the patches change something


def test_a_metric_read_at_p0_fast_reference_plain(family):
    """ResidDim reads P0 alone, so the fast path runs positions up to P0 only and gives patches of
    later positions their effect without a forward: nodes (both directions) and edges against plain
    hooks that run every prompt whole."""
    name, _, model = family
    at_p0, later = [], []
    for n in nodes_of(name, model):  # every node at P0, and two after it (their exact 0 comes without a forward)
        (at_p0 if n.endswith("@0") else later).append(n)
    nodes = at_p0 + later[:2]
    for denoise in (False, True):
        fast = three_ways(name, model, "activation", "nodes", nodes, dim=P0_DIM, denoise=denoise)
        base = fast.corrupted_metric if denoise else fast.clean_metric
        assert max(abs(fast.raw[n] - base) for n in at_p0) > 1e-4  # the patches at P0 change something
        assert all(fast.raw[n] == base for n in later[:2])
    edges = sample([e.name for e in p0.candidate_edges(model, [Node.parse(s) for s in senders_of(name)])])
    into_p0 = [e for e in edges if e.split("->")[1].split("@")[1].startswith("0.")]
    three_ways(name, model, "path", "edges", into_p0 + [e for e in edges if e not in into_p0][:2], dim=P0_DIM)


def sample(edges):
    """One edge per (sender, receiver input, receiver position class), in candidate order: every
    sender, every input kind and every position pairing is still compared."""
    seen, out = set(), []
    for e in edges:
        src, rest = e.split("->")
        dst, inp = rest.rsplit(".", 1)
        key = (src, inp, dst.split("@")[1])
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def test_path_fast_reference_plain(family):
    name, _, model = family
    edges = [e.name for e in p0.candidate_edges(model, [Node.parse(s) for s in senders_of(name)])]
    picked = sample(edges)
    three_ways(name, model, "path", "edges", picked)
    assert {e.split("->")[1].rsplit(".", 1)[1] for e in picked} == {"q", "k", "v", "mlp_in"}
    assert {e.split("->")[0] for e in picked} == set(senders_of(name))


@pytest.mark.full
def test_path_fast_reference_plain_every_edge(family):
    """The same on every candidate edge (opt in: ``pytest -m full``)."""
    name, _, model = family
    three_ways(name, model, "path", "edges", [e.name for e in p0.candidate_edges(model, [Node.parse(s) for s in
                                                                                        senders_of(name)])])


def test_swap_fast_reference_plain(family):
    """The token swap (the corruption of a BOS-driven sink) on every family: the first token replaced
    in place, every position kept; the embedding at P0 is a candidate."""
    name, _, model = family
    if (TOKENS[:, 0] == O.FILLER).any():
        pytest.skip("a prompt already starts with the filler")
    nodes = ["E@0"] + nodes_of(name, model)
    kw = dict(nodes=nodes, corruption=p0.Swap(token=O.FILLER), metric=p0.NormRatio(METRIC_LAYER),
              min_signal=0)
    fast, slow = p0.activation_patch(model, TOKENS, **kw), p0.activation_patch(model, TOKENS, reference=True, **kw)
    plain = O.activation(model, TOKENS, nodes, O.Corr("swap"), O.Metric("norm_ratio", layer=METRIC_LAYER))
    bad = [(n, fast.raw[n], slow.raw[n], plain[n]) for n in nodes
           if not (close(fast.raw[n], plain[n], slow.clean_metric) and close(slow.raw[n], plain[n], slow.clean_metric))]
    assert not bad, f"{name}: {len(bad)} of {len(nodes)} nodes differ (name, fast, reference, plain): {bad[:4]}"
    assert abs(fast.raw["E@0"] - fast.clean_metric) > 1e-4  # swapping the token changes something


def test_node_faithfulness_plain(family):
    """A faithfulness point patches many nodes at once in the engine's fast pass: each point equals
    plain hooks patching every dropped node together."""
    name, _, model = family
    metric, corruption = p0.NormRatio(METRIC_LAYER), p0.Shift(filler=(O.FILLER,))
    result = p0.activation_patch(model, TOKENS, nodes=nodes_of(name, model), corruption=corruption, metric=metric,
                                 min_signal=0)
    ranked = sorted(result.normalized, key=lambda n: -abs(result.normalized[n]))
    curve = p0.faithfulness_curve(result, fractions=(0.0, 0.1, 0.3, 0.6))
    gap = result.clean_metric - result.corrupted_metric
    for _, kept, share in curve:
        plain = O.together(model, TOKENS, ranked[kept:], O.Corr("shift"), O.Metric("norm_ratio", layer=METRIC_LAYER),
                           named=O.named_of(ranked))
        assert close(result.corrupted_metric + share * gap, plain, result.clean_metric), (name, kept)


def test_the_search_base_with_fixed_nodes_equals_plain_hooks(family):
    """The circuit search's evaluations once its bulk drop is fixed in a patched base run (a third of the
    nodes, at every layer): the base plus random further nodes equals plain hooks patching all of them."""
    import random

    from p0circuit.patching.circuit_search import Noising
    from p0circuit.patching.job import PatchJob
    from p0circuit.patching.options import PatchOptions
    from p0circuit.patching.sites import named_positions, site_of

    name, _, model = family
    nodes = [Node.parse(n) for n in nodes_of(name, model)]
    job = PatchJob(model, TOKENS, PatchOptions(corruption=p0.Shift(filler=(O.FILLER,)), metric=p0.NormRatio(METRIC_LAYER)))
    live = [n for n in nodes if job.reaches(site_of(n, model).hook)]
    job.cache({site_of(n, model).read.name for n in live})
    noising = Noising(job, named_positions(nodes))
    rng = random.Random(name)
    fixed = rng.sample(live, len(live) // 3)
    noising.fix(fixed)
    om, names = O.Metric("norm_ratio", layer=METRIC_LAYER), [n.name for n in nodes]
    rest = [n for n in live if n not in fixed]
    for k in (0, 1, 3, len(rest) // 2):
        dropped = fixed + rng.sample(rest, k)
        plain = O.together(model, TOKENS, [n.name for n in dropped], O.Corr("shift"), om, O.named_of(names))
        assert close(noising(dropped), plain, job.clean_metric), (name, k)


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_faithful_circuit_and_its_edges_plain(family, direction):
    """The circuit search's shares equal plain hooks patching every dropped node together. A loose target
    makes its bulk drop take nodes at every layer: those stay fixed in a patched base run, and each later
    evaluation runs from its own group's first block, the bulk's nodes from there on patched again. Its
    three numbers (faithfulness, completeness, denoising: the circuit restored into the corrupted run)
    against plain hooks, on a screen made in either direction. Then the edge search's shares against
    ACDC's edge corruption written out with plain hooks."""
    name, _, model = family
    metric, corruption = p0.NormRatio(METRIC_LAYER), p0.Shift(filler=(O.FILLER,))
    nodes = nodes_of(name, model)
    result = p0.activation_patch(model, TOKENS, nodes=nodes, corruption=corruption, metric=metric, min_signal=0,
                                 direction=direction)
    circuit = p0.faithful_circuit(result, target=0.6, tolerance=0.4)
    found = circuit.search
    names = list(result.raw)
    om, corr = O.Metric("norm_ratio", layer=METRIC_LAYER), O.Corr("shift")
    gap = result.clean_metric - result.corrupted_metric
    rest = [n for n in names if n not in found.nodes]
    assert found.settings["bulk_dropped"] > 0, found
    # compared as metric values: a share divides float32 noise by the clean-to-corrupted change
    assert close(O.together(model, TOKENS, rest, corr, om, O.named_of(names)),
                 result.corrupted_metric + found.faithfulness * gap, result.clean_metric), (name, found)
    assert close(O.together(model, TOKENS, found.nodes, corr, om, O.named_of(names)),
                 result.clean_metric - found.completeness * gap, result.clean_metric), (name, found)
    assert close(O.together(model, TOKENS, found.nodes, corr, om, O.named_of(names), direction="denoise"),
                 result.corrupted_metric + found.denoising * gap, result.clean_metric), (name, found)
    if direction == "denoise":
        return  # the edge search runs on the noising job whatever the screen's direction: checked once
    edges = p0.faithful_edges(circuit, target=0.6, tolerance=0.4).edge_search
    held = edges.settings.get("held", [])  # a norm after the heads: their edges are held, never corrupted as edges
    assert all(e.startswith("A") for e in held) and (not held or name in POST_NORM_HEADS), (name, held)
    assert not set(held) & (set(edges.effects) | set(edges.edges))
    if edges.candidates:
        dropped = [e for e in edges.effects if e not in edges.edges]
        assert close(O.edges_together(model, TOKENS, rest, dropped, corr, om, O.named_of(names)),
                     result.corrupted_metric + edges.faithfulness * gap, result.clean_metric), (name, edges)
        assert close(O.edges_together(model, TOKENS, [], edges.edges, corr, om, O.named_of(names)),
                     result.clean_metric - edges.completeness * gap, result.clean_metric), (name, edges)


def test_activation_on_the_logits(family):
    """A metric on the logits: suffix forwards to the unembedding (final norm, Gemma 2's logit
    soft-capping, Phi's unembedding bias)."""
    name, _, model = family
    nodes = [n for n in nodes_of(name, model) if not n.startswith("PE")][::3]
    kw = dict(nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)), metric=p0.LogitMetric(logit_gap_tensor),
              min_signal=0)
    fast, slow = p0.activation_patch(model, TOKENS, **kw), p0.activation_patch(model, TOKENS, reference=True, **kw)
    plain = O.activation(model, TOKENS, nodes, O.Corr("shift"), O.Metric("logits", fn=logit_gap_tensor))
    for n in nodes:
        assert close(fast.raw[n], plain[n], plain[n]) and close(slow.raw[n], plain[n], plain[n]), (n, fast.raw[n], plain[n])


def logit_gap_tensor(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


def test_shortcuts_are_switched_off_where_they_are_not_exact(family):
    """skip_block (a head's change through the block's MLP) assumes ln2 before the MLP and no norm
    after it; the direct q/k/v edge op assumes q = ln1(resid) W + b. Where a family breaks that, the
    shortcut is off (and the exactness tests above pass through the general path)."""
    from p0circuit.patching.engine import skippable
    from p0circuit.patching.ops import PatchOp, direct_qkv

    name, _, model = family
    cfg = model.cfg
    op = PatchOp(p0.hooks.HookRef(0, p0.hooks.head_z(0)), (0,), torch.zeros(1, 1, cfg.d_head), head=0)
    post_norm = cfg.use_normalization_before_and_after or name in ("olmo2", "olmo3")
    assert skippable(model, [op], p0.NormRatio(2)) is (not post_norm)
    assert direct_qkv(model) is not (post_norm or cfg.use_qk_norm)  # (OLMoE's norm comes after hook_q: exact)


def test_attribution_equals_plain_gradient(family):
    name, _, model = family
    nodes = nodes_of(name, model)
    result = p0.attribution_patch(model, TOKENS, nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)),
                                  metric=p0.NormRatio(METRIC_LAYER), min_signal=0)
    plain = O.attribution(model, TOKENS, nodes, O.Corr("shift"), O.Metric("norm_ratio", layer=METRIC_LAYER))
    bad = [(n, result.raw[n], plain[n]) for n in nodes if not close(result.raw[n], plain[n], result.clean_metric)]
    assert not bad, f"{name}: {bad[:4]}"


def test_integrated_gradients_equal_plain_gradients(family):
    """The neuron screen's integrated gradients (each forward from the hook's own block, the blocks before it
    taken from the cached clean run) against plain autograd on whole forwards from the tokens."""
    name, _, model = family
    nodes = [n for n in nodes_of(name, model) if Node.parse(n).kind != Kind.EXPERT]
    result = p0.attribution_patch(model, TOKENS, nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)),
                                  metric=p0.NormRatio(METRIC_LAYER), min_signal=0, steps=2)
    plain = O.integrated(model, TOKENS, nodes, O.Corr("shift"), O.Metric("norm_ratio", layer=METRIC_LAYER), 2)
    bad = [(n, result.raw[n], plain[n]) for n in nodes if not close(result.raw[n], plain[n], result.clean_metric)]
    assert not bad, f"{name}: {bad[:4]}"


def test_every_family_has_a_tiny_checkpoint():
    from p0circuit.models.families import FAMILIES as LOADED

    classes = {type(c).__name__ for c in family_configs().values()}
    assert len(family_configs()) == len(LOADED) == 22, "one tiny checkpoint per family TransformerLens converts"
    assert len(classes) == 22


def test_the_docs_family_table_is_the_records():
    """docs/models.md's family table is written from the ``Family`` records, and every family there
    has a checkpoint in this suite."""
    import docblocks
    from p0circuit.models.families import FAMILIES, family_table

    assert len(family_configs()) >= len(FAMILIES)
    docblocks.check("docs/models.md", "families", family_table())
