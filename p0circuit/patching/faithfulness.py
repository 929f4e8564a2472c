"""Faithfulness curves (as in the MIB benchmark): how much of the clean-vs-corrupted metric gap a
circuit made of the top x% of nodes or edges keeps when everything else is corrupted.

For a fraction x, the top ``ceil(x * n)`` candidates by |effect| are kept and every other
candidate is corrupted at once on the clean run; faithfulness is
``(M_kept - M_corrupted) / (M_clean - M_corrupted)``. Edges are corrupted as edges: the
receiver's input gets ``input - (current sender output - corrupted sender output)``, computed
during the forward pass, so senders changed upstream are accounted for.
"""

import math
from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.patching.circuit_search import same_clean, search_job, searched
from p0circuit.patching.edges import post_norm, receiver_site, sender_hook, sender_output
from p0circuit.patching.engine import PatchOp, ReadAll, apply_ops, ended_at_last_read, run_groups, stop_layer
from p0circuit.patching.hooking import receiver_hooks
from p0circuit.patching.job import PatchJob
from p0circuit.patching.setup import Setup
from p0circuit.patching.metrics import RunView
from p0circuit.patching.ops import node_op, sender_delta
from p0circuit.patching.result import PatchResult, finite
from p0circuit.patching.sites import named_positions, site_of
from p0circuit.core.types import Edge, Node

DEFAULT_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _ranked(result: PatchResult) -> list[str]:
    """Every name, strongest first (:meth:`PatchResult.strengths`: an unexamined one is still corrupted
    outside the kept top)."""
    eff = result.strengths()
    if not eff:
        raise BadInputError("this result has no signal: a faithfulness curve needs effects to rank")
    return sorted(eff, key=lambda k: -eff[k])


def refuse_post_norm_senders(model: Any, edges: Sequence[Edge]) -> None:
    """Many edges are ablated at once by subtracting each sender's output from its receivers' inputs,
    which is not additive where a norm follows the sender: refused there, before any forward."""
    normed = sorted({str(e.src) for e in edges if post_norm(model, e.src) is not None})
    if normed:
        raise BadInputError(f"edge faithfulness ablates many edges at once by subtracting each sender's output, which "
                            f"is not additive where a norm follows the sender ({', '.join(normed[:4])} on this "
                            f"{model.cfg.original_architecture} model); use node-level faithfulness there")


def _edge_hooks(job: PatchJob, ablated: Sequence[Edge], named: Sequence[int], node_ops: Sequence[PatchOp],
                start: int, below: Optional[dict[str, Tensor]]) -> tuple[list[tuple[str, Callable]], dict[str, Tensor]]:
    """The forward hooks of :func:`edges_ablated` for a forward from block ``start`` (0: the whole prompts), and the
    dict the metric's hooks fill. From a later block, ``below`` is the cached run the blocks before it come from: a
    sender there is read from it, and node ops and edges into those blocks are already in it."""
    model = job.model
    fwd: list[tuple[str, Callable]] = [(op.hook.name, partial(apply_ops, [(slice(None), op)])) for op in node_ops
                                       if below is None or op.hook.layer >= start]  # (an embedding's is at -1)
    current: dict[Node, Tensor] = {}
    by_sender: dict[str, list[Node]] = {}
    for e in ablated:
        by_sender.setdefault(sender_hook(e.src), []).append(e.src)
    for name, nodes in by_sender.items():
        if below is not None and nodes[0].layer < start:  # computed before the forward's first block: the cached run's
            for n in set(nodes):
                current[n] = sender_output(model, below, n, list(range(below[name].shape[1])))
            continue

        def grab(act: Tensor, hook: Any, nodes: list = nodes, name: str = name) -> None:
            for n in set(nodes):
                current[n] = sender_output(model, {name: act}, n, list(range(act.shape[1])))
        fwd.append((name, grab))
    targets: dict[str, list[tuple[Edge, list[int], Tensor, Any]]] = {}
    for e in ablated:
        hook, head = receiver_site(e, model)
        if below is not None and hook.layer < start:  # (in the cached run already)
            continue
        pos, delta = sender_delta(job, e, "noise", named)
        corr_out = sender_output(model, job.clean, e.src, pos) + delta
        targets.setdefault(hook.name, []).append((e, pos, corr_out, head))
    for name, items in targets.items():
        def patch(act: Tensor, hook: Any, items: list = items) -> Tensor:
            for e, pos, corr_out, head in items:
                diff = current[e.src][:, pos] - corr_out
                if head is None:
                    act[:, pos] -= diff
                else:
                    act[:, pos, head] -= diff
            return act
        fwd.append((name, patch))
    captured: dict[str, Tensor] = {}
    for h in job.metric.needs(model.cfg.n_layers):
        if below is not None and h.layer < start:
            captured[h.name] = below[h.name]
            continue

        def keep(act: Tensor, hook: Any, name: str = h.name) -> None:
            captured[name] = act
        fwd.append((h.name, keep))
    return fwd, captured


class EdgeBase:
    """A clean run with ``node_ops`` applied and the edges ``fixed`` corrupted as edges, cached (``senders``: the
    sender hooks later evaluations may read): what every evaluation of an edge search holds once its bulk drop is
    fixed. An evaluation that holds it (:func:`edges_ablated` with ``base=``) runs only from the first block that
    receives one of its other edges; the blocks before come from this run, the same numbers a whole forward gives."""

    def __init__(self, job: PatchJob, fixed: Sequence[Edge], named: Sequence[int], node_ops: Sequence[PatchOp],
                 senders: set[str]) -> None:
        self.job, self.fixed, self.named, self.node_ops = job, frozenset(fixed), named, node_ops
        model = job.model
        self.stop = stop_layer(model, job.metric)
        blocks = model.cfg.n_layers if self.stop is None else self.stop
        keep = {hooks.resid_pre(l) for l in range(blocks)} | senders | {
            h.name for h in job.metric.needs(model.cfg.n_layers)}
        self.cache: dict[str, Tensor] = {}

        def cache(act: Tensor, hook: Any) -> None:
            self.cache[hook.name] = act.detach().clone()  # (a later hook may edit it in place)
        fwd, captured = _edge_hooks(job, list(fixed), named, node_ops, 0, None)
        with torch.no_grad():
            logits = model.run_with_hooks(job.prep.clean_tokens, fwd_hooks=fwd + [(n, cache) for n in sorted(keep)],
                                          stop_at_layer=self.stop)
        self.value = float(job.metric(RunView(captured, logits if self.stop is None else None, 0)))

    def start(self, ablated: Sequence[Edge], node_ops: Sequence[PatchOp]) -> Optional[int]:
        """The block an evaluation of ``ablated`` with ``node_ops`` runs from on this base (0 where it does not hold
        the base, or its other edges reach block 0: then a whole forward)."""
        if node_ops is not self.node_ops or not self.fixed <= set(ablated):
            return 0
        model = self.job.model
        if model.cfg.positional_embedding_type == "shortformer":  # positions enter every block: whole forwards
            return 0
        new = [receiver_site(e, model)[0].layer for e in ablated if e not in self.fixed]
        if not new:
            return None  # the base itself
        blocks = model.cfg.n_layers if self.stop is None else self.stop
        return max(0, min(min(new), blocks - 1))


@torch.no_grad()
def edges_ablated(job: PatchJob, ablated: Sequence[Edge], named: Sequence[int],
                  node_ops: Sequence[PatchOp] = (), base: Optional[EdgeBase] = None) -> float:
    """The metric of the clean run with the edges ``ablated`` corrupted as edges (each receiver input
    gets ``input - (current sender output - corrupted sender output)``) and ``node_ops`` applied (nodes
    set to their corrupted values, before any sender output is read). One forward over the whole
    prompts, up to the block after the last one the metric reads; the receiver hooks must be on
    (:func:`~p0circuit.patching.hooking.receiver_hooks`). With a ``base`` (:class:`EdgeBase`) that ``ablated`` and
    ``node_ops`` hold, the forward runs from the first block receiving one of the other edges."""
    model = job.model
    refuse_post_norm_senders(model, ablated)
    start = 0 if base is None else base.start(ablated, node_ops)
    if start is None:
        return base.value  # type: ignore[union-attr]
    below = base.cache if start else None  # type: ignore[union-attr]
    fwd, captured = _edge_hooks(job, ablated, named, node_ops, start, below)
    stop = stop_layer(model, job.metric)
    fwd += ended_at_last_read(model, job.metric, start, stop)
    logits = None
    try:
        if start:
            logits = model.run_with_hooks(below[hooks.resid_pre(start)], fwd_hooks=fwd,  # type: ignore[index]
                                          start_at_layer=start, stop_at_layer=stop)
        else:
            logits = model.run_with_hooks(job.prep.clean_tokens, fwd_hooks=fwd, stop_at_layer=stop)
    except ReadAll:  # (a metric that reads no logits, all of it read)
        pass
    return float(job.metric(RunView(captured, logits if stop is None else None, 0)))


@entry_point
def faithfulness_curve(
    result: PatchResult,
    *,
    setup: Optional[Setup] = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> list[tuple[float, int, float]]:
    """``(fraction, number kept, faithfulness)`` for each fraction, for a node or edge ``result``, on the
    setup the result carries (``setup``: only for a result read back from a file, or to assert which one)."""
    setup = searched(result, setup, "faithfulness_curve")
    model = setup.model
    job = search_job(setup)
    if not len(fractions) or any(not 0.0 <= f <= 1.0 for f in fractions):
        raise BadInputError(f"fractions must be one or more numbers in [0, 1], got {list(fractions)}")
    ranked = _ranked(result)
    is_edge = result.level == "edge"
    if is_edge:
        items: list[Any] = [Edge.parse(n) for n in ranked]
        named = named_positions(e.src for e in items)
        extra = {sender_hook(e.src) for e in items}
    else:
        items = [Node.parse(n) for n in ranked]
        named = named_positions(items)
        extra = {site_of(n, model).read.name for n in items}
    # items that cannot reach the metric change nothing whether dropped or kept: never patched
    live = {x for x in items if job.reaches(receiver_site(x, model)[0] if is_edge else site_of(x, model).hook)}
    job.cache(extra)
    same_clean(job, result)
    gap = result.clean_metric - result.corrupted_metric
    kept = [math.ceil(f * len(items)) for f in fractions]
    dropped = [[x for x in items[k:] if x in live] for k in kept]
    values: dict[int, float] = {}
    with receiver_hooks(model, split_qkv=is_edge):
        if is_edge:
            values = {i: edges_ablated(job, d, named) for i, d in enumerate(dropped) if d}
        else:  # every point in one pass of the engine, which runs only the blocks up to the metric
            todo = [i for i, d in enumerate(dropped) if d]
            groups = [[node_op(job, n, "noise", named) for n in dropped[i]] for i in todo]
            values = dict(zip(todo, run_groups(job.clean_base(), groups, job.rows_per_forward)))
    for i, value in values.items():
        finite(value, setup, f"corrupting the {len(dropped[i])} {'edges' if is_edge else 'nodes'} outside the top "
                             f"{kept[i]} together (faithfulness_curve at fraction {fractions[i]})")
    return [(float(f), k, (values.get(i, job.clean_metric) - result.corrupted_metric) / gap)
            for i, (f, k) in enumerate(zip(fractions, kept))]
