"""The patch ops every method builds: a node's corrupted (or restored) value, and an edge's
corruption sent into its receiver input alone.

* :func:`node_op` sets a node's activation (a head's ``hook_z`` slice, an MLP output, an
  embedding) at its positions to the other run's value;
* :func:`sender_delta` is the change of a sender's residual-stream output between the runs;
* :func:`edge_op` adds that change to one receiver input (a head's q/k/v input or an MLP input),
  so only the direct path from the sender to that receiver carries it.
"""

from typing import Sequence

from torch import Tensor

from p0circuit.patching.edges import receiver_site, sender_hook, sender_output, written
from p0circuit.patching.engine import PatchOp
from p0circuit.patching.job import PatchJob
from p0circuit.patching.sites import positions_of, site_of
from p0circuit.types import Edge, Node


def node_op(job: PatchJob, node: Node, direction: str, named: Sequence[int]) -> PatchOp:
    """Patch ``node`` in the base run of ``direction`` with the other run's value (``named``: the
    positions that ``"rest"`` leaves out)."""
    site = site_of(node, job.model)
    pos = positions_of(node, job.seq_len, named)
    name = site.hook.name
    if direction == "noise":
        value = job.corrupted_value(name, pos)
        base_pos = pos
    else:
        value = job.clean[name][:, pos]
        base_pos = [p + job.offset for p in pos]
    if site.head is not None:
        value = value[:, :, site.head]
    return PatchOp(site.hook, tuple(base_pos), value, site.head)


def sender_delta(job: PatchJob, edge: Edge, direction: str, named: Sequence[int]) -> tuple[list[int], Tensor]:
    """Base-frame positions and the change of the sender's output there."""
    model, src = job.model, edge.src
    pos = positions_of(src, job.seq_len, named)
    clean_out = sender_output(model, job.clean, src, pos)
    corr_out = written(model, src, job.corrupted_value(sender_hook(src), pos))
    if direction == "noise":
        return pos, corr_out - clean_out
    return [p + job.offset for p in pos], clean_out - corr_out


def edge_op(job: PatchJob, edge: Edge, direction: str, named: Sequence[int]) -> PatchOp:
    """The patch that sends one edge's corruption (or restoration) into its receiver."""
    pos, delta = sender_delta(job, edge, direction, named)
    hook, head = receiver_site(edge, job.model)
    return PatchOp(hook, tuple(pos), delta, head, add=True)
