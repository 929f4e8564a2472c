"""Direction and stabilization of the sink state (docs/science.md, claim 2, "stabilization").

* :func:`direction_by_layer`: mean pairwise cosine of ``h_0`` across prompts, per layer, next to
  the same quantity for a later position.
* :func:`stabilization`: under pre-norm each sublayer reads ``h / ||h||``. Add a random update
  of fixed norm ``delta`` to the residual stream after each layer and measure how much the
  normalized direction moves (``1 - cos(h, h + d)``), at P0 and at the other positions. The
  paper's argument predicts a change smaller by about ``(||h_t|| / ||h_0||)^2`` at P0.
"""

from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.core.io import out_file
from p0circuit.figures.plotting import check_frame, finish, new_figure
from p0circuit.measures.norms import direction_stability
from p0circuit.models.tokens import check_tokens


def _resid(model: Any, tokens: Tensor) -> Tensor:
    names = [hooks.resid_post(l) for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in set(names))
    return torch.stack([cache[n] for n in names]).double()  # (L, B, T, d)


@entry_point
def direction_by_layer(model: Any, tokens: Tensor, other: int = -1) -> pd.DataFrame:
    """Per layer: cosine of h_0 across prompts and of h_other (default the last position)."""
    tokens = check_tokens(model, tokens, min_len=2)
    if tokens.shape[0] < 2:
        raise BadInputError("direction stability compares prompts: pass at least 2 prompts")
    h = _resid(model, tokens)
    rows = [{"layer": l, "cos_h0": float(direction_stability(h[l, :, 0])),
             "cos_h_other": float(direction_stability(h[l, :, other]))} for l in range(h.shape[0])]
    return pd.DataFrame(rows).set_index("layer")


@entry_point
def stabilization(model: Any, tokens: Tensor, delta: float = 1.0, n_draws: int = 8, seed: int = 0) -> pd.DataFrame:
    """Per layer: mean ``1 - cos(h, h + d)`` for random ``d`` with ``||d|| = delta``, at P0 and elsewhere."""
    tokens = check_tokens(model, tokens, min_len=2)
    if delta <= 0 or n_draws < 1:
        raise BadInputError("stabilization needs delta > 0 and n_draws >= 1")
    h = _resid(model, tokens)  # (L, B, T, d)
    gen = torch.Generator().manual_seed(seed)
    changes = []
    for _ in range(n_draws):
        d = torch.randn(h.shape, generator=gen, dtype=torch.float64)
        d = delta * d / d.norm(dim=-1, keepdim=True)
        changes.append(1 - torch.nn.functional.cosine_similarity(h, h + d, dim=-1))
    change = torch.stack(changes).mean(0)  # (L, B, T)
    rows = []
    for l in range(h.shape[0]):
        p0_change = float(change[l, :, 0].mean())
        rest = float(change[l, :, 1:].mean())
        rows.append({"layer": l, "change_p0": p0_change, "change_rest": rest,
                     "ratio_p0_to_rest": p0_change / rest if rest > 0 else float("nan")})
    return pd.DataFrame(rows).set_index("layer")


@entry_point
def plot_stabilization(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Any:
    """Direction change per layer at P0 and elsewhere (log scale)."""
    check_frame("plot_stabilization", frame, ("change_p0", "change_rest"), "stabilization(model, tokens)")
    if path is not None:
        out_file("plot_stabilization", path)
    fig, (ax,) = new_figure(1)
    ax.plot(frame.index, frame["change_p0"], marker="o", label="P0")
    ax.plot(frame.index, frame["change_rest"], marker="o", label="t > 0")
    ax.set(xlabel="layer", ylabel="1 - cos(h, h + d)", yscale="log", title="direction change under a fixed update")
    ax.legend()
    return finish(fig, path)


@entry_point
def plot_direction(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Any:
    """Cosine of h_0 (and of a later position) across prompts, per layer."""
    check_frame("plot_direction", frame, ("cos_h0", "cos_h_other"), "direction_by_layer(model, tokens)")
    if path is not None:
        out_file("plot_direction", path)
    fig, (ax,) = new_figure(1)
    ax.plot(frame.index, frame["cos_h0"], marker="o", label="h_0")
    ax.plot(frame.index, frame["cos_h_other"], marker="o", label="later position")
    ax.set(xlabel="layer", ylabel="mean pairwise cosine across prompts", title="direction stability", ylim=(0, 1.05))
    ax.legend()
    return finish(fig, path)
