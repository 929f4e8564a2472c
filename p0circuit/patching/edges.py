"""Candidate edges and the sender/receiver sites of path and attribution patching.

An edge ``src -> dst.input`` is the *direct* path from a sender's output through the residual
stream into one input of a receiver: a head's query, key or value input (at the receiver node's
position: the query position for ``q``, the key position for ``k``/``v``) or an MLP's input.
The residual stream is position-local, so a direct path connects a sender and a receiver input at
the same position class.
"""

from typing import Any, Optional, Sequence, Union

from torch import Tensor

from p0circuit import hooks
from p0circuit.errors import BadInputError
from p0circuit.hooks import HookRef
from p0circuit.types import Edge, Input, Kind, Node, parse_list

_QKV = {Input.Q: "q", Input.K: "k", Input.V: "v"}


def receiver_site(edge: Edge, model: Any) -> tuple[HookRef, Optional[int]]:
    """Hook (and head index) of the receiver input of ``edge``."""
    dst = edge.dst
    if dst.layer >= model.cfg.n_layers:
        raise BadInputError(f"edge {edge}: receiver layer {dst.layer} is outside the model's 0..{model.cfg.n_layers - 1}")
    if edge.input in _QKV:
        head = dst.head
        n_kv = model.cfg.n_key_value_heads
        if edge.input != Input.Q and n_kv is not None and not model.cfg.ungroup_grouped_query_attention:
            head = dst.head // (model.cfg.n_heads // n_kv)  # grouped-query attention: the shared k/v head
        return HookRef(dst.layer, hooks.head_input(dst.layer, _QKV[edge.input])), head
    if edge.input == Input.MLP:
        return HookRef(dst.layer, hooks.mlp_in(dst.layer)), None
    return HookRef(dst.layer, hooks.resid_post(dst.layer)), None


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


def candidate_edges(
    model: Any, senders: Sequence[Node], qkv: Sequence[str] = ("q", "k", "v"), receiver_layers: Optional[int] = None,
) -> list[Edge]:
    """Every valid edge from ``senders`` into the q/k/v inputs of every head and every MLP input
    (of the first ``receiver_layers`` blocks when given)."""
    parallel = bool(model.cfg.parallel_attn_mlp)
    pos_classes = sorted({n.pos for n in senders}, key=str)
    layers = range(model.cfg.n_layers if receiver_layers is None else min(receiver_layers, model.cfg.n_layers))
    edges = []
    for src in senders:
        for p in pos_classes:
            if p != src.pos:
                continue
            for layer in layers:
                for h in range(model.cfg.n_heads):
                    for which in qkv:
                        e = Edge(src, Node(Kind.HEAD, layer, h, p), Input(which))
                        if is_valid_edge(e, parallel):
                            edges.append(e)
                if not model.cfg.attn_only:
                    e = Edge(src, Node(Kind.MLP, layer, pos=p), Input.MLP)
                    if is_valid_edge(e, parallel):
                        edges.append(e)
    return edges


def sender_output(model: Any, cache: dict[str, Tensor], node: Node, positions: list[int]) -> Tensor:
    """What ``node`` adds to the residual stream at ``positions``: ``[batch, len(positions), d_model]``."""
    if node.kind == Kind.HEAD:
        z = cache[hooks.head_z(node.layer)][:, positions, node.head]  # (B, P, d_head)
        return z @ model.blocks[node.layer].attn.W_O[node.head]  # (B, P, d_head) x (d_head, d_model) -> (B, P, d_model)
    if node.kind == Kind.MLP:
        return cache[hooks.mlp_out(node.layer)][:, positions]
    if node.kind == Kind.EMBED:
        return cache[hooks.EMBED][:, positions]
    if node.kind == Kind.POS_EMBED:
        return cache[hooks.POS_EMBED][:, positions]
    raise BadInputError(f"{node}: residual-stream nodes cannot be edge senders; use heads, MLPs or embeddings")


def sender_hook(node: Node) -> str:
    """The hook :func:`sender_output` reads for ``node``."""
    return {
        Kind.HEAD: lambda: hooks.head_z(node.layer),
        Kind.MLP: lambda: hooks.mlp_out(node.layer),
        Kind.EMBED: lambda: hooks.EMBED,
        Kind.POS_EMBED: lambda: hooks.POS_EMBED,
        Kind.RESID: lambda: hooks.resid_post(node.layer),
    }[node.kind]()


def parse_edges(edges: Sequence[Union[Edge, str]]) -> list[Edge]:
    """Edges from Edge objects or names like 'M1@0->A2.H0@0.k'; duplicates and empties are errors."""
    return parse_list(edges, Edge, "edges", "M1@0->A2.H0@0.k")
