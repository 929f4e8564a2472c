"""Attention-sink metrics (Gu et al., ICLR 2025, "When Attention Sink Emerges").

For a head (l, h) and key position k, with T positions (0-based),
``alpha_k^{l,h} = 1/(T-k) * sum_{t=k}^{T-1} A^{l,h}[t, k]``: the mean attention that the
queries able to see k put on it. ``Sink_k^eps`` is the share of (layer, head) pairs with
``alpha_k > eps``, computed per sequence and averaged over sequences (eps = 0.3 in their tables).
"""

import torch
from jaxtyping import Float
from torch import Tensor

from p0circuit.core.args import entry_point, finite
from p0circuit.core.defaults import SINK_EPS
from p0circuit.core.errors import BadInputError


@entry_point
def attention_to_position(
    patterns: Float[Tensor, "layer batch head query key"], k: int = 0
) -> Float[Tensor, "batch layer head"]:
    """``alpha_k`` per sequence, layer and head, from stacked attention patterns."""
    finite("attention_to_position", "patterns", patterns)
    n_pos = patterns.shape[-1]
    if patterns.shape[-2] != n_pos:
        raise BadInputError(
            f"attention patterns must be square over positions, got query x key = "
            f"{patterns.shape[-2]} x {n_pos}; pass patterns from a run without a KV cache"
        )
    if not 0 <= k < n_pos:
        raise BadInputError(f"position k={k} is outside 0..{n_pos - 1} for sequences of length {n_pos}")
    column = patterns[..., k:, k]  # (L, B, H, T-k): attention of queries t >= k to key k
    return column.mean(-1).permute(1, 0, 2)  # (L, B, H) -> (B, L, H)


@entry_point
def sink_rate(alpha: Float[Tensor, "batch layer head"], eps: float = SINK_EPS) -> Float[Tensor, ""]:
    """``Sink_k^eps``: share of (layer, head) pairs with ``alpha_k > eps``, averaged over sequences."""
    _check_alpha("sink_rate", alpha, eps)
    return (alpha > eps).float().mean(dim=(1, 2)).mean()


@entry_point
def sink_rate_per_layer(alpha: Float[Tensor, "batch layer head"], eps: float = SINK_EPS) -> Float[Tensor, " layer"]:
    """Share of heads with ``alpha_k > eps`` in each layer, averaged over sequences."""
    _check_alpha("sink_rate_per_layer", alpha, eps)
    return (alpha > eps).float().mean(dim=2).mean(dim=0)


def _check_alpha(where: str, alpha: Tensor, eps: float) -> None:
    """Refuse attention shares that are not shares (NaN, inf, outside [0, 1]), an empty batch, or an ``eps`` of 1."""
    finite(where, "alpha", alpha)
    if alpha.numel() == 0 or float(alpha.min()) < 0 or float(alpha.max()) > 1 + 1e-6:
        raise BadInputError(f"{where}: alpha must hold attention shares in [0, 1] for at least one prompt, layer and "
                            f"head, got shape {tuple(alpha.shape)}; pass attention_to_position's output")
    if not 0.0 <= eps < 1.0:
        raise BadInputError(f"{where}: eps={eps!r} must lie in [0, 1) (a head is a sink when alpha > eps)")


@entry_point
def argmax_sink_position(
    patterns: Float[Tensor, "layer batch head query key"], max_pos: int = 16
) -> tuple[int, Float[Tensor, " k"]]:
    """The key position among the first ``max_pos`` (and the first half of the sequence) with the
    highest mean ``alpha_k`` over layers, heads and sequences, and that mean for every candidate.

    Late positions are excluded because ``alpha_k`` of the last positions averages over very few
    queries (``alpha_{T-1}`` is one entry, the last token's attention to itself).
    """
    if max_pos < 1:
        raise BadInputError(f"argmax_sink_position: max_pos={max_pos!r} must be >= 1 (the candidate positions)")
    n_pos = patterns.shape[-1]
    n_cand = max(1, min(max_pos, (n_pos + 1) // 2))
    means = torch.stack([attention_to_position(patterns, k).mean() for k in range(n_cand)])
    return int(means.argmax()), means
