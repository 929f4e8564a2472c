"""Path patching: the effect of one sender on one receiver input, excluding every other route.

For an edge ``src -> dst.input`` in the ``noise`` direction, the clean run is repeated with one
change: the receiver's input (a head's query/key/value input, or an MLP's input) gets
``clean input + (corrupted output of src - clean output of src)`` at the edge's positions. Only
the direct residual path from the sender to that receiver carries the corruption; the sender's
effect through any other component, and on any other receiver, is excluded. Everything after the
receiver runs normally, so the receiver's changed output propagates to the metric.

In the ``denoise`` direction the roles of the clean and corrupted runs swap. The fully corrupted
reference is the same as for activation patching.
"""

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from p0circuit.patching.activation import node_op
from p0circuit.patching.corruptions import Corruption
from p0circuit.patching.edges import candidate_edges, is_valid_edge, receiver_site, sender_hook, sender_output
from p0circuit.patching.engine import PatchOp, run_groups, run_groups_reference
from p0circuit.patching.metrics import PatchMetric
from p0circuit.patching.options import receiver_hooks
from p0circuit.patching.result import PatchResult, normalize
from p0circuit.patching.runs import Runs, rows_per, setup
from p0circuit.patching.sites import candidate_nodes, positions_of
from p0circuit.errors import BadInputError
from p0circuit.types import REST, Edge, Kind
from p0circuit.validation import parse_edges


def sender_delta(runs: Runs, edge: Edge, direction: str, named: Sequence[int]) -> tuple[list[int], Tensor]:
    """Base-frame positions and the change of the sender's output there."""
    model, src = runs.model, edge.src
    pos = positions_of(src, runs.prep.clean_tokens.shape[1], named)
    clean_out = sender_output(model, runs.clean, src, pos)
    corr_act = runs.corrupted_value(sender_hook(src), pos)
    if src.kind == Kind.HEAD:
        corr_out = corr_act[:, :, src.head] @ model.W_O[src.layer, src.head]  # (B, P, d_head) x (d_head, d) -> (B, P, d)
    else:
        corr_out = corr_act
    if direction == "noise":
        return pos, corr_out - clean_out
    return [p + runs.prep.offset for p in pos], clean_out - corr_out


def edge_op(runs: Runs, edge: Edge, direction: str, named: Sequence[int]) -> PatchOp:
    """The patch that sends one edge's corruption (or restoration) into its receiver."""
    pos, delta = sender_delta(runs, edge, direction, named)
    hook, head = receiver_site(edge, runs.model)
    return PatchOp(hook, tuple(pos), delta, head, add=True)


def path_patch(
    model: Any,
    tokens: Tensor,
    edges: Optional[Sequence[Union[Edge, str]]] = None,
    corruption: Union[str, Corruption] = "shift",
    metric: Optional[PatchMetric] = None,
    *,
    direction: str = "noise",
    min_signal: float = 0.05,
    rows_per_forward: Optional[int] = None,
    reference: bool = False,
) -> PatchResult:
    """Patch each edge alone; ``edges`` defaults to every valid edge between candidate nodes."""
    tokens, metric, prep = setup(model, tokens, corruption, metric, direction)
    senders = candidate_nodes(model)
    edge_list = parse_edges(edges if edges is not None else candidate_edges(model, senders))
    parallel = bool(model.cfg.parallel_attn_mlp)
    bad = [e for e in edge_list if not is_valid_edge(e, parallel)]
    if bad:
        raise BadInputError(
            f"{len(bad)} edge(s) have no direct path, e.g. {bad[0]}: a sender must sit before its "
            "receiver (same block only for head -> MLP in sequential blocks) at the same position class"
        )
    named = sorted({e.src.pos for e in edge_list if e.src.pos != REST}) or [0]
    extra = {sender_hook(e.src) for e in edge_list}
    runs = Runs(model, prep, metric, extra)
    src_nodes = sorted({e.src for e in edge_list})
    with receiver_hooks(model):
        ops = [edge_op(runs, e, direction, named) for e in edge_list]
        if prep.ablation is None:
            corrupted = runs.metric_of(runs.corr, runs.corr_logits, prep.offset)  # type: ignore[arg-type]
        else:
            full = [node_op(runs, n, "noise", named) for n in src_nodes]
            corrupted = run_groups(model, runs.clean, [full], metric, 0, rows_per(rows_per_forward, tokens))[0]
        base_cache = runs.clean if direction == "noise" else runs.corr
        base_tokens = prep.clean_tokens if direction == "noise" else prep.corrupt_tokens
        p0 = 0 if direction == "noise" else prep.offset
        groups = [[op] for op in ops]
        if reference:
            values = run_groups_reference(model, base_tokens, groups, metric, p0)
        else:
            values = run_groups(model, base_cache, groups, metric, p0, rows_per(rows_per_forward, tokens))
    raw = {e.name: v for e, v in zip(edge_list, values)}
    norm, signal, msg = normalize(runs.clean_metric, corrupted, raw, direction, min_signal)
    return PatchResult(
        method="path", corruption=prep.name, metric=metric.name, direction=direction,
        clean_metric=runs.clean_metric, corrupted_metric=corrupted, raw=raw, normalized=norm, signal=signal,
        message=msg, settings={"corruption_params": dict(prep.params), "n_prompts": int(tokens.shape[0]),
                               "seq_len": int(tokens.shape[1])},
    )
