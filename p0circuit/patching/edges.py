"""Candidate edges and the sender/receiver sites of path and attribution patching.

An edge ``src -> dst.input`` is the *direct* path from a sender's output through the residual
stream into one input of a receiver: a head's query, key or value input (at the receiver node's
position: the query position for ``q``, the key position for ``k``/``v``), an MLP's input, or
what the metric itself reads (``S->R{L}@p.resid``: the sender's direct write into the residual
stream after block ``L``, bypassing every later component). The residual stream is position-local, so a direct path connects a sender and a receiver input at
the same position class.
"""

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.core.args import entry_point
from p0circuit.core.hooks import HookRef
from p0circuit.models.checks import check_model
from p0circuit.patching.engine import output_norm
from p0circuit.patching.metrics import PatchMetric
from p0circuit.patching.sites import site_of
from p0circuit.core.types import Edge, Input, Kind, Node, parse_list
from p0circuit.patching.shape import BlockShape

_QKV = {Input.Q: "q", Input.K: "k", Input.V: "v"}


def receiver_site(edge: Edge, model: Any) -> tuple[HookRef, Optional[int]]:
    """Hook (and head index) of the receiver input of ``edge``."""
    dst = edge.dst
    if dst.layer >= model.cfg.n_layers:
        raise BadInputError(f"edge {edge}: receiver layer {dst.layer} is outside the model's 0..{model.cfg.n_layers - 1}")
    if edge.input in _QKV:
        n_kv = kv_heads(model)
        if edge.input != Input.Q and n_kv != model.cfg.n_heads and dst.kind == Kind.HEAD:
            group = model.cfg.n_heads // n_kv
            raise BadInputError(
                f"edge {edge}: in grouped-query attention keys and values belong to the shared key/value head, "
                f"not to a query head ({group} query heads share each); name the receiver "
                f"A{dst.layer}.KV{dst.head // group}@{dst.pos}.{edge.input.value}")
        if dst.kind == Kind.KV_HEAD and dst.head >= n_kv:
            raise BadInputError(f"edge {edge}: the model has key/value heads 0..{n_kv - 1}")
        if dst.kind == Kind.HEAD and dst.head >= model.cfg.n_heads:
            raise BadInputError(f"edge {edge}: the model has heads 0..{model.cfg.n_heads - 1}")
        return HookRef(dst.layer, hooks.head_input(dst.layer, _QKV[edge.input])), dst.head
    if edge.input == Input.MLP:
        return HookRef(dst.layer, hooks.mlp_in(dst.layer)), None
    return HookRef(dst.layer, hooks.resid_post(dst.layer)), None


def kv_heads(model: Any) -> int:
    """Key/value heads per block: fewer than the query heads under grouped-query attention."""
    return BlockShape.of(model).kv_heads


def is_valid_edge(edge: Edge, parallel: bool) -> bool:
    """Whether a direct path from ``edge.src`` to ``edge.dst``'s input exists."""
    src, dst = edge.src, edge.dst
    if src.pos != dst.pos:
        return False
    src_layer = -1 if src.kind in (Kind.EMBED, Kind.POS_EMBED) else src.layer
    if edge.input == Input.RESID:
        return src_layer <= dst.layer and not (src.kind == Kind.RESID)
    if src.kind == Kind.RESID:
        return src_layer < dst.layer
    if src_layer < dst.layer:
        return True
    # same block: a head's output reaches that block's MLP input in sequential blocks
    return (not parallel and src_layer == dst.layer and src.kind == Kind.HEAD and edge.input == Input.MLP)


@entry_point
def candidate_edges(
    model: HookedTransformer, senders: Sequence[Node], qkv: Sequence[str] = ("q", "k", "v"), receiver_layers: Optional[int] = None,
    metric: Optional[PatchMetric] = None,
) -> list[Edge]:
    """Every valid edge from ``senders`` into the q/k/v inputs of every head and every MLP input
    (of the first ``receiver_layers`` blocks when given). Under grouped-query attention the
    receivers of key and value edges are the key/value heads (``A2.KV1@0.k``), each once: a query
    head has no keys or values of its own.

    With ``metric``, also each sender's *direct* edge into what the metric reads
    (:meth:`~p0circuit.PatchMetric.residual_reads`): ``A1.H2@0->R2@0.resid`` carries the sender's
    change straight into block 2's output, bypassing every component after the sender, so a
    component that writes the measured residual stream itself is a candidate too."""
    check_model(model)
    if metric is not None and not isinstance(metric, PatchMetric):
        raise BadInputError(f"candidate_edges: metric must be a PatchMetric (the direct edges go into what it reads), "
                            f"got {type(metric).__name__}")
    if isinstance(qkv, str) or any(q not in ("q", "k", "v") for q in qkv):
        raise BadInputError(f"candidate_edges: qkv={qkv!r:.40} must be a list drawn from 'q', 'k', 'v' "
                            "(e.g. ('k', 'v') for edges into keys and values only)")
    if receiver_layers is not None and not 1 <= receiver_layers <= model.cfg.n_layers:
        raise BadInputError(f"candidate_edges: receiver_layers={receiver_layers} must lie in 1..{model.cfg.n_layers} "
                            "(the number of blocks, from block 0, whose inputs receive edges), or None for all")
    senders = parse_list(senders, Node, "senders", "M0@0")
    for node in senders:  # a node of this model (a larger model's is refused, naming the range)
        try:
            site_of(node, model)
        except BadInputError as err:
            raise BadInputError(f"candidate_edges: senders holds {node.name}: {err}") from None
    shape = BlockShape.of(model)
    parallel = shape.parallel
    layers = range(model.cfg.n_layers if receiver_layers is None else min(receiver_layers, model.cfg.n_layers))
    direct = [] if metric is None else [l for l in metric.residual_reads(model.cfg.n_layers) if l in layers]
    edges = []
    for src in senders:
        p = src.pos  # a sender writes to receivers at its own position class
        for layer in layers:
            for which in qkv:
                grouped = which != "q" and kv_heads(model) != model.cfg.n_heads
                kind, count = (Kind.KV_HEAD, kv_heads(model)) if grouped else (Kind.HEAD, model.cfg.n_heads)
                for h in range(count):
                    e = Edge(src, Node(kind, layer, h, p), Input(which))
                    if is_valid_edge(e, parallel):
                        edges.append(e)
            if shape.has_mlp:
                e = Edge(src, Node(Kind.MLP, layer, pos=p), Input.MLP)
                if is_valid_edge(e, parallel):
                    edges.append(e)
        for layer in direct:
            e = Edge(src, Node(Kind.RESID, layer, pos=p), Input.RESID)
            if is_valid_edge(e, parallel):
                edges.append(e)
    return edges


def check_metric_outside_receivers(model: Any, metric: Any, edges: Sequence[Edge]) -> None:
    """Refuse a metric that reads what lies between a query, key or value receiver's residual stream
    and its projection (``blocks.L.ln1.*``, ``blocks.L.hook_{q,k,v}_input``): an edge into one head's
    q/k/v input changes that head's input alone, so those hooks have no single patched value
    (TransformerLens computes one per head and input, and keeps the last). A metric read downstream,
    or an MLP-input edge (its ``hook_mlp_in`` and ``ln2`` are one tensor), is unambiguous."""
    layers = {e.dst.layer for e in edges if e.input.value in ("q", "k", "v")}
    inputs = ("hook_q_input", "hook_k_input", "hook_v_input")
    inside = sorted({h.name for h in metric.needs(model.cfg.n_layers)
                     if any(h.name.startswith(f"blocks.{l}.ln1.") or h.name in {f"blocks.{l}.{i}" for i in inputs}
                            for l in layers)})
    if inside:
        raise ConfigError(
            f"the metric {metric.name} reads {inside[0]}, the normalized attention input inside block "
            f"{inside[0].split('.')[1]}, whose query/key/value inputs receive edges here; an edge into one head's "
            "input changes that head's normalized input only, so that hook has no single patched value. Read the "
            "metric after the block (its resid_post or a later hook), or leave out edges into that block's q/k/v")


def among(model: Any, edges: Sequence[Edge], nodes: Sequence[Node]) -> list[Edge]:
    """The edges of ``edges`` whose receiver is one of ``nodes``: the one rule by which a list of
    candidate nodes narrows candidate edges (discovery's ``--layers``/``--nodes``/``--positions``,
    the analysis' edges between its strongest nodes). A key/value head (grouped-query attention) is
    never a node itself; it counts as one of ``nodes`` when a query head of its group at its layer
    and position is one, so the keys and values those query heads read stay candidates. A direct
    edge into the metric (receiver ``R<l>``) is kept: what the metric reads is not a candidate node."""
    keep = set(parse_list(nodes, Node, "nodes", "A0.H1@0"))
    n_kv = kv_heads(model)
    group = model.cfg.n_heads // n_kv
    out = []
    for e in edges:
        dst = e.dst
        if dst.kind == Kind.RESID:
            inside = True
        elif dst.kind == Kind.KV_HEAD:
            inside = any(Node(Kind.HEAD, dst.layer, dst.head * group + g, dst.pos) in keep for g in range(group))
        else:
            inside = dst in keep
        if inside:
            out.append(e)
    return out


def sender_output(model: Any, cache: dict[str, Tensor], node: Node, positions: list[int]) -> Tensor:
    """What ``node`` adds to the residual stream at ``positions``: ``[batch, len(positions), d_model]``."""
    return written(model, node, cache[sender_hook(node)][:, positions])


def written(model: Any, node: Node, act: Tensor) -> Tensor:
    """What ``node`` writes into the residual stream, from its sender hook's activation ``act``
    (already cut to the positions): ``[batch, pos, d_model]``."""
    if node.kind == Kind.HEAD:
        return act[:, :, node.head] @ model.blocks[node.layer].attn.W_O[node.head]  # (B, P, d_head) x (d_head, d) -> (B, P, d)
    if node.kind == Kind.NEURON:
        return act[:, :, node.neuron, None] * model.blocks[node.layer].mlp.W_out[node.neuron]  # (B, P, 1) x (d,) -> (B, P, d)
    return act


def post_norm(model: Any, node: Node) -> Optional[Any]:
    """The norm that what ``node`` writes passes through before it reaches the residual stream, or
    None: a head's output in blocks with a norm after attention (Gemma 2/3's ``ln1_post``, OLMo
    2/3's post-norm ``ln1``), a neuron's in blocks with a norm after the MLP. An MLP's whole output
    (``hook_mlp_out``) is already taken after that norm."""
    if node.kind not in (Kind.HEAD, Kind.NEURON):
        return None
    norms = output_norm(model, "attn" if node.kind == Kind.HEAD else "mlp")
    return None if norms is None else norms[node.layer]


def sender_change(model: Any, node: Node, base: Tensor, new: Tensor) -> Tensor:
    """The change of what ``node`` adds to the residual stream when its sender-hook activation
    (cut to the positions) goes from ``base`` to ``new``, every other component as in the base run.

    Without a norm after the sender this is ``written(new) - written(base)``. With one
    (:func:`post_norm`) the sender's change is added before that norm, together with the base run's
    other heads (or neurons), and the change is what leaves the norm:
    ``norm(pre + (new - base) W) - norm(pre)``, ``pre`` the base run's attention (or MLP) output
    before the norm."""
    norm = post_norm(model, node)
    if norm is None:
        return written(model, node, new) - written(model, node, base)
    block = model.blocks[node.layer]
    if node.kind == Kind.HEAD:
        W_O = block.attn.W_O  # (H, d_head, d_model)
        pre = torch.einsum("bphd,hdm->bpm", base, W_O) + block.attn.b_O  # (B, P, d_model)
    else:
        if not hasattr(block.mlp, "W_out"):
            raise BadInputError(f"{node}: this block's MLP has no single W_out (mixture of experts); "
                                "neurons cannot be senders here")
        pre = base @ block.mlp.W_out + block.mlp.b_out  # (B, P, d_mlp) x (d_mlp, d_model) -> (B, P, d_model)
    changed = pre + written(model, node, new) - written(model, node, base)
    return norm(changed) - norm(pre)


def sender_hook(node: Node) -> str:
    """The hook :func:`sender_output` reads for ``node``; a clear error for nodes that cannot send."""
    if node.kind in (Kind.RESID, Kind.KV_HEAD, Kind.EXPERT):
        raise BadInputError(f"{node}: residual-stream nodes, key/value heads and experts cannot be edge senders; use "
                            "heads, MLPs (a mixture of experts as a whole), neurons or embeddings")
    return {
        Kind.HEAD: lambda: hooks.head_z(node.layer),
        Kind.MLP: lambda: hooks.mlp_out(node.layer),
        Kind.NEURON: lambda: hooks.mlp_post(node.layer),
        Kind.EMBED: lambda: hooks.EMBED,
        Kind.POS_EMBED: lambda: hooks.POS_EMBED,
    }[node.kind]()


def parse_edges(edges: Sequence[Union[Edge, str]]) -> list[Edge]:
    """Edges from Edge objects or names like 'M1@0->A2.H0@0.k'; duplicates and empties are errors."""
    return parse_list(edges, Edge, "edges", "M1@0->A2.H0@0.k")
