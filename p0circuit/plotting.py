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
