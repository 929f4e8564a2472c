"""Running a sweep: one result file per cell, written atomically, so an interrupted sweep resumes
where it stopped and loses nothing.

Each finished cell is written to ``DIR/cells/<key>.json`` through a temporary file and
``os.replace`` (a reader never sees half a file; a killed run leaves at most a stray ``.tmp``).
A cell that raises is written to ``DIR/failed/<key>.json`` (its error and traceback) and the
others go on; a rerun tries it again. A directory belongs to one config (``DIR/config.json``):
resuming it with a config that differs is refused, so two sweeps never mix in one results file.
``DIR/results.jsonl`` is rewritten after every cell from the records in memory (the finished
cells are read once at the start), again atomically, so it never holds a duplicate or a partial
line. On restart, cells whose file exists are skipped.
"""

import functools
import json
import multiprocessing
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Optional

from p0circuit.progress import tqdm

from p0circuit.discovery import run_discovery
from p0circuit.errors import BadInputError, ConfigError, P0CircuitError
from p0circuit.io import strict, write_atomic
from p0circuit.models.resolve import Resolved, load_model
from p0circuit.patching.metrics import metric_from_entry
from p0circuit.plugins import load_plugins
from p0circuit.sweep.config import Cell, SweepConfig
from p0circuit.tokens import make_prompts
from p0circuit.types import Circuit


@functools.lru_cache(maxsize=2)
def _model(entry: str, seed: int) -> Resolved:
    """Each model once per process (a worker runs many cells of the same model); patching leaves
    the weights as they were."""
    return load_model(entry, seed=seed)


def run_cell(cell: Cell) -> dict[str, Any]:
    """Compute one cell and return its JSON-able record."""
    start = time.perf_counter()
    resolved = _model(cell.model, cell.seed)
    model = resolved.model
    room = model.cfg.n_ctx - (1 if cell.corruption == "shift" else 0)  # shift prepends a token
    if cell.seq_len > room:
        raise BadInputError(f"seq_len={cell.seq_len} does not fit {cell.model} (n_ctx={model.cfg.n_ctx}"
                            + (", and shift prepends one token" if cell.corruption == "shift" else "")
                            + f"): set seq_len <= {room} in the sweep config")
    prompts = make_prompts(model, cell.n_prompts, cell.seq_len, source=cell.prompts, seed=cell.seed)
    tokens = prompts.tokens
    metric = metric_from_entry(cell.metric, model, resolved.sink_heads)
    found = run_discovery(resolved, tokens, methods=[cell.method], corruption=cell.corruption, metric=metric,
                          threshold=cell.threshold, bos=False)
    circuit = found.circuits[cell.method]
    record: dict[str, Any] = {"key": cell.key, "cell": cell.__dict__, "prompts": prompts.source,
                              "n_prompts": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
                              "circuit": circuit.to_dict(),
                              "signal": circuit.settings.get("signal"), "interpretation": circuit.interpretation,
                              "sink_report": {k: v for k, v in found.report.to_dict().items() if k != "massive"},
                              "seconds": time.perf_counter() - start}
    scores = found.scores(cell.method)
    if scores is not None:
        record["scores"] = scores
    if resolved.truth is not None:
        record["truth"] = resolved.truth.to_dict()
    return strict(record)  # strict JSON: an undefined number is null, never NaN


def done_keys(out: Path) -> set[str]:
    """Keys of the cells already written under ``out``."""
    cells = out / "cells"
    return {p.stem for p in cells.glob("*.json")} if cells.is_dir() else set()


RECORD_FIELDS = ("key", "cell", "circuit", "sink_report")
"""Fields every cell record has (what the report and the summary read)."""


def read_records(out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The finished cells' records and notes on what could not be read.

    The cell files (written atomically, one per cell) are the source of truth; ``results.jsonl``
    is read only when there are none. An unreadable line or file, or a record missing a field, is
    skipped and named in the notes, never raised: what finished is kept."""
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
        missing = [f for f in RECORD_FIELDS if not isinstance(record, dict) or f not in record]
        if missing:
            notes.append(f"skipped {where}: the record lacks {', '.join(missing)}")
            continue
        records.append(record)
    return records, notes


def rebuild_index(out: Path) -> list[dict[str, Any]]:
    """Rewrite ``results.jsonl`` from the cell files (atomically) and return the records."""
    records = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    write_atomic(out / "results.jsonl", "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))
    return records


def _ray_results(todo: list[Cell], workers: int) -> Any:
    """Yield (cell, record or exception) as Ray tasks finish (a local cluster, or the one in ``RAY_ADDRESS``)."""
    try:
        import ray  # optional extra: pip install "p0circuit[ray]"
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'p0circuit[ray]' (or pip install ray)") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else max(1, workers), include_dashboard=False,
                 log_to_driver=False)
    try:
        remote = ray.remote(run_cell)
        pending = {remote.remote(c): c for c in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(done[0])
            try:
                yield cell, ray.get(done[0])
            except Exception as err:  # the cell's error, re-raised by Ray: recorded by the caller
                yield cell, err
    finally:
        if started:
            ray.shutdown()


def run_sweep(
    config: SweepConfig, out: Path, workers: int = 1, max_cells: Optional[int] = None,
    progress: bool = True, on_done: Optional[Callable[[dict[str, Any]], None]] = None, executor: str = "local",
) -> list[dict[str, Any]]:
    """Run every cell not yet done (at most ``max_cells``), writing each as it finishes.

    ``executor``: ``local`` (in this process with ``workers=1``, else a local process pool) or
    ``ray`` (Ray tasks; the driver still writes every result, so atomicity and resume are the same).
    """
    if executor not in ("local", "ray"):
        raise ConfigError(f"executor must be 'local' or 'ray', got {executor!r}")
    check_owner(config, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cells").mkdir(exist_ok=True)
    write_atomic(out / "config.json", json.dumps(config.__dict__, indent=2))
    done = done_keys(out)
    todo = [c for c in config.cells() if c.key not in done]
    if max_cells is not None:
        todo = todo[:max_cells]
    bar = tqdm(total=len(todo), desc="sweep", unit="cell", disable=not progress)

    records = {r["key"]: r for r in rebuild_index(out)}  # read the finished cells once

    failed: list[str] = []

    def fail(cell: Cell, err: BaseException) -> None:
        (out / "failed").mkdir(exist_ok=True)
        write_atomic(out / "failed" / f"{cell.key}.json", json.dumps({
            "key": cell.key, "cell": cell.__dict__, "error": f"{type(err).__name__}: {err}",
            "ours": isinstance(err, P0CircuitError),
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}, indent=1))
        failed.append(f"{cell.label()}: {type(err).__name__}: {err}")
        bar.update(1)

    def finish(record: dict[str, Any]) -> None:
        (out / "failed" / f"{record['key']}.json").unlink(missing_ok=True)
        write_atomic(out / "cells" / f"{record['key']}.json", json.dumps(record, indent=1, allow_nan=False))
        records[record["key"]] = record
        write_atomic(out / "results.jsonl", "".join(json.dumps(records[k], allow_nan=False) + "\n" for k in sorted(records)))
        bar.update(1)
        if on_done is not None:
            on_done(record)

    try:
        if executor == "ray":
            for cell, outcome in _ray_results(todo, workers):
                if isinstance(outcome, Exception):
                    fail(cell, outcome)
                else:
                    finish(outcome)
        elif workers <= 1:
            for cell in todo:
                try:
                    record = run_cell(cell)
                except Exception as err:  # recorded, and the other cells go on
                    fail(cell, err)
                else:
                    finish(record)
        else:
            # spawn, not fork: a forked child of a process whose torch thread pool already ran
            # deadlocks in its first parallel op (seen here: workers asleep forever)
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=load_plugins, initargs=(config.plugins,)) as pool:
                futures = {pool.submit(run_cell, c): c for c in todo}
                for fut in as_completed(futures):
                    err = fut.exception()
                    if err is not None:
                        fail(futures[fut], err)
                    else:
                        finish(fut.result())
    finally:
        bar.close()
    records = rebuild_index(out)
    if failed:
        raise CellsFailed(len(failed), len(todo), out, failed)
    return records


class CellsFailed(P0CircuitError, RuntimeError):
    """Some cells of a sweep raised; every other cell finished and was written."""

    def __init__(self, n_failed: int, n_run: int, out: Path, lines: list[str]) -> None:
        shown = "\n  ".join(lines[:5]) + (f"\n  ... and {len(lines) - 5} more" if len(lines) > 5 else "")
        super().__init__(f"{n_failed} of {n_run} cells failed (errors and tracebacks in {out}/failed/; the other "
                         f"cells are written, and a rerun retries only the failed ones):\n  {shown}")
        self.n_failed = n_failed


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


def summary_table(records: list[dict[str, Any]]) -> str:
    """One line per cell: the grid coordinates, the signal, the circuit size and any scores."""
    lines = [f"{'model':18s} {'prompts':8s} {'corruption':10s} {'method':11s} {'metric':12s} signal  nodes edges  scores"]
    for r in sorted(records, key=lambda r: Cell(**r["cell"]).label()):
        c = r["cell"]
        scores = r.get("scores") or {}
        key = Circuit.from_dict(r["circuit"]).level
        shown = " ".join(f"{k.split('_', 1)[1]}={v:.2f}" for k, v in scores.items() if k.startswith(key) and v is not None)
        lines.append(f"{c['model']:18s} {c['prompts']:8s} {c['corruption']:10s} {c['method']:11s} {c['metric']:12s} "
                     f"{str(r['signal']):6s} {len(r['circuit']['nodes']):5d} {len(r['circuit']['edges']):5d}  {shown}")
    return "\n".join(lines)
