"""The progress bar that fits where the code runs: a widget bar in Jupyter when ipywidgets is
installed, a plain text bar everywhere else (never tqdm's "IProgress not found" warning)."""

import importlib.util
import sys
from typing import Any

from tqdm import std


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell is not None and hasattr(shell, "get_ipython") else None  # type: ignore[attr-defined]
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """A tqdm bar: ``tqdm.notebook`` in a Jupyter kernel with ipywidgets, else the plain one."""
    if _in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as notebook_bar  # only here: importing it needs IPython

        return notebook_bar(*args, **kwargs)
    return std.tqdm(*args, **kwargs)
