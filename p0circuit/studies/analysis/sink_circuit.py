"""The sink's own circuit: what makes the later heads attend to position 0, beside what makes its norm.

An onset's circuit (:mod:`.steps`) explains position 0's *norm ratio* after the onset. That is not the sink:
the sink is the attention later heads give position 0, and a pre-norm model's keys read the state's direction,
not its size (:mod:`p0circuit.studies.experiments.reads`). :func:`sink_circuit` searches the circuit of the sink
itself, with the same corruption: the metric is the attention to P0 of the *sink heads* (alpha_0 above ``eps``) of
the first block after the onset that holds one, the first to read its state
(:func:`~p0circuit.studies.experiments.reads.first_readers`; :class:`~p0circuit.AttnToP0`), the candidates every head
and MLP output (at P0 and at the rest) up to that block, the search the same ACDC-style pruning, and the edges include those
into the sink heads' queries and keys (what the metric reads). Sink_0^eps of those blocks (:class:`~p0circuit.SinkRate`)
is read on the clean run, the corrupted run and the run with only the circuit clean. The record says which of the
norm circuit's nodes the sink circuit shares and which it does not.

The circuit is judged on faithfulness (every other candidate corrupted, it keeps the target share of the change)
and completeness; denoising is measured and recorded but not required. Under ``shift`` the corrupted run's own
first token (a filler) is a sink state too, so a circuit restored at the clean first token's positions competes
with it for the sink heads' attention and restores about half of it at most, whatever the circuit: that says
nothing about the circuit, only about the corruption.
"""

from typing import Optional, Sequence

import torch

from p0circuit.core.defaults import SINK_EPS
from p0circuit.studies.findings import SinkRates, SinkCircuit
from p0circuit.core.shares import share
from p0circuit.core.types import Input, Kind, Node
from p0circuit.patching import AttnToP0, SinkRate, candidate_edges, path_patch
from p0circuit.patching.circuit_search import Noising, search_job
from p0circuit.patching.edges import among
from p0circuit.patching.setup import Setup
from p0circuit.patching.ops import node_op
from p0circuit.patching.sites import named_positions, site_of
from p0circuit.studies.analysis import steps


def _rates(setup: Setup, blocks: list[int], eps: float, candidates: list[str], kept: Optional[list[str]]) -> SinkRates:
    """Sink_0^eps of ``blocks`` on the clean and corrupted runs of ``setup``, and with only ``kept`` of ``candidates``
    clean."""
    model = setup.model
    job = search_job(setup.measuring(SinkRate(blocks, eps)))
    nodes = [Node.parse(n) for n in candidates]
    live = [n for n in nodes if job.reaches(site_of(n, model).hook)]
    job.cache({site_of(n, model).read.name for n in live})
    named = named_positions(nodes)
    with torch.no_grad():
        corrupted = job.corrupted_metric([node_op(job, n, "noise", named) for n in live])
        circuit = None
        if kept is not None:
            circuit = Noising(job, named)([n for n in live if n.name not in set(kept)])
    return SinkRates(clean=job.clean_metric, corrupted=corrupted, circuit=circuit)


def _into_keys(setup: Setup, heads: list[tuple[int, int]], nodes: Sequence[str],
               threshold: float) -> tuple[dict[str, float], int]:
    """Each edge from a circuit node at P0 into a sink head's key at P0 (its key/value head's, under grouped-query
    attention), path patched alone with the sink heads' attention to P0 as the metric: those at ``threshold`` or
    above (edge -> normalized effect), and how many there were."""
    senders = [n for n in (Node.parse(x) for x in nodes) if n.pos == 0 and n.kind not in (Kind.EXPERT, Kind.KV_HEAD,
                                                                                         Kind.RESID)]
    if not senders:
        return {}, 0
    blocks = {l for l, _ in heads}
    model = setup.model
    receivers = [Node(Kind.HEAD, l, h, 0) for l, h in heads]
    cands = [e for e in among(model, candidate_edges(model, senders, qkv=("k",), receiver_layers=max(blocks) + 1),
                              receivers) if e.dst.layer in blocks and e.input == Input.K]
    if not cands:
        return {}, 0
    res = path_patch(setup=setup.measuring(AttnToP0(heads=heads)), edges=cands, min_signal=0.0)
    return steps.strong(res, threshold), len(cands)


def sink_circuit(setup: Setup, layer: int, heads: list[tuple[int, int]], norm_nodes: Sequence[str], *,
                 threshold: float, exact_nodes: int, seed: int, max_edges: Optional[int],
                 eps: float = SINK_EPS) -> SinkCircuit:
    """The circuit of the attention ``heads`` (the sink heads after the onset at block ``layer``) give P0, found on
    ``setup``'s prompts with its corruption as the module docstring says; ``norm_nodes``: the onset's norm circuit,
    compared with it."""
    blocks = sorted({l for l, _ in heads})
    # screened, the norm circuit's nodes are patched exactly whatever attribution says: attribution at P0's massive
    # state can rank the node that matters most far down (SmolLM2 with BOS, block 12: A2.H2@0, +0.69, missed without)
    res, found = steps.nodes(setup.measuring(AttnToP0(heads=heads)), max(blocks), threshold, exact_nodes, seed,
                             include=norm_nodes, included="the norm circuit's nodes")
    circuit = steps.circuit(res, max_edges, require_denoising=False)  # the corrupted run's own sink: module docstring
    nodes = circuit.get("nodes") or []
    rates = _rates(setup, blocks, eps, list(res.raw), nodes if "nodes" in circuit else None)
    targets = {f"A{l}.H{h}" for l, h in heads}
    into_keys, into_candidates = _into_keys(setup, heads, nodes, threshold)
    norm = set(norm_nodes)
    shared = [n for n in nodes if n in norm]
    only_sink = [n for n in nodes if n not in norm]
    only_norm = [n for n in norm_nodes if n not in set(nodes)]
    heads_said = ", ".join(sorted(targets, key=lambda x: (int(x[1:].split('.')[0]), x))[:6]) + \
        ("..." if len(targets) > 6 else "")
    if "nodes" not in circuit:
        evidence = f"the attention to P0 of the sink heads of blocks {blocks[0]}-{blocks[-1]} ({heads_said}): " + \
            circuit.get("note", "not measured")
    else:
        evidence = (f"the attention to P0 of the sink heads of blocks {blocks[0]}-{blocks[-1]} ({heads_said}; "
                    f"{res.clean_metric:.3g} clean -> {res.corrupted_metric:.3g} under {res.corruption}) is "
                    + ("kept" if circuit["faithful"] else "not faithfully kept") + f" by {circuit['size']} nodes "
                    f"(faithfulness {share(circuit['faithfulness'])}"
                    + ("" if circuit["denoising"] is None else f", denoising {share(circuit['denoising'])}")
                    + f"); Sink_0^{eps:g} of those blocks {rates.clean:.2f} clean, {rates.corrupted:.2f} corrupted, "
                    f"{'n/a' if rates.circuit is None else format(rates.circuit, '.2f')} with only the circuit clean; "
                    f"shared with the norm circuit: {', '.join(shared) or 'none'}; only here: "
                    f"{', '.join(only_sink) or 'none'}; only in the norm circuit: {', '.join(only_norm) or 'none'}; "
                    f"edges into the sink heads' keys (each alone, of {into_candidates}): "
                    + (", ".join(f"{e} {v:+.2f}" for e, v in list(into_keys.items())[:6]) or "none at the threshold"))
    return SinkCircuit(heads=sorted(targets), blocks=blocks, node_pass=found, circuit=circuit, sink_rate=rates,
                       shared=shared, only_sink=only_sink, only_norm=only_norm, into_keys=into_keys,
                       into_candidates=into_candidates, evidence=evidence)
