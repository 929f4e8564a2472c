"""A sweep directory's files, read and checked without torch: which cells are done, their
records, the index, and whose directory it is (``p0circuit sweep --dry-run`` and the report read
only this)."""

import json
from pathlib import Path
from typing import Any, Union

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.core.io import write_atomic
from p0circuit.surfaces.sweep.config import SweepConfig
from p0circuit.surfaces.sweep.record import CELL_SCHEMA, CellRecord


def done_keys(out: Path) -> set[str]:
    """Keys of the cells already written under ``out`` whose record this p0circuit reads. A cell of an older version (or
    of none) is not done: a sweep computes it again and writes it over. A cell of a newer version is refused (this
    p0circuit would overwrite what a newer one measured); a file that is not a cell record is refused by
    :func:`rebuild_index`, which says what to do."""
    cells = out / "cells"
    done = set()
    for p in sorted(cells.glob("*.json")) if cells.is_dir() else []:
        try:
            data = json.loads(p.read_text(encoding="utf-8", errors="replace"))
        except ValueError:
            continue
        try:
            CellRecord.from_dict(data, str(p))
        except ConfigError as err:
            found = data.get("schema") if isinstance(data, dict) else None
            if isinstance(found, int) and not isinstance(found, bool) and found > CELL_SCHEMA:
                raise ConfigError(f"{err}; or sweep into another --out: this p0circuit would overwrite it") from None
            continue
        done.add(p.stem)
    return done


def read_records(out: Path) -> tuple[list[CellRecord], list[str]]:
    """The finished cells' records, read typed (:class:`~p0circuit.surfaces.sweep.record.CellRecord`), and notes on
    what could not be read.

    The cell files (written atomically, one per cell) are the source of truth; ``results.jsonl``
    is read only when there are none. An unreadable line or file, a record of another version (or of none: written
    before cell records were versioned) or one whose keys do not read is skipped and named in the notes, never
    raised: what finished is kept."""
    notes: list[str] = []
    files = sorted((out / "cells").glob("*.json")) if (out / "cells").is_dir() else []
    if files:
        sources = [(str(f), f.read_text(encoding="utf-8", errors="replace")) for f in files]
    elif (out / "results.jsonl").is_file():
        lines = (out / "results.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
        sources = [(f"results.jsonl line {i + 1}", line) for i, line in enumerate(lines) if line.strip()]
    else:
        sources = []
    records = []
    for where, text in sources:
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            notes.append(f"skipped {where}: not valid JSON (cut short by a crash?)")
            continue
        try:
            records.append(CellRecord.from_dict(record, "the record"))
        except ConfigError as err:
            notes.append(f"skipped {where}: {err}")
    return records, notes


@entry_point
def rebuild_index(out: Union[str, Path]) -> list[dict[str, Any]]:
    """Rewrite ``results.jsonl`` from the cell files (atomically) and return the records; a cell file that does not
    read (cut short, or not JSON) is refused, naming it."""
    out = Path(out)
    if not out.is_dir():
        raise BadInputError(f"rebuild_index: out={str(out)!r} is not a sweep's directory; pass the --out of a sweep")
    records = []
    for p in sorted((out / "cells").glob("*.json")):
        try:
            record = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError):
            raise BadInputError(f"rebuild_index: {str(p)!r} is not valid JSON (cut short?); delete it, and the next "
                                "sweep run computes that cell again") from None
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise BadInputError(f"rebuild_index: {str(p)!r} is not a cell record (a JSON object with its key); delete "
                                "it, and the next sweep run computes that cell again")
        records.append(record)
    write_atomic(out / "results.jsonl", "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))
    return records


def check_owner(config: SweepConfig, out: Path) -> None:
    """Refuse a directory that holds a sweep of another config (the cells would mix)."""
    saved = out / "config.json"
    if not saved.is_file():
        if (out / "cells").is_dir() and any((out / "cells").glob("*.json")):
            raise ConfigError(f"{out} holds sweep cells but no config.json; sweep into an empty directory (--out)")
        return
    try:
        previous = json.loads(saved.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{saved} is not readable JSON: is {out} a sweep directory? Choose another --out") from None
    previous.setdefault("plugins", [])  # written before sweeps had plugins
    current = json.loads(json.dumps(config.__dict__))
    if previous != current:
        keys = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
        raise ConfigError(f"{out} holds a sweep of another config (it differs in {', '.join(keys)}); a directory "
                          "belongs to one config: sweep into another --out, or delete the directory to start over")
