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

from torch import Tensor

from p0circuit.patching.activation import node_op
from p0circuit.patching.edges import candidate_edges, is_valid_edge, receiver_site, sender_hook, sender_output
from p0circuit.patching.engine import PatchOp
from p0circuit.patching.options import receiver_hooks
from p0circuit.patching.result import PatchResult
from p0circuit.patching.runs import Runs, corrupted_metric, make_result, patch_each, setup
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
    tokens: Any,  # validated by check_tokens
    edges: Optional[Sequence[Union[Edge, str]]] = None,
    corruption: Any = "shift",  # a registry name or a corruption; validated by get_corruption
    metric: Any = None,  # validated by check_metric with a clear message
    *,
    direction: str = "noise",
    min_signal: float = 0.05,
    bos: Any = None,  # True / False / None; checked by check_bos
    rows_per_forward: Optional[int] = None,
    reference: bool = False,
) -> PatchResult:
    """Patch each edge alone; ``edges`` defaults to every valid edge between candidate nodes."""
    tokens, metric, prep = setup(model, tokens, corruption, metric, direction, bos)
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
        corrupted = corrupted_metric(runs, [node_op(runs, n, "noise", named) for n in src_nodes], rows_per_forward)
        values = patch_each(runs, ops, direction, rows_per_forward, reference)
    raw = {e.name: v for e, v in zip(edge_list, values)}
    return make_result("path", runs, raw, corrupted, direction, min_signal)
