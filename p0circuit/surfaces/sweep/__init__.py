"""Scripted patching sweeps: a TOML grid, one atomic result file per cell, resumable.

``SweepConfig`` and ``Cell`` import no torch (a config is checked at once); the runner's names are
imported on first use."""

import importlib

from p0circuit.surfaces.sweep.config import Cell, SweepConfig

__all__ = ["Cell", "SweepConfig", "rebuild_index", "run_cell", "run_sweep", "summary_table", "write_atomic"]


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(importlib.import_module("p0circuit.surfaces.sweep.runner"), name)
    raise AttributeError(f"module 'p0circuit.surfaces.sweep' has no attribute {name!r}")
