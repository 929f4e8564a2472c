"""Norm metrics of the residual stream at position 0.

* Norm ratio (Gu et al.; Sun et al., "Massive Activations"): ``||h_0|| / mean_{t>0} ||h_t||``.
* Direction stability: mean pairwise cosine similarity of ``h_0`` across prompts (near 1 when the
  sink state sits in a fixed direction).
* Massive activations: coordinates of ``h_0`` whose magnitude is at least ``ratio`` times the
  typical magnitude of one coordinate elsewhere, defined here as the mean over positions t > 0 of
  the RMS of ``h_t`` (Sun et al. compare with the median magnitude; in sparse residual streams,
  like the planted model's, the median is 0, so the RMS is used instead).
"""

import math

import torch
from jaxtyping import Float
from torch import Tensor

from p0circuit.core.args import entry_point, finite
from p0circuit.core.defaults import MASSIVE_RATIO
from p0circuit.core.errors import BadInputError


def _need_rest(x: Tensor, where: str = "h", pos: int = 0) -> None:
    """Refuse states with no position besides ``pos`` to compare it with, or no ``pos`` at all."""
    if x.shape[-2] < 2:
        raise BadInputError(
            f"{where}: sequence length {x.shape[-2]} has no positions t > 0 to compare position 0 with; "
            "use prompts of at least 2 tokens"
        )
    if not 0 <= pos < x.shape[-2]:
        raise BadInputError(f"{where}: pos={pos!r} is outside the states' positions 0..{x.shape[-2] - 1}")


@entry_point
def norm_ratio(h: Float[Tensor, "*batch pos d_model"], pos: int = 0) -> Float[Tensor, "*batch"]:
    """``||h_pos|| / mean_{t != pos} ||h_t||`` per sequence (NaN where all other norms are 0)."""
    _need_rest(finite("norm_ratio", "h", h), "norm_ratio", pos)
    norms = h.float().norm(dim=-1)  # (*B, T)
    others = torch.cat([norms[..., :pos], norms[..., pos + 1:]], dim=-1).mean(-1)
    ratio = norms[..., pos] / others
    return torch.where(others > 0, ratio, torch.full_like(ratio, math.nan))


@entry_point
def direction_stability(h0: Float[Tensor, "batch d_model"]) -> Float[Tensor, ""]:
    """Mean pairwise cosine similarity of ``h_0`` across the prompts of a batch (needs >= 2)."""
    finite("direction_stability", "h0", h0)
    n = h0.shape[0]
    if n < 2:
        raise BadInputError(f"direction_stability: h0 holds {n} prompt(s); direction stability compares prompts with "
                            "each other: pass at least 2 prompts")
    unit = torch.nn.functional.normalize(h0.float(), dim=-1)
    gram = unit @ unit.T  # (B, d) x (d, B) -> (B, B)
    return (gram.sum() - gram.diagonal().sum()) / (n * (n - 1))


def direction_stability_ordinary(h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, ""]:
    """The baseline of :func:`direction_stability`: its value for the state at each position t > 0 (across prompts),
    averaged over those positions: how alike ordinary states are across prompts anyway."""
    n = h.shape[0]
    if n < 2 or h.shape[1] < 2:
        raise BadInputError("the ordinary positions' direction stability needs at least 2 prompts of 2 tokens")
    unit = torch.nn.functional.normalize(h[:, 1:].float(), dim=-1).transpose(0, 1)  # (T-1, B, d)
    gram = unit @ unit.transpose(1, 2)  # (T-1, B, d) x (T-1, d, B) -> (T-1, B, B)
    off = gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    return (off / (n * (n - 1))).mean()


def direction_to(h0: Float[Tensor, "layer batch d_model"], ref: int) -> Float[Tensor, "layer"]:
    """Per layer, the cosine between the prompts' mean direction of ``h_0`` (the mean of the unit vectors) and that
    mean direction at layer ``ref``: how far the state turns from where it formed."""
    mean = torch.nn.functional.normalize(torch.nn.functional.normalize(h0.float(), dim=-1).mean(1), dim=-1)  # (L, d)
    return mean @ mean[ref]  # (L, d) x (d,) -> (L,)


@entry_point
def massive_activations(
    h: Float[Tensor, "batch pos d_model"], ratio: float = MASSIVE_RATIO, pos: int = 0
) -> list[tuple[int, float, float]]:
    """Coordinates of ``h_pos`` that are massive: ``(dim, mean value, mean ratio to the typical scale)``.

    A coordinate qualifies when its mean absolute value over the batch at ``pos`` is at least
    ``ratio`` times the mean RMS of ``h_t`` over the ordinary positions: every t != pos, and for a
    position other than 0 also t != 0 (position 0 is a sink state of its own in most models, and its
    norm would set the scale of a state elsewhere).
    """
    _need_rest(finite("massive_activations", "h", h), "massive_activations", pos)
    if not ratio > 0:
        raise BadInputError(f"massive_activations: ratio={ratio!r} must be > 0 (a coordinate is massive at ratio times "
                            "the typical scale)")
    h = h.float()
    rms = h.pow(2).mean(-1).sqrt()  # (B, T)
    keep = [t for t in range(h.shape[1]) if t != pos and (pos == 0 or t != 0 or h.shape[1] == 2)]
    scale = rms[:, keep].mean()
    if scale == 0:
        return []
    at = h[:, pos]  # (B, d)
    rel = at.abs().mean(0) / scale
    dims = torch.nonzero(rel >= ratio).flatten().tolist()
    dims.sort(key=lambda d: -float(rel[d]))
    return [(int(d), float(at[:, d].mean()), float(rel[d])) for d in dims]


@entry_point
def first_layer_at_least(values: Float[Tensor, " layer"], threshold: float) -> int | None:
    """Index of the first entry ``>= threshold`` (NaN never qualifies), or None."""
    hits = torch.nonzero(values >= threshold).flatten()
    return int(hits[0]) if len(hits) else None
