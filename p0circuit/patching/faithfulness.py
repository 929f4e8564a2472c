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

from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.patching.circuit_search import same_clean, search_job, searched
from p0circuit.patching.edges import post_norm, receiver_site, sender_hook, sender_output
from p0circuit.patching.engine import PatchOp, apply_ops, run_groups, stop_layer
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


@torch.no_grad()
def edges_ablated(job: PatchJob, ablated: Sequence[Edge], named: Sequence[int],
                  node_ops: Sequence[PatchOp] = ()) -> float:
    """The metric of the clean run with the edges ``ablated`` corrupted as edges (each receiver input
    gets ``input - (current sender output - corrupted sender output)``) and ``node_ops`` applied (nodes
    set to their corrupted values, before any sender output is read). One forward over the whole
    prompts, up to the block after the last one the metric reads; the receiver hooks must be on
    (:func:`~p0circuit.patching.hooking.receiver_hooks`)."""
    model = job.model
    refuse_post_norm_senders(model, ablated)
    fwd: list[tuple[str, Callable]] = [(op.hook.name, partial(apply_ops, [(slice(None), op)])) for op in node_ops]
    current: dict[Node, Tensor] = {}
    by_sender: dict[str, list[Node]] = {}
    for e in ablated:
        by_sender.setdefault(sender_hook(e.src), []).append(e.src)
    for name, nodes in by_sender.items():
        def grab(act: Tensor, hook: Any, nodes: list = nodes, name: str = name) -> None:
            for n in set(nodes):
                current[n] = sender_output(model, {name: act}, n, list(range(act.shape[1])))
        fwd.append((name, grab))
    targets: dict[str, list[tuple[Edge, list[int], Tensor, Any]]] = {}
    for e in ablated:
        pos, delta = sender_delta(job, e, "noise", named)
        corr_out = sender_output(model, job.clean, e.src, pos) + delta
        hook, head = receiver_site(e, model)
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
    metric_names = [h.name for h in job.metric.needs(model.cfg.n_layers)]
    captured: dict[str, Tensor] = {}
    for name in metric_names:
        def keep(act: Tensor, hook: Any, name: str = name) -> None:
            captured[name] = act
        fwd.append((name, keep))
    stop = stop_layer(model, job.metric)
    logits = model.run_with_hooks(job.prep.clean_tokens, fwd_hooks=fwd, stop_at_layer=stop)
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
