"""Spread over prompts: bootstrap intervals for means and ratios of means of per-prompt values.

A mean over 8 prompts carries no spread. :func:`share_interval` is the 95% Wilson interval of a share counted over a
random sample (a sampled vocabulary's tokens that become sink states). :func:`interval` resamples the prompts with replacement (``n`` times,
seeded) and returns the 2.5% and 97.5% quantiles of the statistic: for a mean, of the resampled means; for a
share of a change (faithfulness, an effect), of the ratio of the resampled means, which stays finite where a
single prompt's own change is small (the per-prompt ratio can explode there). :func:`cosine_interval` does the
same for a mean pairwise cosine, leaving out the pairs a resample draws twice from one prompt.
"""

from typing import Callable, Sequence

import torch
from torch import Tensor

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError

RESAMPLES = 1000
"""Bootstrap resamples per interval."""
CHUNK = 50
"""Resamples of a pairwise-cosine interval computed at once."""


Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


@entry_point
def share_interval(hits: int, draws: int) -> tuple[float, float]:
    """The 95% Wilson score interval of the share ``hits / draws`` of a random sample (Wilson, 1927): it stays inside
    [0, 1] and keeps its width where the share is near 0 or 1, where the normal approximation collapses to a point."""
    if draws < 1:
        raise BadInputError(f"share_interval: draws={draws!r} must be a whole number >= 1 (the sample's size)")
    if hits < 0:
        raise BadInputError(f"share_interval: hits={hits!r} must be a whole number >= 0")
    if hits > draws:
        raise BadInputError(f"share_interval: needs 0 <= hits <= draws and draws >= 1, got hits={hits}, draws={draws}")
    n = draws
    p, z2 = hits / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5 / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _draws(n: int, resamples: int, seed: int) -> Tensor:
    if n < 2:
        raise BadInputError(f"an interval over prompts needs at least 2 prompts, got {n}")
    if resamples < 10:
        raise BadInputError(f"an interval needs at least 10 resamples, got {resamples}")
    return torch.randint(0, n, (resamples, n), generator=torch.Generator().manual_seed(seed))


def interval(values: Sequence[Tensor], stat: Callable[..., Tensor] = lambda x: x, resamples: int = RESAMPLES,
             seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of ``stat(mean of values[0], mean of values[1], ...)`` over prompts: each tensor
    holds one value per prompt (the same prompts, in the same order)."""
    columns = [torch.as_tensor(v, dtype=torch.float64).flatten() for v in values]
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise BadInputError("an interval's per-prompt values must have one value per prompt each")
    idx = _draws(n, resamples, seed)
    stats = stat(*(c[idx].mean(1) for c in columns))  # (resamples,)
    stats = stats[torch.isfinite(stats)]
    if not len(stats):
        return float("nan"), float("nan")
    low, high = torch.quantile(stats, torch.tensor([0.025, 0.975], dtype=stats.dtype))
    return float(low), float(high)


def cosine_interval(vectors: Tensor, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of the mean pairwise cosine of ``vectors`` ``[prompts, d]`` (pairs of one prompt
    with itself left out)."""
    unit = torch.nn.functional.normalize(vectors.double(), dim=-1)
    gram = unit @ unit.T  # (n, d) x (d, n) -> (n, n)
    idx = _draws(len(vectors), resamples, seed)  # (R, n)
    stats = []
    for part in idx.split(CHUNK):  # (r, n): a few resamples at a time, so memory stays small at any n
        pairs = gram[part[:, :, None], part[:, None, :]]  # (r, n, n)
        keep = part[:, :, None] != part[:, None, :]
        count = keep.sum((1, 2))
        stats.append(((pairs * keep).sum((1, 2)) / count.clamp(min=1))[count > 0])  # a resample of one prompt: no pair
    stats = torch.cat(stats)
    low, high = torch.quantile(stats, torch.tensor([0.025, 0.975], dtype=stats.dtype))
    return float(low), float(high)
