"""Weight layout for fast small forwards, values unchanged.

TransformerLens' gated MLP and unembedding call ``F.linear(x, W.T.contiguous())`` on every
forward, which copies the whole weight each time (for SmolLM2 the unembedding alone is 113 MB per
call). Patching runs many small forwards, so those copies dominate. :func:`linear_layout` stores
each such weight as the transpose of a contiguous tensor: ``W.T`` is then already contiguous, the
copy is a no-op, and every value, shape and result is bitwise the same.
"""

import torch
from transformer_lens import HookedTransformer
from transformer_lens.components.mlps.gated_mlp import GatedMLP


def _relayout(module: torch.nn.Module, name: str) -> None:
    param = getattr(module, name)
    if param.T.is_contiguous():
        return
    setattr(module, name, torch.nn.Parameter(param.detach().T.contiguous().T, requires_grad=param.requires_grad))


def linear_layout(model: HookedTransformer) -> HookedTransformer:
    """Lay out the gated MLPs' and the unembedding's weights as ``F.linear`` wants them (in place)."""
    for block in model.blocks:
        if isinstance(block.mlp, GatedMLP):
            for name in ("W_gate", "W_in", "W_out"):
                _relayout(block.mlp, name)
    _relayout(model.unembed, "W_U")
    return model
