"""The paper's questions for any model in one call: :func:`analyze` (``p0circuit analyze``).

The names are imported when first used, so that :mod:`.settings` (no torch) loads alone."""

import importlib
from typing import Any

__all__ = ["Analysis", "AnalysisSettings", "analyze"]

_HOME = {"Analysis": "run", "analyze": "run", "AnalysisSettings": "settings"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
