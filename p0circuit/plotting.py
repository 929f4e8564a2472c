"""Figure helpers shared by the experiments, the tracker and the sweep report: matplotlib figures,
saved as PNG on request."""

from pathlib import Path
from typing import Any, Optional, Union

import matplotlib.pyplot as plt  # the user's backend is left alone: inline in Jupyter, Agg without a display


def new_figure(n_axes: int = 1, width: float = 5.0, height: float = 3.5) -> tuple[Any, list[Any]]:
    """A figure with ``n_axes`` side by side."""
    fig, axes = plt.subplots(1, n_axes, figsize=(width * n_axes, height), squeeze=False)
    return fig, list(axes[0])


def finish(fig: Any, path: Optional[Union[str, Path]] = None) -> Any:
    """Tighten the layout, save to ``path`` (PNG) when given, and return the figure."""
    fig.tight_layout()
    if path is not None:
        fig.savefig(str(path), dpi=100)
        plt.close(fig)
    return fig


def plot(result: Any, ax: Any = None, top: int = 20) -> Any:
    """A heatmap of a patching result's normalized effects, in the layout a TransformerLens user
    expects: for nodes, heads as layer x head (summed over the position classes) beside MLP outputs as
    layer x position; for edges, a sender x receiver matrix; for neurons, the ``top`` largest as bars.
    Red raises the metric, blue lowers it. Returns the figure (``p0.plot(result).savefig(path)``)."""
    import math

    import numpy as np

    from p0circuit.types import Edge, Kind  # floor 2: the result's own types

    items = result.parsed()
    finite = {n: v for n, v in result.normalized.items() if isinstance(v, float) and math.isfinite(v)}
    if result.level == "edge":
        senders = sorted({e.src.name for e in items if isinstance(e, Edge)})
        receivers = sorted({f"{e.dst.name}.{e.input.value}" for e in items if isinstance(e, Edge)})
        grid = np.full((len(senders), len(receivers)), np.nan)
        for e in items:
            grid[senders.index(e.src.name), receivers.index(f"{e.dst.name}.{e.input.value}")] = finite.get(e.name, np.nan)
        fig, axes = new_figure(1, width=max(5.0, 0.35 * len(receivers) + 2), height=max(3.0, 0.3 * len(senders) + 1.5))
        _heat(axes[0], grid, receivers, senders, f"edges: {result.metric}", ylabel="sender")
        return finish(fig)
    neurons = [n for n in items if n.kind == Kind.NEURON]
    if neurons:
        ranked = sorted((n for n in neurons if n.name in finite), key=lambda n: -abs(finite[n.name]))[:top]
        fig, axes = new_figure(1, width=6, height=max(3.0, 0.25 * len(ranked) + 1))
        values = [finite[n.name] for n in ranked]
        axes[0].barh(range(len(ranked)), values, color=["#b2182b" if v > 0 else "#2166ac" for v in values])
        axes[0].set_yticks(range(len(ranked)), [n.name for n in ranked], fontsize=7)
        axes[0].invert_yaxis()
        axes[0].set(xlabel="normalized effect", title=f"strongest neurons: {result.metric}")
        return finish(fig)
    heads = result.to_tensor("head").numpy()  # (layer, pos, head)
    has_mlp = any(n.kind == Kind.MLP for n in items)
    fig, axes = new_figure(2 if has_mlp else 1)
    with np.errstate(invalid="ignore"):
        summed = np.where(np.isnan(heads).all(1), np.nan, np.nansum(heads, axis=1))
    _heat(axes[0], summed, [f"H{h}" for h in range(heads.shape[2])], [str(l) for l in range(heads.shape[0])],
          "heads (summed over positions)")
    if has_mlp:
        mlp = result.to_tensor("mlp").numpy()
        _heat(axes[1], mlp, [str(p) for p in result.positions], [str(l) for l in range(mlp.shape[0])],
              "MLP outputs by position")
    fig.suptitle(f"{result.method} patching, {result.corruption}, {result.metric}", fontsize=9)
    return finish(fig)


def _heat(ax: Any, grid: Any, xlabels: list, ylabels: list, title: str, ylabel: str = "layer") -> None:
    import numpy as np

    bound = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-bound, vmax=bound)
    ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7, rotation=90 if len(xlabels) > 12 else 0)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.figure.colorbar(im, ax=ax)
