"""Figure helpers shared by the experiments, the tracker and the sweep report: matplotlib figures,
saved as PNG on request."""

import math
from pathlib import Path
from typing import Any, Optional, Union

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError
from p0circuit.core.io import out_file
from p0circuit.core.types import Edge, Kind, Node, as_circuit, effect_grid
from p0circuit.figures.colours import EFFECT_CMAP, EFFECT_LABEL

import matplotlib.pyplot as plt  # the user's backend is left alone: inline in Jupyter, Agg without a display


def new_figure(n_axes: int = 1, width: float = 5.0, height: float = 3.5) -> tuple[Any, list[Any]]:
    """A figure with ``n_axes`` side by side."""
    fig, axes = plt.subplots(1, n_axes, figsize=(width * n_axes, height), squeeze=False)
    return fig, list(axes[0])


def finish(fig: Any, path: Optional[Union[str, Path]] = None) -> Any:
    """Tighten the layout, save to ``path`` (PNG) when given, and return the figure, released from
    pyplot: Jupyter then shows it once, as the cell's value (pyplot's end-of-cell display would show
    it a second time), and a loop of figures does not pile up open windows. Show one from a script
    with ``fig.savefig(path)``, or ``IPython.display.display(fig)`` inside a cell."""
    if path is not None:
        out_file("saving a figure", path)
    fig.tight_layout()
    if path is not None:
        fig.savefig(str(path), dpi=100)
    plt.close(fig)
    return fig


def check_frame(where: str, frame: Any, columns: tuple[str, ...], made_by: str) -> None:
    """Refuse a table that is not what ``made_by`` returns: not a pandas DataFrame, without rows, or without one of
    ``columns`` (one ending in ``*`` stands for any column that starts with the rest)."""
    missing = [c for c in columns if not any(k == c or (c.endswith("*") and str(k).startswith(c[:-1]))
                                              for k in frame.columns)]
    if missing or frame.empty:
        raise BadInputError(f"{where}: frame has {'no rows' if frame.empty else f'no column(s) {missing}'}; pass the "
                            f"frame {made_by} returns")


@entry_point
def plot(result: Any, ax: Any = None, top: int = 20) -> Any:
    """A heatmap of the normalized effects of a patching result (or of a :class:`~p0circuit.Circuit`,
    which keeps every candidate's effect, or of any other circuit the package returns, as its
    ``.to_circuit()``), in the layout a TransformerLens user expects: for nodes, heads as layer x head
    (summed over the positions) beside MLP outputs as layer x position; for edges, a sender x receiver
    matrix; for neurons, the ``top`` largest as bars. Red: the component carries the clean-to-corrupted
    change of the metric; blue: it works against it; grey: not patched. Returns the figure
    (``p0.plot(result).savefig(path)``). ``ax``: draw into your own matplotlib Axes instead (one, or a
    list of as many as the result has panels); ``top``: how many neurons the bar chart shows (>= 1)."""
    import math

    import numpy as np


    if hasattr(result, "normalized") and hasattr(result, "parsed"):  # a patching result: every candidate, as it is
        level, values, items, s = result.level, dict(result.normalized), result.parsed(), dict(result.settings)
        s.update(method=result.method, corruption=result.corruption, metric=result.metric)
    else:  # any other circuit the package returns, as its .to_circuit()
        circuit = as_circuit(result, "plot", "result")
        level, values = circuit.level, dict(circuit.edge_effects if circuit.level == "edge" else circuit.node_effects)
        items = [(Edge if level == "edge" else Node).parse(n) for n in values]
        s = circuit.settings
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise BadInputError(f"plot: top={top!r} must be an integer >= 1 (how many neurons the bar chart shows)")
    if not values:
        raise BadInputError(f"plot: the {type(result).__name__} carries no effects to draw (a circuit made by hand, or "
                            "one without its candidates' effects): plot a patching result, or a circuit that discover "
                            "or Circuit.from_json gave with its effects")
    finite = {n: v for n, v in values.items() if isinstance(v, float) and math.isfinite(v)}
    title = f"{s.get('method', '')} patching, {s.get('corruption', '')}, {s.get('metric', '')}"
    if level == "edge":
        senders = sorted({e.src for e in items})
        receivers = sorted({(e.dst, e.input.value) for e in items}, key=lambda r: (r[0], r[1]))
        grid = np.full((len(senders), len(receivers)), np.nan)
        for e in items:
            grid[senders.index(e.src), receivers.index((e.dst, e.input.value))] = finite.get(e.name, np.nan)
        fig, axes = _axes(ax, 1, width=max(5.0, 0.35 * len(receivers) + 2), height=max(3.0, 0.3 * len(senders) + 1.5))
        _heat(axes[0], grid, [f"{d.name}.{i}" for d, i in receivers], [n.name for n in senders], f"edges: {title}",
              ylabel="sender")
        return fig if ax is not None else finish(fig)
    neurons = [n for n in items if n.kind == Kind.NEURON]
    if neurons:
        ranked = sorted((n for n in neurons if n.name in finite), key=lambda n: -abs(finite[n.name]))[:top]
        fig, axes = _axes(ax, 1, width=6, height=max(3.0, 0.25 * len(ranked) + 1))
        bars = [finite[n.name] for n in ranked]
        axes[0].barh(range(len(ranked)), bars, color=["#b2182b" if v > 0 else "#2166ac" for v in bars])
        axes[0].set_yticks(range(len(ranked)), [n.name for n in ranked], fontsize=7)
        axes[0].invert_yaxis()
        axes[0].set(xlabel="normalized effect", title=f"strongest neurons: {title}")
        return fig if ax is not None else finish(fig)
    n_layers = s.get("n_layers") or 1 + max((n.layer for n in items), default=0)
    n_heads = s.get("n_heads") or 1 + max((n.head for n in items), default=0)
    positions = sorted({n.pos for n in items}, key=lambda p: (isinstance(p, str), p if isinstance(p, int) else 0))
    heads = effect_grid(items, finite, Kind.HEAD, n_layers, positions, n_heads)
    has_mlp = any(n.kind == Kind.MLP for n in items)
    by_position = len(positions) > 2  # every position its own node: the heads by position too
    fig, axes = _axes(ax, 1 + has_mlp + by_position)
    with np.errstate(invalid="ignore"):
        summed = np.where(np.isnan(heads).all(1), np.nan, np.nansum(heads, axis=1))
    _heat(axes[0], summed, [f"H{h}" for h in range(n_heads)], [str(l) for l in range(n_layers)],
          "heads (summed over positions)" if len(positions) > 1 else f"heads at position {positions[0]}",
          ystep=_step(n_layers))
    if has_mlp:
        mlp = effect_grid(items, finite, Kind.MLP, n_layers, positions)
        _heat(axes[1], mlp, [str(p) for p in positions], [str(l) for l in range(n_layers)], "MLP outputs by position",
              xstep=_step(len(positions)), ystep=_step(n_layers))
    if by_position:
        rows = heads.transpose(0, 2, 1).reshape(n_layers * n_heads, len(positions))  # (layer, head) x position
        _heat(axes[-1], rows, [str(p) for p in positions], [f"L{l}H{h}" for l in range(n_layers) for h in range(n_heads)],
              "heads by position", ylabel="head", xstep=_step(len(positions)), ystep=_step(n_layers * n_heads, n_heads))
    fig.suptitle(title, fontsize=9)
    return fig if ax is not None else finish(fig)


def _axes(ax: Any, n: int, **size: float) -> tuple[Any, list[Any]]:
    """``n`` axes to draw into: new ones (a new figure) when ``ax`` is None, else the caller's own:
    one matplotlib Axes when one panel is drawn, or a sequence of exactly ``n``."""
    from matplotlib.axes import Axes

    if ax is None:
        return new_figure(n, **size)
    given = [ax] if isinstance(ax, Axes) else list(ax) if isinstance(ax, (list, tuple)) else None
    if given is None or len(given) != n or not all(isinstance(a, Axes) for a in given):
        raise BadInputError(f"plot: ax={ax!r:.60} must be None (a new figure) or {'a matplotlib Axes' if n == 1 else ''}"
                            f"{' or ' if n == 1 else ''}a list of {n} matplotlib Axes: this result draws {n} panel(s)")
    return given[0].figure, given


def _heat(ax: Any, grid: Any, xlabels: list, ylabels: list, title: str, ylabel: str = "layer", xstep: int = 1,
          ystep: int = 1) -> None:
    """One heatmap panel; every ``xstep``-th column and ``ystep``-th row named (1: every one: names that say which
    component a cell is are never thinned; numbered positions and layers are, by :func:`_step`)."""
    import numpy as np

    bound = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap=EFFECT_CMAP, vmin=-bound, vmax=bound)
    for labels, ticks, every in ((xlabels, ax.set_xticks, xstep), (ylabels, ax.set_yticks, ystep)):
        shown = range(0, len(labels), every)
        rotation = 90 if ticks == ax.set_xticks and len(shown) > 12 else 0
        ticks(list(shown), [labels[i] for i in shown], fontsize=7, rotation=rotation)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    bar = ax.figure.colorbar(im, ax=ax)
    bar.set_label(EFFECT_LABEL.replace(" (", "\n("), fontsize=7)  # two short lines: within the panel's height
    bar.ax.tick_params(labelsize=7)


TICKS = 24
"""The most numbered ticks (positions, layers) a heatmap's axis names (every k-th past it: 48 positions show 0, 2, 4,
...); rows of heads by position are named at a layer's first head, every k-th layer."""


def _step(count: int, group: int = 1) -> int:
    """Every how many of ``count`` numbered ticks one is named so that at most :data:`TICKS` are, in whole ``group``s
    (a layer's heads: the named row is always a layer's first head)."""
    groups = math.ceil(count / group)
    return group * max(1, math.ceil(groups / TICKS)) if count > TICKS else 1
