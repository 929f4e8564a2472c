"""The edges of a faithful node circuit, pruned in the manner of ACDC (Conmy et al., 2023).

A node circuit (:func:`~p0circuit.patching.circuit_search.faithful_circuit`) says which components
matter; its edges say which of the paths between them carry the behaviour. The candidates are every
edge from a circuit node into an input of another circuit node (a head's query, key or value input,
an MLP's input) and each circuit node's *direct* edge into what the metric reads (``M1@0->R1@0.resid``).

An edge set is judged as ACDC judges it: on the clean run, every candidate node outside the node
circuit is corrupted (as in the node search), and each candidate edge outside the set is corrupted
*as an edge*: its receiver's input gets ``input - (current sender output - corrupted sender output)``,
the sender's current output read during that same forward (so a sender changed upstream is accounted
for). The search (:func:`~p0circuit.patching.circuit_search.prune`) starts from every candidate edge
kept, drops the weakest single edges (by path patching, each alone) in bulk, then visits the rest
from the last receiver block back, dropping an edge when the faithfulness moves by at most
``tolerance`` and stays within ``1 - target`` of 1. What is kept is measured two ways, each a share
of the clean-to-corrupted change of the metric:

* ``faithfulness``: as above, with the dropped edges and the nodes outside the circuit corrupted;
* ``completeness``: the share that corrupting the kept edges alone removes (every node clean).

Denoising is measured on the node circuit (restoring an edge set into the corrupted run is not
defined here). Where a norm follows a sender (Gemma 2/3's post-attention norm, for a head; a neuron
before a post-MLP norm) a sender's output is not additive and the search is refused, with the reason.
"""

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Union

from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError
from p0circuit.core.types import Edge, Kind, Node
from p0circuit.patching.circuit_search import TARGET, TOLERANCE, FaithfulCircuit, _share, prune
from p0circuit.patching.corruptions import Corruption
from p0circuit.patching.edges import among, candidate_edges, receiver_site, sender_hook
from p0circuit.patching.faithfulness import edges_ablated, refuse_post_norm_senders
from p0circuit.patching.hooking import receiver_hooks
from p0circuit.patching.job import PatchJob
from p0circuit.patching.metrics import MetricSpec
from p0circuit.patching.methods import path_patch
from p0circuit.patching.ops import node_op
from p0circuit.patching.options import PatchOptions
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import named_positions, site_of


@dataclass
class EdgeCircuit:
    """What :func:`faithful_edges` found (``to_dict`` is its JSON record)."""

    edges: list[str]
    """The kept edges, strongest single effect first."""
    candidates: int
    """Edges searched: between the node circuit's nodes, and from each into what the metric reads."""
    faithfulness: float
    """Share of the change kept with the other candidate edges and every node outside the circuit corrupted."""
    completeness: float
    """Share of the change removed by corrupting the kept edges alone."""
    faithful: bool
    """``faithfulness`` reaches ``target``."""
    effects: dict[str, float] = field(default_factory=dict)
    """Every candidate edge's normalized effect alone (path patching)."""
    why: str = ""
    """What fell short, when not ``faithful``."""
    settings: dict[str, Any] = field(default_factory=dict)
    """target, tolerance, the node circuit's faithfulness in this forward, evaluations, how the search ran."""

    @property
    def size(self) -> int:
        return len(self.edges)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["size"] = self.size
        return out


@entry_point
def faithful_edges(
    model: HookedTransformer,
    tokens: Tensor,
    *,
    circuit: FaithfulCircuit,
    result: PatchResult,
    corruption: Union[str, Corruption],
    metric: Optional[MetricSpec],
    bos: Optional[bool] = None,
    target: float = TARGET,
    tolerance: float = TOLERANCE,
    max_candidates: Optional[int] = None,
) -> EdgeCircuit:
    """The edges of the node ``circuit`` found on the activation-patching ``result`` (both made with
    the same ``corruption``, ``metric`` and ``bos``), pruned as the module docstring says. With more
    than ``max_candidates`` candidate edges (each evaluation of the pruning is a whole forward up to the
    metric) nothing is searched and the record says so."""
    if max_candidates is not None and (isinstance(max_candidates, bool) or not isinstance(max_candidates, int)
                                       or max_candidates < 1):
        raise BadInputError(f"max_candidates must be None or an int >= 1, got {max_candidates!r}")
    if not isinstance(circuit, FaithfulCircuit):
        raise BadInputError(f"circuit must be what faithful_circuit returned, got {type(circuit).__name__}")
    if not isinstance(result, PatchResult) or result.level != "node" or not result.signal:
        raise BadInputError("faithful_edges needs the node-level PatchResult with a signal that the circuit was found on")
    missing = [n for n in circuit.nodes if n not in result.raw]
    if missing:
        raise BadInputError(f"the circuit's nodes {missing[:4]} are not candidates of this result: pass the result "
                            "the circuit was found on")
    job = PatchJob(model, tokens, PatchOptions(corruption=corruption, metric=metric, bos=bos))
    if job.prep.name != result.corruption or job.metric.name != result.metric:
        raise BadInputError(f"the result was computed with corruption {result.corruption!r} and metric "
                            f"{result.metric!r}; pass those (got {job.prep.name!r}, {job.metric.name!r})")
    items = [Node.parse(n) for n in result.raw]
    named = named_positions(items)
    inside = [Node.parse(n) for n in circuit.nodes]
    senders = sorted(n for n in inside if n.kind not in (Kind.EXPERT, Kind.KV_HEAD))
    cands = [e for e in among(model, candidate_edges(model, senders, metric=job.metric), inside)
             if job.reaches(receiver_site(e, model)[0])] if senders else []
    settings: dict[str, Any] = {"target": target, "tolerance": tolerance, "corruption": result.corruption,
                                "metric": result.metric}
    if not cands:
        return EdgeCircuit([], 0, circuit.faithfulness, 0.0, False, why="no edge between the circuit's nodes",
                           settings=settings)
    if max_candidates is not None and len(cands) > max_candidates:
        return EdgeCircuit([], len(cands), circuit.faithfulness, 0.0, False, settings=settings,
                           why=f"{len(cands)} candidate edges, more than max_candidates={max_candidates}: not searched")
    refuse_post_norm_senders(model, cands)  # before any forward
    single = path_patch(model, tokens, edges=cands, corruption=corruption, metric=metric, bos=bos, min_signal=0.0)
    effects = {e.name: float(single.normalized[e.name]) for e in cands}
    outside = [n for n in items if n not in set(inside) and job.reaches(site_of(n, model).hook)]
    job.cache({site_of(n, model).read.name for n in outside} | {sender_hook(e.src) for e in cands})
    ops = [node_op(job, n, "noise", named) for n in outside]
    clean, corrupted = result.clean_metric, result.corrupted_metric
    evaluations = 0

    def share(dropped: list[Edge], node_ops: Any = ops) -> float:
        nonlocal evaluations
        evaluations += 1
        return _share(edges_ablated(job, dropped, named, node_ops), clean, corrupted)

    strength = {e: abs(effects[e.name]) if math.isfinite(effects[e.name]) else 0.0 for e in cands}
    with receiver_hooks(model, split_qkv=True):
        nodes_only = share([])
        kept, faithfulness, bulk = prune(cands, strength.__getitem__, lambda e: e.dst.layer, share, target, tolerance)
        completeness = 1.0 - share(kept, ())
    kept = sorted(kept, key=lambda e: -strength[e])
    settings.update(nodes_only_faithfulness=nodes_only, evaluations=evaluations, bulk_dropped=bulk,
                    search=f"edges between the circuit's {len(inside)} nodes and into the metric; the {bulk} weakest "
                           "(path patching, each alone) dropped at once, then ACDC-style pruning of the rest, last "
                           "receiver block first")
    short = "" if faithfulness >= target else f"faithfulness {faithfulness:.3f} < {target}"
    return EdgeCircuit(edges=[e.name for e in kept], candidates=len(cands), faithfulness=faithfulness,
                       completeness=completeness, faithful=not short, effects=effects, why=short, settings=settings)
