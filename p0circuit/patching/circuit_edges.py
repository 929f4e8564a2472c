"""The edges of a faithful node circuit, pruned in the manner of ACDC (Conmy et al., 2023).

A node circuit (:func:`~p0circuit.patching.circuit_search.faithful_circuit`) says which components
matter; its edges say which of the paths between them carry the behaviour. The candidates are every
edge from a circuit node into an input of another circuit node (a head's query, key or value input,
an MLP's input) and each circuit node's *direct* edge into what the metric reads (``M1@0->R1@0.resid``).

An edge set is judged as ACDC judges it: on the clean run, every candidate node outside the node
circuit is corrupted (as in the node search), and each candidate edge outside the set is corrupted
*as an edge*: its receiver's input gets ``input - (current sender output - corrupted sender output)``,
the sender's current output read during that same forward (so a sender changed upstream is accounted
for). The search (:func:`~p0circuit.patching.circuit_search.acdc_prune`) starts from every candidate edge
kept, drops the weakest single edges (by path patching, each alone) in bulk, then visits the rest
from the last receiver block back, dropping an edge when the faithfulness moves by at most
``tolerance`` and stays within ``1 - target`` of 1. What is kept is measured two ways, each a share
of the clean-to-corrupted change of the metric:

* ``faithfulness``: as above, with the dropped edges and the nodes outside the circuit corrupted;
* ``completeness``: the share that corrupting the kept edges alone removes (every node clean).

Denoising is measured on the node circuit (restoring an edge set into the corrupted run is not
defined here). Where a norm follows a sender (Gemma 2/3's post-attention norm, for a head; a neuron
before a post-MLP norm) the sender's output is not additive: its edges are held as they are (never
corrupted as edges) and listed in ``settings["held"]`` with the reason, as are circuit nodes that send
no edge of their own (experts).
"""

import math
from typing import Any, Optional

from p0circuit.core.args import entry_point
from p0circuit.core.circuits import searched_circuit
from p0circuit.core.errors import BadInputError
from p0circuit.core.searches import EdgeSearch  # noqa: F401 (its record, re-exported here)
from p0circuit.core.types import Circuit, Edge, Input, Kind, Node
from p0circuit.patching.circuit_search import (
    TARGET, TOLERANCE, _share, acdc_prune, check_bounds, same_clean, search_job, searched,
)
from p0circuit.patching.edges import among, candidate_edges, post_norm, receiver_site, sender_hook
from p0circuit.patching.faithfulness import EdgeBase, edges_ablated
from p0circuit.patching.hooking import receiver_hooks
from p0circuit.patching.job import PatchJob
from p0circuit.patching.methods import path_patch
from p0circuit.patching.ops import node_op
from p0circuit.patching.setup import Setup
from p0circuit.patching.result import finite
from p0circuit.patching.sites import named_positions, site_of


def _candidates(model: Any, job: PatchJob, senders: list[Node], inside: list[Node], positions: set[Any]) -> list[Edge]:
    """The candidate edges: from a circuit node into an input of another (:func:`~p0circuit.patching.edges.among`),
    or into what the metric reads (a block's output, :meth:`~p0circuit.PatchMetric.residual_reads`; the query and
    key inputs of the heads whose attention it reads, :meth:`~p0circuit.PatchMetric.attention_reads`, at every
    position class); a circuit head's key and value inputs count at every position class (a head's output at the
    other positions reads P0's key and value), and only receivers that can change the metric."""
    everything = candidate_edges(model, senders, metric=job.metric)
    heads = [Node(Kind.HEAD, n.layer, n.head, p) for n in inside if n.kind == Kind.HEAD for p in positions]
    read = [Node(Kind.HEAD, l, h, p) for l, h in job.metric.attention_reads(model.cfg.n_layers, model.cfg.n_heads)
            for p in positions]
    narrow = set(among(model, everything, inside))
    wide = set(among(model, everything, list(dict.fromkeys(inside + heads))))
    metric_inputs = set(among(model, everything, read)) if read else set()
    return [e for e in everything if (e in narrow or (e in wide and e.input in (Input.K, Input.V))
                                      or (e in metric_inputs and e.input in (Input.Q, Input.K)))
            and job.reaches(receiver_site(e, model)[0])]


def _members(circuit: Circuit, result: Any, model: Any) -> list[Node]:
    """The circuit's searched nodes (``circuit.search.nodes``), each a node of the model (:func:`site_of` names what
    is wrong) and a candidate of the result it was found on: a search record changed by hand is refused before any
    work, naming the node."""
    out = []
    for name in circuit.search.nodes:
        try:
            node = Node.parse(name)
            site_of(node, model)
        except BadInputError as err:
            raise BadInputError(f"faithful_edges: circuit.search.nodes holds {name!r}: {err}; pass the circuit "
                                "faithful_circuit returned for this model") from None
        if name not in result.raw:
            raise BadInputError(f"faithful_edges: circuit.search.nodes holds {name!r}, which the result it was found on "
                                "did not patch: pass the circuit faithful_circuit returned, unchanged")
        out.append(node)
    return out


@entry_point
def faithful_edges(
    circuit: Circuit,
    *,
    setup: Optional[Setup] = None,
    target: float = TARGET,
    tolerance: float = TOLERANCE,
    max_candidates: Optional[int] = None,
) -> Circuit:
    """The edges of the node ``circuit`` (what :func:`~p0circuit.patching.circuit_search.faithful_circuit`
    returned: it carries its search and the result it was found on, and that result's setup), pruned as the module
    docstring says: the same :class:`Circuit` with these edges, ``circuit.edge_search`` (the typed
    :class:`EdgeSearch`) beside its node search. With more than ``max_candidates`` candidate edges (each evaluation
    of the pruning is a whole forward up to the metric) nothing is searched and the record says so. ``setup``: only
    to assert which one.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> found = p0.faithful_circuit(p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1"))
        >>> p0.faithful_edges(found).edge_search.edges   # kept, strongest first
        ['A0.H0@0->M0@0.mlp_in', 'M0@0->M1@0.mlp_in', 'M1@0->R1@0.resid']
    """
    if max_candidates is not None and (isinstance(max_candidates, bool) or not isinstance(max_candidates, int)
                                       or max_candidates < 1):
        raise BadInputError(f"max_candidates must be None or an int >= 1, got {max_candidates!r}")
    check_bounds(target, tolerance)
    if not isinstance(circuit, Circuit):
        raise BadInputError(f"circuit must be the Circuit faithful_circuit returned, got {type(circuit).__name__}")
    result = circuit.result
    if result is None or circuit.search is None:
        raise BadInputError("this circuit carries no node search and result (made by hand, pruned, or read back from "
                            "a file): find it with faithful_circuit(result) first, and pass that Circuit unchanged")
    searched_nodes, ends = set(circuit.search.nodes), {n.name for e in circuit.edges for n in (e.src, e.dst)}
    if not searched_nodes <= circuit.node_names or not circuit.node_names - searched_nodes <= ends:
        raise BadInputError(f"this circuit's nodes ({', '.join(sorted(circuit.node_names))[:120]}) are not the ones its "
                            f"search found ({', '.join(circuit.search.nodes)[:120]}): it was changed after "
                            "faithful_circuit (dataclasses.replace?); pass the Circuit faithful_circuit returned, unchanged")
    setup = searched(result, setup, "faithful_edges")
    model, tokens = setup.model, setup.tokens
    inside = _members(circuit, result, model)
    job = search_job(setup)
    items = [Node.parse(n) for n in result.raw]
    named = named_positions(items)
    settings: dict[str, Any] = {"target": target, "tolerance": tolerance, "corruption": result.corruption,
                                "metric": result.metric, "setup": setup.describe(), "held": {}}
    held: dict[str, str] = settings["held"]
    for n in inside:  # nodes that send no edge of their own: said, not dropped silently
        if n.kind == Kind.EXPERT:
            held[n.name] = "an expert is not an edge sender (its MLP as a whole is): its edges stay as they are"
        elif n.kind == Kind.RESID:
            held[n.name] = "a residual-stream node is not an edge sender"
    senders = sorted(n for n in inside if n.kind not in (Kind.EXPERT, Kind.KV_HEAD, Kind.RESID))
    cands = _candidates(model, job, senders, inside, {n.pos for n in items}) if senders else []
    for e in cands:  # a norm after the sender (Gemma 2/3's heads): its output is not additive; held, never corrupted
        if post_norm(model, e.src) is not None:
            held[e.name] = "a norm follows the sender, so its output is not additive: held as it is, never corrupted"
    cands = [e for e in cands if e.name not in held]
    if not cands or (max_candidates is not None and len(cands) > max_candidates):
        why = (f"{len(cands)} candidate edges, more than max_candidates={max_candidates} (an analysis' --max-edges): not "
               "searched" if cands else
               "no edge between the circuit's nodes can be corrupted as an edge" if held else
               "no edge between the circuit's nodes")
        return _with_edges(circuit, EdgeSearch(edges=[], candidates=len(cands), faithfulness=None, completeness=None,
                                               faithful=False, why=why, searched=False, settings=settings))
    single = path_patch(model, tokens, edges=cands, corruption=setup.prep.corruption, metric=setup.metric,
                        bos=setup.options.bos, min_signal=0.0)
    effects = {e.name: float(single.normalized[e.name]) for e in cands}
    outside = [n for n in items if n not in set(inside) and job.reaches(site_of(n, model).hook)]
    job.cache({site_of(n, model).read.name for n in outside} | {sender_hook(e.src) for e in cands})
    same_clean(job, result)
    ops = [node_op(job, n, "noise", named) for n in outside]
    clean, corrupted = result.clean_metric, result.corrupted_metric
    evaluations = 0

    senders = {sender_hook(e.src) for e in cands}
    base: Optional[EdgeBase] = None  # the nodes outside the circuit corrupted, and after the bulk drop its edges too

    def fix(dropped: list[Edge]) -> None:
        nonlocal base  # in the candidates' order, as a whole forward subtracts them (an edge's sum depends on it)
        base = EdgeBase(job, [e for e in cands if e in set(dropped)], named, ops, senders)

    def share(dropped: list[Edge], node_ops: Any = ops) -> float:
        nonlocal evaluations
        evaluations += 1
        value = finite(edges_ablated(job, dropped, named, node_ops, base=base), setup,
                       f"corrupting {len(dropped)} of {len(cands)} candidate edges together (faithful_edges' evaluation "
                       f"{evaluations})")
        return _share(value, clean, corrupted)

    strength = {e: abs(effects[e.name]) if math.isfinite(effects[e.name]) else 0.0 for e in cands}
    with receiver_hooks(model, split_qkv=True):
        fix([])
        nodes_only = share([])
        kept, faithfulness, bulk = acdc_prune(cands, strength.__getitem__, lambda e: e.dst.layer, share, target, tolerance,
                                              on_bulk=fix)
        completeness = 1.0 - share(kept, ())
    kept = sorted(kept, key=lambda e: -strength[e])
    settings.update(nodes_only_faithfulness=nodes_only, evaluations=evaluations, bulk_dropped=bulk,
                    search=f"edges between the circuit's {len(inside)} nodes and into the metric; the {bulk} weakest "
                           "(path patching, each alone) dropped at once, then ACDC-style pruning of the rest, last "
                           "receiver block first")
    short = "" if faithfulness >= target else f"faithfulness {faithfulness:.3f} < {target}"
    return _with_edges(circuit, EdgeSearch(edges=[e.name for e in kept], candidates=len(cands), faithfulness=faithfulness,
                                           completeness=completeness, faithful=not short,
                                           effects=effects, why=short, settings=settings))


def _with_edges(circuit: Circuit, edges: EdgeSearch) -> Circuit:
    """The node ``circuit`` with the edges of ``edges`` (and those held as they are), its searches attached."""
    return searched_circuit(circuit.search.to_dict(), edges.to_dict(), circuit.result.normalized,
                            search=circuit.search, edge_search=edges, result=circuit.result)
