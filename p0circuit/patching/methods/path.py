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

from typing import Optional, Sequence, Union

from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import names
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.patching.edges import candidate_edges, check_metric_outside_receivers, is_valid_edge, parse_edges, receiver_site, sender_hook
from p0circuit.patching.hooking import receiver_hooks
from p0circuit.patching.setup import Setup
from p0circuit.patching.job import PatchJob
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.ops import direct_qkv, edge_op, node_op
from p0circuit.patching.registry import Method, register
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_nodes, named_positions, site_of
from p0circuit.core.types import Edge
from p0circuit.patching.shape import BlockShape


@entry_point
@takes_options()
def path_patch(
    model: HookedTransformer = None,  # type: ignore[assignment]  # (None: setup= gives it)
    tokens: Tensor = None,  # type: ignore[assignment]
    *,
    edges: Optional[Sequence[Union[Edge, str]]] = None,
    chunk: int = 512,
    setup: Optional[Setup] = None,
    options: PatchOptions,
) -> PatchResult:
    """Patch each edge alone; ``edges`` defaults to every valid edge between candidate nodes whose
    receiver sits in a block the metric reads from (the others cannot change it), and each
    candidate's direct edge into what the metric reads (``A1.H2@0->R2@0.resid``).

    Sender deltas (one ``[batch, positions, d_model]`` tensor per edge) are built ``chunk`` edges
    at a time, so memory stays bounded however many edges there are. The shared options are those
    of :func:`activation_patch`."""
    if chunk < 1:
        raise BadInputError(f"chunk must be >= 1 edges, got {chunk}")
    job = PatchJob.start(model, tokens, options, setup)
    direction = job.direction
    if edges is None:  # receivers past the metric's last block cannot change it: not candidates
        edges = candidate_edges(model, candidate_nodes(model), receiver_layers=job.receiver_layers, metric=job.metric)
    edge_list = parse_edges(edges)
    parallel = BlockShape.of(model).parallel
    bad = [e for e in edge_list if not is_valid_edge(e, parallel)]
    if bad:
        raise BadInputError(
            f"{len(bad)} edge(s) have no direct path, e.g. {bad[0]}: a sender must sit before its "
            "receiver (same block only for head -> MLP in sequential blocks) at the same position class"
        )
    check_metric_outside_receivers(model, job.metric, edge_list)
    senders = sorted({e.src for e in edge_list})
    named = named_positions(senders)
    live = [e for e in edge_list if job.reaches(receiver_site(e, model)[0])]
    reaching = [n for n in senders if job.reaches(site_of(n, model).hook)]  # for the fully corrupted reference
    job.cache({sender_hook(n) for n in reaching} | {sender_hook(e.src) for e in live})
    raw: dict[str, float] = {}
    with receiver_hooks(model, split_qkv=not direct_qkv(model)), job.tracking(len(live), "path patching"):
        corrupted = job.corrupted_metric([node_op(job, n, "noise", named) for n in reaching])
        for start in range(0, len(live), chunk):
            part = live[start:start + chunk]
            raw.update(zip((e.name for e in part), job.patch_each([edge_op(job, e, direction, named) for e in part])))
    return job.result("path", "edge", raw, corrupted, candidates=[e.name for e in edge_list])


register(Method(names.PATH, path_patch, "edge",
                summary="patch each edge (sender -> a head's q/k/v input, an MLP input or the metric's stream) alone"))
