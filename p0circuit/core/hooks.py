"""Every TransformerLens hook name p0circuit uses is spelled here and nowhere else.

Other modules ask for names through these functions, so a change of naming in TransformerLens
is a change to this file alone. Layer numbers are never parsed out of strings.
"""

OBSERVES = "_p0circuit_observes"
"""An attribute p0circuit sets on a module hook of its own that changes no tensor (the work counter,
``patching/work.py``; the thread policy's look before a forward, ``core/threads.py``): it fires the same on
any path and is not a user's hook, so the fast path's check for the user's hooks passes it."""

EMBED = "hook_embed"
POS_EMBED = "hook_pos_embed"


def resid_pre(layer: int) -> str:
    """Residual stream entering block ``layer``."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid(layer: int) -> str:
    """Residual stream between attention and MLP of block ``layer`` (absent with parallel blocks)."""
    return f"blocks.{layer}.hook_resid_mid"


def resid_post(layer: int) -> str:
    """Residual stream leaving block ``layer``."""
    return f"blocks.{layer}.hook_resid_post"


def attn_out(layer: int) -> str:
    """Summed output of all heads of block ``layer`` (after W_O, with b_O)."""
    return f"blocks.{layer}.hook_attn_out"


def head_z(layer: int) -> str:
    """Per-head attention output before W_O: ``[batch, pos, head, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"


def head_result(layer: int) -> str:
    """Per-head output after W_O (needs ``use_attn_result``): ``[batch, pos, head, d_model]``."""
    return f"blocks.{layer}.attn.hook_result"


def pattern(layer: int) -> str:
    """Attention pattern ``[batch, head, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def head_input(layer: int, which: str) -> str:
    """Per-head query/key/value input (needs ``use_split_qkv_input``); ``which`` in q, k, v."""
    if which not in ("q", "k", "v"):
        raise ValueError(f"which must be 'q', 'k' or 'v', got {which!r}")
    return f"blocks.{layer}.hook_{which}_input"


def head_vector(layer: int, which: str) -> str:
    """Per-head query/key/value vectors ``[batch, pos, head, d_head]``; ``which`` in q, k, v."""
    if which not in ("q", "k", "v"):
        raise ValueError(f"which must be 'q', 'k' or 'v', got {which!r}")
    return f"blocks.{layer}.attn.hook_{which}"


def kv_entry(layer: int, which: str) -> str:
    """Not a hook: the cache key under which :func:`p0circuit.patching.engine.cache_run` keeps the
    keys (``which="k"``) or values (``"v"``) that block ``layer``'s attention appends to
    TransformerLens' key-value cache, ``[batch, pos, kv_head, d_head]``: after QK-norm and qkv
    clipping, before rotary (what ``hook_k`` does not hold on QK-norm or clipped models)."""
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', got {which!r}")
    return f"blocks.{layer}.attn.kv_cache_{which}"


def position_axis(name: str) -> int:
    """Axis of a hook's activation that runs over (query) positions: 2 for attention patterns and
    scores ``[batch, head, query, key]``, 1 for everything else."""
    return 2 if name.endswith(("attn.hook_pattern", "attn.hook_attn_scores")) else 1


def mlp_in(layer: int) -> str:
    """Input of the MLP of block ``layer`` before its norm (needs ``use_hook_mlp_in``)."""
    return f"blocks.{layer}.hook_mlp_in"


def mlp_post(layer: int) -> str:
    """MLP neuron activations of block ``layer``: ``[batch, pos, d_mlp]``."""
    return f"blocks.{layer}.mlp.hook_post"


def mlp_out(layer: int) -> str:
    """Output of the MLP of block ``layer``: ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_mlp_out"


def ln_scale(layer: int, which: str) -> str:
    """Normalization scale of ``ln1`` or ``ln2`` in block ``layer``."""
    return f"blocks.{layer}.{which}.hook_scale"


EMBED_LAYER = -1
"""Pseudo block index of hooks computed before block 0 (embeddings); hooks after the last block
(``ln_final``, the unembedding) take the block count, ``n_layers``."""


class HookRef(tuple):
    """A hook name with the block index that computes it (``-1`` for embeddings).

    Patching starts forwards at a block from a cached residual stream; hooks of earlier blocks are
    then read from the cache, so every hook a metric needs is named together with its block.
    """

    __slots__ = ()

    def __new__(cls, layer: int, name: str) -> "HookRef":
        return super().__new__(cls, (layer, name))

    @property
    def layer(self) -> int:
        """Block index computing the hook."""
        return self[0]

    @property
    def name(self) -> str:
        """TransformerLens hook name."""
        return self[1]
