"""The cone model (docs/science.md, claim 3) and its check on a model's layer-0 attention output.

Value vectors ``v_i = mu u + s_i`` (``s_i`` orthogonal to ``u``, zero mean, ``E||s_i||^2 =
sigma^2``) averaged uniformly under the causal mask give ``E||o_t||^2 = mu^2 + sigma^2/(t+1)``:
largest at position 0, and the direction of ``o_t`` converges to ``u``.

* :func:`cone_expected_sq_norm`: the closed form;
* :func:`cone_monte_carlo`: a simulation of it (mean squared norm and cosine to ``u`` per position,
  with standard errors);
* :func:`measure_attention_output`: per-position mean squared norm of a layer's attention output
  (or one head's) and its cosine to the mean direction;
* :func:`fit_cone`: least squares of ``||o_t||^2`` on ``1/(t+1)``: intercept ``mu^2``, slope
  ``sigma^2``, with R^2.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.figures.plotting import finish, new_figure
from p0circuit.models.checks import check_block, check_model
from p0circuit.models.tokens import check_tokens


@entry_point
def cone_expected_sq_norm(mu: float, sigma: float, n_pos: int) -> np.ndarray:
    """``mu^2 + sigma^2/(t+1)`` for t = 0..n_pos-1."""
    if n_pos < 1 or sigma < 0:
        raise BadInputError(f"cone_expected_sq_norm: n_pos={n_pos!r} must be >= 1 (positions) and sigma={sigma!r} >= 0 "
                            "(a size)")
    t = np.arange(n_pos)
    return mu**2 + sigma**2 / (t + 1)


@dataclass
class ConeCurve:
    """Per-position statistics of attention outputs."""

    sq_norm: np.ndarray
    """Mean ||o_t||^2 per position."""
    sq_norm_se: np.ndarray
    """Standard error of that mean."""
    cos_u: np.ndarray
    """Mean cosine of o_t with the shared direction u (or the mean output direction)."""


@entry_point
def cone_monte_carlo(mu: float, sigma: float, d: int, n_pos: int, n: int = 2000, seed: int = 0) -> ConeCurve:
    """Simulate the cone model: ``s_i ~ N(0, sigma^2/(d-1) I)`` orthogonal to ``u = e_0``."""
    if d < 2 or n_pos < 1 or n < 2 or sigma < 0:
        raise BadInputError(f"cone_monte_carlo needs d >= 2, n_pos >= 1, n >= 2 samples and sigma >= 0, got d={d!r}, "
                            f"n_pos={n_pos!r}, n={n!r}, sigma={sigma!r}")
    if d * n_pos * n > 10**9:
        raise BadInputError(f"cone_monte_carlo: d x n_pos x n = {d * n_pos * n:.3g} values to draw, more than 10**9: pass "
                            "fewer samples (n) or positions")
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(n, n_pos, d, generator=gen, dtype=torch.float64) * sigma / math.sqrt(d - 1)
    s[..., 0] = 0.0
    v = s.clone()
    v[..., 0] = mu
    o = v.cumsum(1) / torch.arange(1, n_pos + 1, dtype=torch.float64)[None, :, None]  # uniform causal average
    sq = o.pow(2).sum(-1)  # (n, T)
    cos = o[..., 0] / o.norm(dim=-1)
    return ConeCurve(sq.mean(0).numpy(), (sq.std(0) / math.sqrt(n)).numpy(), cos.mean(0).numpy())


@dataclass
class ConeFit:
    """Least-squares fit of ``||o_t||^2 = mu^2 + sigma^2/(t+1)``."""

    mu: float
    """Fitted shared component (sqrt of the intercept, 0 if negative)."""
    sigma: float
    """Fitted token-specific size (sqrt of the slope, 0 if negative)."""
    r2: float
    """Coefficient of determination of the fit."""
    curve: ConeCurve
    """The measured curve that was fitted."""

    def plot(self, path: Optional[Union[str, Path]] = None) -> Any:
        """Measured and fitted ||o_t||^2, and cosine to the shared direction, against position."""
        t = np.arange(len(self.curve.sq_norm))
        fig, (ax1, ax2) = new_figure(2)
        ax1.errorbar(t, self.curve.sq_norm, yerr=self.curve.sq_norm_se, fmt="o", ms=3, label="measured")
        ax1.plot(t, cone_expected_sq_norm(self.mu, self.sigma, len(t)), label=f"fit mu={self.mu:.2f} sigma={self.sigma:.2f}")
        ax1.set(xlabel="position t", ylabel="mean ||o_t||^2", title=f"cone model (R^2={self.r2:.3f})")
        ax1.legend()
        ax2.plot(t, self.curve.cos_u, marker="o", ms=3)
        ax2.set(xlabel="position t", ylabel="cos(o_t, u)", title="direction of o_t", ylim=(0, 1.05))
        return finish(fig, path)


@entry_point
def fit_cone(curve: ConeCurve) -> ConeFit:
    """Fit ``mu^2 + sigma^2 x`` with ``x = 1/(t+1)`` by ordinary least squares."""
    y = np.asarray(curve.sq_norm, dtype=np.float64)
    if y.ndim != 1 or not np.isfinite(y).all():
        raise BadInputError(f"fit_cone: curve.sq_norm must be a 1-D array of finite numbers, got shape {y.shape}; pass "
                            "the ConeCurve measure_attention_output or cone_monte_carlo returns")
    if len(y) < 3:
        raise BadInputError("fitting the cone model needs at least 3 positions")
    x = 1.0 / (np.arange(len(y)) + 1.0)
    slope, intercept = np.polyfit(x, y, 1)
    pred = intercept + slope * x
    ss_res, ss_tot = float(((y - pred) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return ConeFit(math.sqrt(max(intercept, 0.0)), math.sqrt(max(slope, 0.0)), r2, curve)


@entry_point
@torch.no_grad()
def measure_attention_output(model: Any, tokens: Tensor, layer: int = 0, head: Optional[int] = None) -> ConeCurve:
    """Per-position ||o_t||^2 of ``layer``'s attention output (one head's with ``head``)."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=3)
    check_block(model, layer, "measure_attention_output")
    if head is not None and not 0 <= head < model.cfg.n_heads:
        raise BadInputError(f"measure_attention_output: head={head!r} must be None (the whole attention output) or a "
                            f"head of block {layer} in 0..{model.cfg.n_heads - 1}")
    if head is None:
        _, cache = model.run_with_cache(tokens, names_filter=hooks.attn_out(layer))
        o = cache[hooks.attn_out(layer)].double()
    else:
        _, cache = model.run_with_cache(tokens, names_filter=hooks.head_z(layer))
        z = cache[hooks.head_z(layer)][:, :, head].double()
        o = z @ model.blocks[layer].attn.W_O[head].double()  # (B, T, d_head) x (d_head, d) -> (B, T, d)
    sq = o.pow(2).sum(-1)  # (B, T)
    u = torch.nn.functional.normalize(o.mean(dim=(0, 1)), dim=0)
    cos = (o @ u) / o.norm(dim=-1).clamp_min(1e-12)
    n = tokens.shape[0]
    se = sq.std(0) / math.sqrt(n) if n > 1 else torch.zeros_like(sq[0])
    return ConeCurve(sq.mean(0).numpy(), se.numpy(), cos.mean(0).numpy())
