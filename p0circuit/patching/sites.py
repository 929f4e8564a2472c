"""Where a node's activation lives in a hooked model, and which nodes are candidates.

A node's *site* is the hook holding its output (head outputs are patched at ``hook_z``, which
is equivalent to patching the head's ``z @ W_O`` contribution), the head index for per-head
hooks, and the block at which a patched forward must start.
"""

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from transformer_lens import HookedTransformer

from p0circuit.core import hooks
from p0circuit.core.args import as_list
from p0circuit.core.errors import BadInputError, MissingHookError
from p0circuit.core.names import POSITIONS
from p0circuit.core.args import entry_point
from p0circuit.core.hooks import HookRef
from p0circuit.patching.experts import check_experts, mlp_input_hook
from p0circuit.core.types import REST, Kind, Node
from p0circuit.patching.shape import BlockShape


@dataclass(frozen=True)
class Site:
    """Where a node's activation is read and written."""

    hook: HookRef
    """Hook (with its block) holding the node's activation."""
    head: Optional[int]
    """Index along the activation's third axis: the head of per-head hooks, the neuron of
    ``mlp.hook_post``; None for whole activations."""
    reads: Optional[HookRef] = None
    """The hook whose cached value the node's patch is computed from, when it is not ``hook``
    (an expert's contribution is recomputed from the residual stream the MLP reads)."""

    @property
    def read(self) -> HookRef:
        """The hook the patch reads from the cached runs."""
        return self.reads or self.hook


def site_of(node: Node, model: Any) -> Site:
    """The site of ``node`` in ``model``; clear errors for nodes the model does not have."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if node.kind not in (Kind.EMBED, Kind.POS_EMBED) and node.layer >= n_layers:
        raise BadInputError(f"node {node} names layer {node.layer}, but the model has layers 0..{n_layers - 1}")
    if node.kind == Kind.HEAD:
        if node.head >= n_heads:
            raise BadInputError(f"node {node} names head {node.head}, but layers have heads 0..{n_heads - 1}")
        return Site(HookRef(node.layer, hooks.head_z(node.layer)), node.head)
    shape = BlockShape.of(model)
    if node.kind in (Kind.MLP, Kind.NEURON, Kind.EXPERT) and shape.attn_only:
        raise BadInputError(f"node {node}: this model is attention-only and has no MLPs")
    if node.kind == Kind.MLP:
        return Site(HookRef(node.layer, hooks.mlp_out(node.layer)), None)
    n_experts = shape.experts
    if node.kind == Kind.EXPERT:
        if not n_experts:
            raise BadInputError(f"node {node}: this model's MLPs are not mixtures of experts; use M{node.layer}@{node.pos}")
        if node.neuron >= n_experts:
            raise BadInputError(f"node {node} names expert {node.neuron}, but MLPs have experts 0..{n_experts - 1}")
        check_experts(model, node)
        return Site(HookRef(node.layer, hooks.mlp_out(node.layer)), None,
                    HookRef(node.layer, mlp_input_hook(model, node.layer)))
    if node.kind == Kind.NEURON:
        if n_experts:
            raise BadInputError(f"node {node}: in a mixture of experts each expert has neurons of its own; patch the "
                                f"experts (M{node.layer}.E0@{node.pos}, ...: p0circuit.candidate_experts)")
        if node.neuron >= model.cfg.d_mlp:
            raise BadInputError(f"node {node} names neuron {node.neuron}, but MLPs have neurons 0..{model.cfg.d_mlp - 1}")
        return Site(HookRef(node.layer, hooks.mlp_post(node.layer)), node.neuron)
    if node.kind == Kind.KV_HEAD:
        raise BadInputError(f"node {node}: a key/value head is only a receiver of k/v edges (path patching); "
                            "patch the query heads' outputs (A{l}.H{h}) as nodes instead")
    if node.kind == Kind.RESID:
        return Site(HookRef(node.layer, hooks.resid_post(node.layer)), None)
    if node.kind == Kind.EMBED:
        return Site(HookRef(hooks.EMBED_LAYER, hooks.EMBED), None)
    if hooks.POS_EMBED not in model.hook_dict or model.cfg.positional_embedding_type != "standard":
        raise MissingHookError(
            f"node {node}: this model has no additive position embedding (positions are "
            f"{model.cfg.positional_embedding_type}); drop PE nodes from the candidates"
        )
    return Site(HookRef(hooks.EMBED_LAYER, hooks.POS_EMBED), None)


def positions_of(node: Node, seq_len: int, named: Sequence[int] = (0,)) -> list[int]:
    """Clean-frame positions of ``node``: its index, or for ``"rest"`` every position not in ``named``."""
    if node.pos == REST:
        pos = [t for t in range(seq_len) if t not in set(named)]
        if not pos:
            raise BadInputError(f"node {node}: prompts of length {seq_len} have no 'rest' positions")
        return pos
    assert isinstance(node.pos, int)
    if node.pos >= seq_len:
        raise BadInputError(f"node {node} names position {node.pos}, but prompts have length {seq_len}")
    return [node.pos]


def has_learned_positions(model: Any) -> bool:
    """True when position 0 is visible in an additive, trainable position embedding."""
    return model.cfg.positional_embedding_type == "standard" and bool(model.W_pos.requires_grad)


@entry_point
def candidate_nodes(
    model: HookedTransformer,
    positions: Iterable[int] = (0,),
    rest: bool = True,
    embed: bool = False,
    pos_embed: Optional[bool] = None,
    resid: bool = False,
) -> list[Node]:
    """Every head and MLP output at each of ``positions`` (and ``"rest"``), optionally embeddings.

    The token embedding is an *input*, not a candidate, by default: under ``pos_mean`` it is
    trivially necessary in RoPE/NoPE models (the mean embedding at P0 looks diluted). The position
    embedding is a candidate by default when the model has learned positions.
    """
    pos_classes: list[Any] = as_list("candidate_nodes", "positions", positions) + ([REST] if rest else [])
    if pos_embed is None:
        pos_embed = has_learned_positions(model)
    nodes: list[Node] = []
    has_mlp = BlockShape.of(model).has_mlp
    for p in pos_classes:
        if embed:
            nodes.append(Node(Kind.EMBED, pos=p))
        if pos_embed:
            nodes.append(Node(Kind.POS_EMBED, pos=p))
        for layer in range(model.cfg.n_layers):
            nodes += [Node(Kind.HEAD, layer, h, p) for h in range(model.cfg.n_heads)]
            if has_mlp:
                nodes.append(Node(Kind.MLP, layer, pos=p))
            if resid:
                nodes.append(Node(Kind.RESID, layer, pos=p))
    return nodes


def position_candidates(model: HookedTransformer, positions: str, seq_len: int, nodes: Any = None) -> Any:
    """The nodes a search over prompts of ``seq_len`` tokens patches under ``positions``
    (:data:`p0circuit.core.names.POSITIONS`): ``"split"`` keeps ``nodes`` as given (``None``: the search's own default); ``"each"`` gives every head and
    MLP (and a learned position embedding) at every one of the ``seq_len`` positions, no "rest", and refuses
    ``nodes`` (it chooses them). The one expansion of ``positions="each"``, for ``activation_patch`` and the
    command line's ``discover --positions each``."""
    if positions not in POSITIONS:
        raise BadInputError(f"positions must be 'split' (P0 and the rest) or 'each' (every position), got {positions!r}")
    if positions == "each" and nodes is not None:
        raise BadInputError("positions='each' chooses the candidate nodes; pass it or nodes=[...], not both")
    return candidate_nodes(model, positions=range(seq_len), rest=False) if positions == "each" else nodes


@entry_point
def candidate_neurons(model: HookedTransformer, layers: Iterable[int], positions: Iterable[Any] = (0,)) -> list[Node]:
    """Every neuron of the MLPs of ``layers`` at each position class (``"rest"`` included when named)."""
    layers = as_list("candidate_neurons", "layers", layers)
    positions = as_list("candidate_neurons", "positions", positions)
    bad = [l for l in layers if not (isinstance(l, int) and 0 <= l < model.cfg.n_layers)]
    attn_only = BlockShape.of(model).attn_only
    if bad or attn_only:
        raise BadInputError(f"candidate_neurons: layers {bad or layers} are not MLP layers of this model "
                            f"(0..{model.cfg.n_layers - 1}{', attention-only' if attn_only else ''})")
    return [Node(Kind.NEURON, l, pos=p, neuron=n) for l in layers for p in positions for n in range(model.cfg.d_mlp)]


def named_positions(nodes: Iterable[Node]) -> list[int]:
    """The named positions of ``nodes`` (``"rest"`` is every other one); ``[0]`` when none is named."""
    return sorted({n.pos for n in nodes if n.pos != REST}) or [0]  # type: ignore[type-var]
