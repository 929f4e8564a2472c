"""What each step of an analysis costs, in forwards of its prompt batch, before it runs: the progress
bar's units (so its estimate of the time left weighs a block-11 node pass as the many forwards it is,
not as one step) and the cost model of docs/performance.md.

A step's work is counted in *block passes*: one transformer block over the whole batch. One block pass
costs :func:`block_cost` forwards (a forward runs every block and the unembedding). With ``N`` layers,
an onset at block ``L`` (its metric reads block ``L``'s output, so nothing after it runs), ``H`` heads
and ``C`` candidate nodes, a patch of a node in block ``l`` runs blocks ``l..L`` again:

* sinks: one forward with every attention pattern cached: ``SINK`` forwards;
* the position/token/context test of each onset: ``KEYED`` runs of ``L + 1`` block passes;
* nodes: the clean and corrupted runs (``2 (L + 1)`` block passes), each candidate's patched run
  (``sum over candidates of (L + 1 - l)``, times ``NODE``; a screen instead: a forward and backward,
  ``GRAD (L + 1)``, and its exact nodes at half depth), the top-k curve (``CURVE`` runs of ``L + 1``) and
  the circuit search (``2 log2 C + SEARCH_BASE`` runs of ``L + 1``, times ``SEARCH``), and where the
  circuit's edges are likely searched (``C`` at most ``max_edges``) ``EDGE_SEARCH`` runs of ``L + 1`` more;
* edges, where the node step did not search the circuit's edges (more candidates than ``max_edges``): ``EDGES`` runs
  of ``L + 3``; otherwise nothing (the step reads what the search found);
* neurons: integrated gradients, ``ig_steps`` forwards and backwards per MLP from its block on (the
  last four MLPs up to the onset), and ``neurons_keep`` exact patches;
* each other corruption: a node pass; each other length: the sinks and a node pass, scaled by length.

The factors are calibrated on SmolLM2-135M (8 English prompts x 24 tokens, 2 CPU cores); the model is
checked against Gemma 3 270M and a 1.24B Llama-shaped checkpoint in ``benchmarks/bench_1b.py``, and its
error there is in docs/performance.md. It is an estimate: the circuit search stops when it stops.
"""

import math
from typing import Any, Sequence

from p0circuit.patching.work import forward_work, shares
from p0circuit.studies.analysis.steps import screened as is_screened  # the rule, defined once
from p0circuit.studies.experiments.first_tokens import ROUND
from p0circuit.studies.experiments.reads import READ_BLOCKS as WINDOW  # the sink circuit's blocks (from the first reader)
from p0circuit.patching.shape import BlockShape

SINK = 1.5
"""Forwards of the sink report (a forward that keeps every attention pattern)."""
NODE = 0.85
"""Block passes per block a patched node's run repeats (a head's patch needs only the rest of its block)."""
CURVE = 10
"""Runs of the top-k faithfulness curve (7 circuit sizes, each from block 0, and its caches)."""
SEARCH_BASE, SEARCH = 40, 1.0
"""The node circuit search: about ``2 log2(candidates) + SEARCH_BASE`` evaluations, each ``SEARCH`` of a
run up to the onset (the bulk drop's later evaluations start past block 0)."""
EDGE_SEARCH = 45
"""Runs up to the onset of an edge search (each edge alone, then ACDC's pruning; a run that splits every
head's output costs more than a plain one), counted when the onset has at most ``max_edges`` candidate
nodes: a larger onset's circuit has had more candidate edges than that, and its edges are not searched. SmolLM2's
block-2 edge searches took 41 and 42 evaluations (2026-12-05; the constant was 110, from an earlier calibration).
The sink's own circuit spans the onset and the blocks that read it, and its candidate edges outnumbered
``max_edges`` in both of SmolLM2's settings (130, 228): its edge search is not counted."""
EDGES = 20
"""Runs of the path patching into the next blocks' sink heads (and between the strongest nodes)."""
GRAD = 4
"""Block passes of a forward and backward through one block (with its hooks)."""
KEYED = 5
"""Runs up to the onset of the position/token/context test (:func:`~p0circuit.studies.experiments.keyed.keyed_on`)."""
READS = 6
"""Forwards of the edits of the P0 state (:func:`~p0circuit.studies.experiments.reads.sink_reads`): the clean run, whole,
and five edits, each of the blocks after the onset only."""
WEIGHTS = 7
"""Whole forwards of the super-weight step (the model as it is, each weight zeroed alone, the strongest together)."""
ONSET_STEPS = ("keyed", "nodes", "edges", "neurons", "reads", "detection", "sink", "weights")
"""The steps of one onset, each keyed under the onset (``without_bos/P0@L2/reads``)."""


def block_cost(model: Any) -> float:
    """Forwards per block pass: a block's share of a forward's multiply-adds (the rest is the
    unembedding), from the model's shapes (:func:`~p0circuit.patching.work.shares`)."""
    s = shares(model)
    return (s["attn"] + s["mlp"]) / forward_work(model, 1)


def nodes_cost(model: Any, layer: int, candidates: int, exact_nodes: int, screened: int) -> float:
    """Forwards of an onset's node pass (without its curve and circuit search); ``screened``: the nodes a
    screen patches exactly (its top and its sample)."""
    b, depth = block_cost(model), layer + 1
    if is_screened(candidates, exact_nodes):
        patched = screened * depth / 2
        return b * (2 * depth + GRAD * depth + NODE * patched)
    per_layer = candidates / depth  # every block holds the same candidates
    return b * (2 * depth + NODE * per_layer * depth * (depth + 1) / 2)


def step_costs(model: Any, layer: int, candidates: int, settings: Any, screened: int, n_corruptions: int,
               first: bool, p0: bool = True, varied: int = 0) -> dict[str, float]:
    """Forwards of each step of one onset (``keyed``, ``nodes``, ``edges``, ``neurons``; at a P0 onset (``p0``) also
    ``reads``, ``detection``, ``sink``, ``weights``), and, for the first P0 onset (``first``), of its variations
    (``corruptions``, ``length<n>``); ``screened``: as :func:`nodes_cost`, ``varied`` the same for a variation's pass
    (0: as ``screened``)."""
    b, depth = block_cost(model), layer + 1
    parts = node_parts(model, layer, candidates, settings, screened)
    mlps = range(max(0, layer - 3), layer + 1)
    neurons = sum(GRAD * settings.ig_steps * (layer + 1 - m) for m in mlps) + settings.neurons_keep * depth / 2
    n = model.cfg.n_layers
    searched = candidates <= settings.max_edges  # the node step searches the circuit's edges: the edge step reads them
    out = {"keyed": b * KEYED * depth, "nodes": sum(parts.values()),
           "edges": 0.0 if searched else b * EDGES * min(depth + 2, n),
           "neurons": 0.0 if BlockShape.of(model).attn_only else b * neurons}
    if p0:  # a P0 onset: what the sink reads, detection, the sink's circuit, the super weights
        last = min(layer + WINDOW, n - 1)  # the first block after the onset that holds a sink head, usually the next
        sink_nodes = candidates * (last + 1) / depth
        s = shares(model)  # a patched forward ends at the sink heads' attention: their block's MLP is not run
        ended = (last + s["attn"] / (s["attn"] + s["mlp"])) / (last + 1) if s["attn"] + s["mlp"] else 1.0
        out.update(reads=b * (n + (READS - 1) * (n - depth)), detection=b * (depth + 1) * depth,
                   sink=ended * sum(node_parts(model, last, int(sink_nodes), settings, screened, edges=False).values()),
                   weights=0.0 if BlockShape.of(model).attn_only else b * WEIGHTS * n)
    if first:
        varied_node = nodes_cost(model, layer, candidates, settings.exact_nodes, varied or screened)
        out["corruptions"] = n_corruptions * varied_node
        for n in settings.lengths:
            out[f"length{n}"] = (SINK + varied_node) * n / settings.length
    return out


SPREAD_RUNS = KEYED + 2 + 1 + 1
"""Runs up to the onset, per batch of the spread's prompts (:mod:`.spread`): the keyed test, one clean and one
corrupted run (the P0 state read on the clean one) shared by the faithfulness and the strongest neuron's share, and
the run of each with its nodes corrupted or patched."""


def spread(model: Any, layer: int, settings: Any, scan: Sequence[int]) -> float:
    """Forwards of the spread over ``settings.spread_prompts`` prompts at the onset at ``layer``, and of the length scan
    at the prompt lengths ``scan`` (:func:`~.spread.scan_lengths`; empty: no scan): every block of the longest length (the
    shorter are its prefixes), on half the analysis' prompts."""
    from p0circuit.studies.analysis.spread import scan_lengths, scan_prompts  # (spread imports torch; this module need not)
    scan = scan_lengths(model.cfg.n_ctx, scan)  # (checked: whole numbers, within the context)
    b, batch = block_cost(model), settings.n_prompts * settings.length
    few = scan_prompts(settings.n_prompts)
    return (b * SPREAD_RUNS * (layer + 1) * settings.spread_prompts / settings.n_prompts
            + b * model.cfg.n_layers * few * max(scan, default=0) / batch)  # one forward of the longest prompts


def special(model: Any, tokens: int) -> float:
    """Forwards of the special-token step: one whole forward of the batch per token tested."""
    return float(tokens)


def first_tokens(model: Any, layer: int, settings: Any, most: int) -> float:
    """Forwards of the first-token map at ``layer`` of ``most`` vocabulary ids (0: every one), each once, up to the
    onset, in units of the batch's tokens; a sampled map with a margin (``settings.first_tokens_margin``) is predicted
    at one round (:data:`~p0circuit.studies.experiments.first_tokens.ROUND`), where a share near 0 or 1 stops it."""
    tokens = min(model.cfg.d_vocab, most or model.cfg.d_vocab)
    if tokens < model.cfg.d_vocab and settings.first_tokens_margin:
        tokens = min(tokens, ROUND)
    return block_cost(model) * (layer + 1) * tokens / (settings.n_prompts * settings.length)


def node_parts(model: Any, layer: int, candidates: int, settings: Any, screened: int,
               edges: bool = True) -> dict[str, float]:
    """The node step's forwards in the order they run: its patching ``pass`` (:func:`nodes_cost`), the
    faithfulness ``curve`` and the circuit ``search`` (the progress bar credits each as it ends); ``edges``: whether
    an edge search may follow (:data:`EDGE_SEARCH`)."""
    b, depth = block_cost(model), layer + 1
    searched = edges and candidates <= settings.max_edges
    search = (2 * math.log2(candidates + 1) + SEARCH_BASE) * SEARCH + (EDGE_SEARCH if searched else 0)
    return {"pass": nodes_cost(model, layer, candidates, settings.exact_nodes, screened), "curve": b * depth * CURVE,
            "search": b * depth * search}


SLOW, SLOW_SECONDS = 2.0, 30.0
"""Seconds per counted forward, over the unit forward's, above which an analysis whose steps took more than
``SLOW_SECONDS`` says it ran slower than its own forward predicts (a tiny model's steps are mostly Python's overhead:
not worth a warning)."""
