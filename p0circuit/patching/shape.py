"""What a transformer block of the model is made of, read from its configuration in one place.

The engine, the edges, the sites, the metrics' advice and the work count each depend on a few facts about a
block: whether attention and MLP read the same residual stream (GPT-J, NeoX: parallel), whether there is an MLP
at all, whether a norm follows each sublayer's output (Gemma 2/3 around it, OLMo 2/3 instead of before it), how
many experts an MLP has and how many key/value heads the queries share. :meth:`BlockShape.of` reads them from
``model.cfg``; every other patching module asks it (``tests/test_design.py`` holds that by AST), so a new
architecture feature is added here once.
"""

from dataclasses import dataclass
from typing import Any

from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from transformer_lens import HookedTransformerConfig

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError

POST_NORM = tuple(POST_NORM_ARCHITECTURES)
"""Architectures whose blocks normalize each sublayer's output instead of its input (TransformerLens' list)."""


@dataclass(frozen=True)
class BlockShape:
    """The shape of the model's blocks (every block alike)."""

    n_layers: int
    """Blocks."""
    n_heads: int
    """Query heads per block."""
    kv_heads: int
    """Key/value heads per block: fewer than the query heads under grouped-query attention (unless ungrouped)."""
    kv_weights: int
    """Key/value projections per block as the weights hold them (grouped, whether or not TransformerLens ungroups
    them at run time): what the work count multiplies."""
    parallel: bool
    """Attention and MLP read the same residual stream (``resid_pre``): the MLP does not see the block's heads."""
    attn_only: bool
    """No MLPs."""
    norms_around: bool
    """A norm before and after each sublayer (Gemma 2/3's ``ln1_post``/``ln2_post``)."""
    post_norm: bool
    """A norm after each sublayer instead of before it (OLMo 2/3's ``ln1``/``ln2``)."""
    experts: int
    """Experts per MLP (0: a dense MLP)."""
    experts_per_token: int
    """Experts each token is routed to (1 for a dense MLP)."""
    gated: bool
    """The MLP is gated (three matrices, not two)."""

    @classmethod
    def of(cls, model: Any) -> "BlockShape":
        """The shape of ``model``'s blocks, from ``model.cfg``."""
        cfg = getattr(model, "cfg", None)
        if not isinstance(cfg, HookedTransformerConfig):
            raise BadInputError(f"BlockShape.of takes a HookedTransformer (its .cfg is read), got "
                                f"{type(model).__name__}: load or wrap the model first (p0circuit.load_model)")
        n_kv = cfg.n_key_value_heads
        return cls(n_layers=int(cfg.n_layers), n_heads=int(cfg.n_heads),
                   kv_heads=int(cfg.n_heads if n_kv is None or cfg.ungroup_grouped_query_attention else n_kv),
                   kv_weights=int(n_kv or cfg.n_heads),
                   parallel=bool(cfg.parallel_attn_mlp), attn_only=bool(cfg.attn_only),
                   norms_around=bool(cfg.use_normalization_before_and_after),
                   post_norm=cfg.original_architecture in POST_NORM, experts=int(cfg.num_experts or 0),
                   experts_per_token=max(1, int(cfg.experts_per_token or 1)), gated=bool(cfg.gated_mlp))

    @property
    def has_mlp(self) -> bool:
        return not self.attn_only

    @property
    def mlp_sees_heads(self) -> bool:
        """Whether a head's change reaches its own block's MLP (not in parallel or attention-only blocks)."""
        return not (self.parallel or self.attn_only)

    def mlp_input(self, layer: Any) -> str:  # (checked here: a p0circuit error names the blocks)
        """The residual stream block ``layer``'s MLP reads (before its norm): ``resid_mid``, or ``resid_pre`` in
        parallel blocks."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise BadInputError(f"mlp_input: layer={layer!r:.40} must be a block of this model, 0..{self.n_layers - 1}")
        return hooks.resid_pre(layer) if self.parallel else hooks.resid_mid(layer)
