"""Scripted patching sweeps: a TOML grid, one atomic result file per cell, resumable."""

from p0circuit.sweep.config import Cell, SweepConfig
from p0circuit.sweep.runner import rebuild_index, run_cell, run_sweep, summary_table, write_atomic

__all__ = ["Cell", "SweepConfig", "rebuild_index", "run_cell", "run_sweep", "summary_table", "write_atomic"]
