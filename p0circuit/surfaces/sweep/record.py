"""One sweep cell's record (``DIR/cells/<key>.json``, a line of ``DIR/results.jsonl``), versioned and read back
typed: :class:`CellRecord`. Imports no torch (``p0circuit sweep --dry-run`` and the report read records only)."""

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Optional

from p0circuit.core.record import ABSENT, Maybe, Mismatch, Record
from p0circuit.core.types import CircuitRecord
from p0circuit.surfaces.sweep.config import Cell

CELL_SCHEMA = 1
"""The version of a cell record this p0circuit writes and reads (a cell written before the records were versioned has
none: it is skipped with a note, and the sweep computes it again in a new directory)."""


@dataclass(frozen=True)
class CellRecord(Record):
    """What one cell of a sweep found: its grid coordinates, prompts, circuit, sink report and scores."""

    key: str
    """The cell's key (its file name under ``cells/``)."""
    cell: dict[str, Any]
    """The grid coordinates (:class:`~p0circuit.surfaces.sweep.config.Cell`'s fields: model, prompts, corruption,
    method, metric, n_prompts, seq_len, seed, threshold)."""
    prompts: str
    """What the prompts are, in words."""
    n_prompts: int
    """Prompts run."""
    seq_len: int
    """Tokens per prompt."""
    circuit: CircuitRecord
    """The circuit found (``Circuit.from_dict`` reads it)."""
    signal: Optional[bool]
    """Whether clean and corrupted differed enough to normalize effects (None: not recorded by the method)."""
    interpretation: str
    """The circuit's one-line reading."""
    sink_report: dict[str, Any]
    """The sink report on the cell's prompts (without its massive activations)."""
    seconds: float
    """The cell's wall time."""
    scores: Maybe[dict[str, Optional[float]]] = ABSENT
    """Precision, recall and AUROC against a planted model's ground truth (a planted model only)."""
    truth: Maybe[CircuitRecord] = ABSENT
    """The planted ground truth (a planted model only)."""
    schema: int = CELL_SCHEMA
    """The record's version (:data:`CELL_SCHEMA`)."""

    SCHEMA_VERSION: ClassVar[Optional[int]] = CELL_SCHEMA
    FIX: ClassVar[str] = ("sweep into a new --out (the cell is computed again by this p0circuit), or read it with the "
                          "p0circuit that wrote it")

    def _check(self, path: str) -> None:
        """The grid coordinates hold a :class:`~p0circuit.surfaces.sweep.config.Cell`'s fields, no more and no fewer, by
        key path. Their values are checked when the cell is read as one (:attr:`grid`): a model or corruption a
        plugin registers is known only once the sweep's config has loaded its plugins."""
        names = [f.name for f in fields(Cell)]
        if sorted(self.cell) != sorted(names):
            odd = sorted(set(self.cell) ^ set(names))
            raise Mismatch(f"{path}.cell", f"a cell's grid coordinates ({', '.join(names)})", self.cell,
                           f"the keys {odd} differ")

    @property
    def grid(self) -> Cell:
        """The grid coordinates as a :class:`~p0circuit.surfaces.sweep.config.Cell`."""
        return Cell(**self.cell)
