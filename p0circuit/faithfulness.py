"""Faithfulness curves (as in the MIB benchmark): how much of the clean-vs-corrupted metric gap a
circuit made of the top x% of nodes or edges keeps when everything else is corrupted.

For a fraction x, the top ``ceil(x * n)`` candidates by |effect| are kept and every other
candidate is corrupted at once on the clean run; faithfulness is
``(M_kept - M_corrupted) / (M_clean - M_corrupted)``. Edges are corrupted as edges: the
receiver's input gets ``input - (current sender output - corrupted sender output)``, computed
during the forward pass, so senders changed upstream are accounted for.
"""

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from p0circuit.errors import BadInputError
from p0circuit.patching.activation import node_op
from p0circuit.patching.edges import receiver_site, sender_hook, sender_output
from p0circuit.patching.engine import run_groups_reference
from p0circuit.patching.metrics import RunView
from p0circuit.patching.options import receiver_hooks
from p0circuit.patching.path import sender_delta
from p0circuit.patching.result import PatchResult
from p0circuit.patching.runs import Runs, setup
from p0circuit.patching.sites import site_of
from p0circuit.types import REST, Edge, Node

DEFAULT_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _ranked(result: PatchResult) -> list[str]:
    eff = {k: v for k, v in result.normalized.items() if not math.isnan(v)}
    if not eff:
        raise BadInputError("this result has no finite effects (no signal?): a faithfulness curve needs them")
    return sorted(eff, key=lambda k: -abs(eff[k]))


@torch.no_grad()
def _edges_ablated(runs: Runs, ablated: Sequence[Edge], named: Sequence[int]) -> float:
    model = runs.model
    current: dict[Node, Tensor] = {}
    by_sender: dict[str, list[Node]] = {}
    for e in ablated:
        by_sender.setdefault(sender_hook(e.src), []).append(e.src)
    fwd: list[tuple[str, Callable]] = []
    for name, nodes in by_sender.items():
        def grab(act: Tensor, hook: Any, nodes: list = nodes, name: str = name) -> None:
            for n in set(nodes):
                current[n] = sender_output(model, {name: act}, n, list(range(act.shape[1])))
        fwd.append((name, grab))
    targets: dict[str, list[tuple[Edge, list[int], Tensor, Any]]] = {}
    for e in ablated:
        pos, delta = sender_delta(runs, e, "noise", named)
        corr_out = sender_output(model, runs.clean, e.src, pos) + delta
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
    metric_names = [h.name for h in runs.metric.needs(model.cfg.n_layers)]
    captured: dict[str, Tensor] = {}
    for name in metric_names:
        def keep(act: Tensor, hook: Any, name: str = name) -> None:
            captured[name] = act
        fwd.append((name, keep))
    logits = model.run_with_hooks(runs.prep.clean_tokens, fwd_hooks=fwd)
    return float(runs.metric(RunView(captured, logits, 0)))


def faithfulness_curve(
    model: Any,
    tokens: Any,  # validated by check_tokens
    result: PatchResult,
    corruption: Any,
    metric: Any,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> list[tuple[float, int, float]]:
    """``(fraction, number kept, faithfulness)`` for each fraction, for a node or edge result."""
    tokens, metric, prep = setup(model, tokens, corruption, metric, "noise")
    if prep.name != result.corruption or metric.name != result.metric:
        raise BadInputError(
            f"the result was computed with corruption={result.corruption!r}, metric={result.metric!r}; "
            f"pass the same ones (got {prep.name!r}, {metric.name!r})"
        )
    if any(not 0.0 <= f <= 1.0 for f in fractions):
        raise BadInputError(f"fractions must lie in [0, 1], got {list(fractions)}")
    ranked = _ranked(result)
    is_edge = result.method == "path" or result.settings.get("level") == "edge"
    if is_edge:
        items: list[Any] = [Edge.parse(n) for n in ranked]
        named = sorted({e.src.pos for e in items if e.src.pos != REST}) or [0]
        extra = {sender_hook(e.src) for e in items}
    else:
        items = [Node.parse(n) for n in ranked]
        named = sorted({n.pos for n in items if n.pos != REST}) or [0]
        extra = {site_of(n, model).hook.name for n in items}
    runs = Runs(model, prep, metric, extra)
    gap = result.clean_metric - result.corrupted_metric
    curve = []
    with receiver_hooks(model):
        for f in fractions:
            k = math.ceil(f * len(items))
            dropped = items[k:]
            if not dropped:
                value = runs.clean_metric
            elif is_edge:
                value = _edges_ablated(runs, dropped, named)
            else:
                ops = [node_op(runs, n, "noise", named) for n in dropped]
                value = run_groups_reference(model, prep.clean_tokens, [ops], metric, 0)[0]
            curve.append((float(f), k, (value - result.corrupted_metric) / gap))
    return curve
