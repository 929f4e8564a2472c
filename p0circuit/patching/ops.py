"""The patch ops every method builds: a node's corrupted (or restored) value, and an edge's
corruption sent into its receiver input alone.

* :func:`node_op` sets a node's activation (a head's ``hook_z`` slice, an MLP output, an
  embedding) at its positions to the other run's value;
* :func:`sender_delta` is the change of a sender's residual-stream output between the runs
  (through the norm after it, where a block has one: :func:`~p0circuit.patching.edges.sender_change`);
* :func:`edge_op` adds that change to one receiver input (a head's q/k/v input, an MLP input, or
  the residual stream the metric reads, for a direct edge), so only the direct path from the sender
  to that receiver carries it.
"""

from typing import Any, Sequence

from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.hooks import HookRef
from p0circuit.patching.edges import receiver_site, sender_change, sender_hook
from p0circuit.patching.engine import PatchOp, output_norm
from p0circuit.patching.job import PatchJob
from p0circuit.patching.sites import positions_of, site_of
from p0circuit.patching.experts import expert_contribution
from p0circuit.core.types import Edge, Kind, Node


def node_op(job: PatchJob, node: Node, direction: str, named: Sequence[int]) -> PatchOp:
    """Patch ``node`` in the base run of ``direction`` with the other run's value (``named``: the
    positions that ``"rest"`` leaves out)."""
    site = site_of(node, job.model)
    pos = positions_of(node, job.seq_len, named)
    if node.kind == Kind.EXPERT:
        return _expert_op(job, node, site, direction, pos)
    name = site.hook.name
    if direction == "noise":
        value = job.corrupted_value(name, pos)
        base_pos = pos
    else:
        value = job.clean_value(name, pos)
        base_pos = job.prep.aligned(pos)
    if site.head is not None:
        value = value[:, :, site.head]
    return PatchOp(site.hook, tuple(base_pos), value, site.head)


def _expert_op(job: PatchJob, node: Node, site: Any, direction: str, pos: list[int]) -> PatchOp:
    """An expert's contribution to the MLP output set to the other run's: the change added at
    ``hook_mlp_out``. The contributions of every position are recomputed from the cached normalized
    MLP inputs of both runs, and the corruption acts on them (``pos_mean``: the mean contribution
    over t > 0; ``zero``: none)."""
    layer, read = node.layer, site.read.name
    clean = expert_contribution(job.model, layer, job.clean[read], node.neuron)  # (B, T, d_model)
    corr = None if job.corr is None else expert_contribution(job.model, layer, job.corr[read], node.neuron)
    if direction == "noise":
        return PatchOp(site.hook, tuple(pos), job.prep.corrupted_value(clean, corr, pos) - clean[:, pos], add=True)
    base_pos = job.prep.aligned(pos)
    return PatchOp(site.hook, tuple(base_pos), clean[:, pos] - corr[:, base_pos], add=True)  # type: ignore[index]


def sender_delta(job: PatchJob, edge: Edge, direction: str, named: Sequence[int]) -> tuple[list[int], Tensor]:
    """Base-frame positions and the change of the sender's output there."""
    model, src = job.model, edge.src
    pos = positions_of(src, job.seq_len, named)
    clean = job.clean[sender_hook(src)][:, pos]  # sender_hook refuses senders that are not components
    corr = job.corrupted_value(sender_hook(src), pos)
    if direction == "noise":
        return pos, sender_change(model, src, clean, corr)
    return job.prep.aligned(pos), sender_change(model, src, corr, clean)


def edge_op(job: PatchJob, edge: Edge, direction: str, named: Sequence[int]) -> PatchOp:
    """The patch that sends one edge's corruption (or restoration) into its receiver.

    A query, key or value edge on a model where :func:`direct_qkv` holds sets the receiver
    head's vector (``hook_q``/``hook_k``/``hook_v``) to ``ln1(resid + delta) W + b``, computed once
    from the base run (the patched forward starts at the receiver's block, so its input is the
    cached one): the forward then needs no per-head copies of the residual stream
    (``use_split_qkv_input``), which cost more than the rest of a small forward."""
    pos, delta = sender_delta(job, edge, direction, named)
    hook, head = receiver_site(edge, job.model)
    if edge.input.value in ("q", "k", "v") and direct_qkv(job.model):
        cache = job.base().cache
        layer = edge.dst.layer
        x = job.model.blocks[layer].ln1(cache[hooks.resid_pre(layer)][:, list(pos)] + delta)  # (B, P, d_model)
        weight, bias = _projection(job.model.blocks[layer].attn, edge.input.value, head)
        vector = x @ weight + bias  # (B, P, d_model) x (d_model, d_head) -> (B, P, d_head)
        return PatchOp(HookRef(layer, hooks.head_vector(layer, edge.input.value)), tuple(pos), vector, head)
    return PatchOp(hook, tuple(pos), delta, head, add=True)


def direct_qkv(model: Any) -> bool:
    """Whether a head's query/key/value vector is ``ln1(resid_pre) W + b`` exactly, so that
    :func:`edge_op` can compute a patched one: not with shortformer positions (added to the
    query and key inputs), post-norm blocks, query/key norms or 4-bit weights."""
    cfg = model.cfg
    return (cfg.positional_embedding_type != "shortformer" and output_norm(model, "attn") is None
            and not getattr(cfg, "use_qk_norm", False)
            and not getattr(cfg, "load_in_4bit", False) and not cfg.use_attn_in)


def _projection(attn: Any, which: str, head: int) -> tuple[Tensor, Tensor]:
    """(W, b) of one head's query, key or value projection; a key/value head's own weights under
    grouped-query attention (``_W_K``), where ``W_K`` repeats them for every query head."""
    if which == "q":
        return attn.W_Q[head], attn.b_Q[head]
    grouped = hasattr(attn, "_W_K") and not attn.cfg.ungroup_grouped_query_attention
    if which == "k":
        return (attn._W_K[head], attn._b_K[head]) if grouped else (attn.W_K[head], attn.b_K[head])
    return (attn._W_V[head], attn._b_V[head]) if grouped else (attn.W_V[head], attn.b_V[head])
