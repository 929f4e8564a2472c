"""p0circuit's patching against a second oracle written on transformers' own modules (``tests/hf_oracle.py``).

``tests/oracle.py`` checks every number with plain TransformerLens hooks; this checks them once more
with plain PyTorch hooks on the ``AutoModelForCausalLM`` model transformers builds from the same tiny
random checkpoint, so TransformerLens' conversion and the meaning of its hook points are checked
too. For each family the oracle is written for: activation patching (every head and MLP at 0, some
at the other positions, neurons, the embeddings) and path patching (a sample of edges from heads,
MLPs, neurons and the embeddings into q, k, v, MLP inputs and the metric's block output), fast and
``reference=True``, under a shift and a token swap, noising and denoising, on the norm ratio and on
a residual dimension at P0; the edges again on a copy of each checkpoint with sharper attention
(:func:`sharpened`), where edges into queries and keys move the metric by more than the tolerance.
And the oracle is shown to catch a wrong write: a head read at the next head's columns, a key edge
written into the value (and back), a query edge into the next head's query.
"""

import logging

import pytest

from tiers import FAST
import torch

import hf_oracle as H
import oracle as O
import p0circuit as p0
from family_configs import make_checkpoint
from p0circuit.core.types import Node
from test_families import METRIC_LAYER, P0_DIM, TOKENS, sample
from tolerance import close, tolerance

FAMILIES = ["llama", "qwen2", "gemma3", "gpt2", "pythia", "olmo2", "olmoe"] + ([] if FAST else ["mixtral"])
"""The main families and one mixture of experts; the full suite adds the second (the fast tier's time budget)."""
MOE = {"mixtral", "olmoe"}
CASES = [("shift", "noise", None), ("swap", "noise", None), ("shift", "denoise", None), ("shift", "noise", P0_DIM)]
"""(corruption, direction, residual dimension read at P0 or None for the norm ratio)."""


SHARPEN = (".q_proj.", ".k_proj.", ".c_attn.", ".query_key_value.", ".q_norm.", ".k_norm.")
"""The parameters scaled by :func:`sharpened` (GPT-2's and GPT-NeoX's fused projections: their values too)."""


@pytest.fixture(scope="module", params=FAMILIES)
def name(request):
    logging.disable(logging.WARNING)
    return request.param


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf-oracle")


def loaded(path):
    """(p0circuit's model, transformers' model) of one checkpoint."""
    from transformers import AutoModelForCausalLM

    return p0.load_checkpoint(path), H.HF(AutoModelForCausalLM.from_pretrained(path, local_files_only=True))


@pytest.fixture(scope="module")
def family(name, root):
    """(name, p0circuit's model, transformers' model) of the family's tiny random checkpoint."""
    return (name, *loaded(make_checkpoint(name, root)))


def sharpened(name, root, factor=4.0):
    """The tiny checkpoint with every query and key scaled by ``factor`` (its projections, or the
    QK-norm's weights that come after them; Gemma's norms scale by ``1 + weight``): the random
    checkpoint's attention is nearly uniform (logits about 0.1), so an edge into a query moves the
    metric by less than the tolerance, and a query written to the wrong place would pass unseen."""
    from transformers import AutoModelForCausalLM

    out = root / f"{name}-sharp"
    if not out.exists():
        model = AutoModelForCausalLM.from_pretrained(make_checkpoint(name, root), local_files_only=True)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if any(s in key for s in SHARPEN):
                    gemma_norm = model.config.model_type.startswith("gemma") and "_norm." in key
                    p.copy_(factor * (1 + p) - 1 if gemma_norm else factor * p)
        model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def sharp(name, root):
    """(name, p0circuit's model, transformers' model) of the sharpened checkpoint."""
    return (name, *loaded(sharpened(name, root)))


def nodes_of(name, model):
    cfg = model.cfg
    nodes = [f"A{l}.H{h}@0" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    nodes += [f"M{l}@0" for l in range(cfg.n_layers)] + ["E@0", "A0.H1@rest", "A2.H3@rest", "M1@rest"]
    nodes += ["PE@0"] if name == "gpt2" else []
    return nodes + ([] if name in MOE else ["M0.N1@0", "M1.N7@0", "M1.N3@rest"])


def edges_of(name, model, metric):
    senders = ["E@0", "A0.H1@0", "M0@0", "A1.H2@0", "A0.H3@rest", "M1@rest"]
    senders += ["PE@0"] if name == "gpt2" else []
    senders += [] if name in MOE else ["M0.N2@0"]
    return sample([e.name for e in p0.candidate_edges(model, [Node.parse(s) for s in senders], metric=metric)])


def compare(model, hf, method, names, corruption="shift", direction="noise", dim=None, tokens=TOKENS):
    """p0circuit's ``method`` fast and reference, and the transformers oracle, on ``names``: (the names
    where either differs from the oracle, with the three values; the fast result). The metric reads
    block ``METRIC_LAYER``: the norm ratio, or with ``dim`` that residual dimension at P0."""
    metric = p0.NormRatio(METRIC_LAYER) if dim is None else p0.ResidDim(METRIC_LAYER, dim)
    corr = p0.Shift(filler=(O.FILLER,)) if corruption == "shift" else p0.Swap(token=O.FILLER)
    what = "nodes" if method == "activation" else "edges"
    kw = {what: names, "corruption": corr, "metric": metric, "min_signal": 0, "direction": direction}
    fn = getattr(p0, f"{method}_patch")
    fast, slow = fn(model, tokens, **kw), fn(model, tokens, reference=True, **kw)
    om = O.Metric("norm_ratio", layer=METRIC_LAYER) if dim is None else O.Metric("resid_dim", layer=METRIC_LAYER,
                                                                                   dim=dim)
    theirs = getattr(H, method)(hf, tokens, names, O.Corr(corruption), om, direction)
    scale = slow.clean_metric
    bad = [(n, fast.raw[n], slow.raw[n], theirs[n]) for n in names
           if not (close(fast.raw[n], theirs[n], scale) and close(slow.raw[n], theirs[n], scale))]
    return bad, fast


def test_what_is_not_written_here_is_refused(family):
    """An expert (one fused module in transformers), an ablation and a metric on TransformerLens' hooks
    raise: the oracle never answers with a number it does not compute."""
    name, _, hf = family
    om = O.Metric("norm_ratio", layer=METRIC_LAYER)
    with pytest.raises(NotImplementedError, match="ablation"):
        H.activation(hf, TOKENS, ["M0@0"], O.Corr("zero"), om)
    with pytest.raises(NotImplementedError, match="attn_to_p0"):
        H.activation(hf, TOKENS, ["M0@0"], O.Corr("shift"), O.Metric("attn_to_p0", heads=((1, 0),)))
    if name in MOE:
        with pytest.raises(NotImplementedError, match="expert"):
            H.activation(hf, TOKENS, ["M1.E0@0"], O.Corr("shift"), om)


def assert_same_logits(name, model, hf, tokens):
    """p0circuit's model and transformers' give the same logits: the two hold the same weights."""
    with torch.no_grad():
        theirs = H.forward(hf, tokens)
        diff, scale = (theirs - model(tokens)).abs().max().item(), theirs.abs().max().item()
    assert diff <= tolerance(scale=scale), f"{name}: max logit difference {diff} (logits up to {scale:.3g})"


def test_logits_equal_transformers(family):
    assert_same_logits(*family, TOKENS)


@pytest.mark.parametrize("corruption,direction,dim", CASES)
def test_activation_equals_transformers_hooks(family, corruption, direction, dim):
    name, model, hf = family
    if corruption == "swap" and (TOKENS[:, 0] == O.FILLER).any():
        pytest.skip("a prompt already starts with the filler")
    nodes = nodes_of(name, model)
    bad, fast = compare(model, hf, "activation", nodes, corruption, direction, dim)
    assert not bad, f"{name}: {len(bad)} of {len(nodes)} nodes differ (name, fast, reference, hf): {bad[:4]}"
    base = fast.clean_metric if direction == "noise" else fast.corrupted_metric
    assert max(abs(v - base) for v in fast.raw.values()) > 1e-4  # the patches change something


@pytest.mark.parametrize("corruption,direction,dim", CASES)
def test_path_equals_transformers_hooks(family, corruption, direction, dim):
    name, model, hf = family
    metric = p0.NormRatio(METRIC_LAYER) if dim is None else p0.ResidDim(METRIC_LAYER, dim)
    edges = edges_of(name, model, metric)
    assert {e.rsplit(".", 1)[1] for e in edges} == {"q", "k", "v", "mlp_in", "resid"}
    bad, _ = compare(model, hf, "path", edges, corruption, direction, dim)
    assert not bad, f"{name}: {len(bad)} of {len(edges)} edges differ (name, fast, reference, hf): {bad[:4]}"


@pytest.mark.parametrize("corruption", ["shift", "swap"])
def test_path_with_sharp_attention_equals_transformers_hooks(sharp, corruption):
    """The same edges on the sharpened checkpoint, where edges into queries and keys move the metric
    by more than the tolerance: their comparison means something."""
    name, model, hf = sharp
    assert_same_logits(name, model, hf, TOKENS)
    edges = edges_of(name, model, p0.NormRatio(METRIC_LAYER))
    bad, fast = compare(model, hf, "path", edges, corruption)
    assert not bad, f"{name}: {len(bad)} of {len(edges)} edges differ (name, fast, reference, hf): {bad[:4]}"
    for which in ("q", "k"):
        moved = max(abs(fast.raw[e] - fast.clean_metric) for e in edges if e.endswith(f".{which}"))
        assert moved > 2 * tolerance(scale=fast.clean_metric), (name, which, moved)


def test_the_oracle_catches_a_wrong_write(family, sharp, monkeypatch):
    """Head h written at head h+1's columns; a key edge's change written into the value input (and
    back); a query edge written into the next head's query: the oracle then disagrees with p0circuit."""
    name, model, hf = family
    n_heads = model.cfg.n_heads
    heads = [f"A{l}.H{h}@0" for l in range(model.cfg.n_layers) for h in range(n_heads)]
    head_cols = H.head_cols
    with monkeypatch.context() as m:
        m.setattr(H, "head_cols", lambda index, d_head: head_cols((index + 1) % n_heads, d_head))
        bad, _ = compare(model, hf, "activation", heads + ["M1@0"])
    assert len(bad) > len(heads) // 2 and "M1@0" not in {b[0] for b in bad}, (name, bad)

    def wrong(dst):
        node, which = dst.rsplit(".", 1)
        if which == "q":
            layer, head = node.split("@")[0][1:].split(".H")
            return f"A{layer}.H{(int(head) + 1) % n_heads}@{node.split('@')[1]}.q"
        return f"{node}.{ {'k': 'v', 'v': 'k'}.get(which, which) }"

    name, model, hf = sharp
    edges = [e for e in edges_of(name, model, None) if e.endswith((".q", ".k", ".v"))]
    receiver_hooks = H.receiver_hooks
    with monkeypatch.context() as m:
        m.setattr(H, "receiver_hooks", lambda hf, dst, at, delta: receiver_hooks(hf, wrong(dst), at, delta))
        bad, _ = compare(model, hf, "path", edges, "swap")
    kinds = {b[0].rsplit(".", 1)[1] for b in bad}
    assert kinds == {"q", "k", "v"} and len(bad) > len(edges) // 3, (name, bad)
