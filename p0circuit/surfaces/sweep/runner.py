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
from typing import Any, Callable, Iterator, Literal, Optional, Union


from p0circuit.core.progress import tqdm

from p0circuit.studies.discovery.session import run_discovery
from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError, ConfigError, P0CircuitError
from p0circuit.core.io import out_dir, strict, write_atomic
from p0circuit.models.resolve import Resolved, load_model
from p0circuit.patching.corruptions import get_corruption
from p0circuit.patching.metrics import metric_from_entry
from p0circuit.core.threads import set_threads
from p0circuit.core.plugins import load_plugins
from p0circuit.surfaces.sweep.config import Cell, SweepConfig
from p0circuit.surfaces.sweep.record import CELL_SCHEMA, CellRecord
from p0circuit.surfaces.sweep.store import check_owner, done_keys, rebuild_index
from p0circuit.models.tokens import make_prompts
from p0circuit.core.types import Circuit


@functools.lru_cache(maxsize=2)
def _model(entry: str, seed: int) -> Resolved:
    """Each model once per process (a worker runs many cells of the same model); patching leaves
    the weights as they were."""
    return load_model(entry, seed=seed)


@entry_point
def run_cell(cell: Cell) -> dict[str, Any]:
    """Compute one cell and return its record as JSON (a :class:`~p0circuit.surfaces.sweep.record.CellRecord`'s
    ``to_dict()``, with its schema version)."""
    start = time.perf_counter()
    resolved = _model(cell.model, cell.seed)
    model = resolved.model
    if cell.seq_len > model.cfg.n_ctx:
        raise BadInputError(f"seq_len={cell.seq_len} does not fit {cell.model} (n_ctx={model.cfg.n_ctx}): set "
                            f"seq_len <= {model.cfg.n_ctx} in the sweep config")
    prompts = make_prompts(model, cell.n_prompts, cell.seq_len, source=cell.prompts, seed=cell.seed)
    tokens = prompts.tokens
    corrupt = get_corruption(cell.corruption).prepare(model, tokens).corrupt_tokens  # any corruption, a plugin's too
    added = 0 if corrupt is None else int(corrupt.shape[1]) - int(tokens.shape[1])
    if cell.seq_len + added > model.cfg.n_ctx:
        raise BadInputError(f"seq_len={cell.seq_len} does not fit {cell.model} (n_ctx={model.cfg.n_ctx}) under "
                            f"{cell.corruption!r}, whose corrupted prompts are longer by {added} token{'s' * (added != 1)}: set seq_len <= "
                            f"{model.cfg.n_ctx - added} in the sweep config")
    metric = metric_from_entry(cell.metric, model, resolved.sink_heads)
    found = run_discovery(resolved, tokens, methods=[cell.method], corruption=cell.corruption, metric=metric,
                          threshold=cell.threshold, bos=False)
    circuit = found.circuits[cell.method]
    record: dict[str, Any] = {"schema": CELL_SCHEMA, "key": cell.key, "cell": cell.__dict__, "prompts": prompts.source,
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
    # strict JSON (an undefined number is null, never NaN), read as the record a sweep's readers read
    return CellRecord.from_dict(strict(record), f"cell {cell.key}").to_dict()


def _start_worker(plugins: list[str], threads: int) -> None:
    """A pool worker's start: the config's plugins, and its share of the cores for torch. Workers
    that each take every core slow one another down many times over (measured here: a planted-model
    CLI test took 66 s instead of 2.3 s while a second torch process also ran two threads on the
    same two cores). A fixed share (``set_threads``): the siblings' work is the worker's own load, not a
    reason to drop to one thread."""
    set_threads(threads)
    load_plugins(plugins)


def _run_with_plugins(plugins: list[str], cell: Cell) -> dict[str, Any]:
    """:func:`run_cell` in a worker that first loads the config's plugins (once per process)."""
    load_plugins(plugins)
    return run_cell(cell)


def _ray_results(todo: list[Cell], workers: int, plugins: list[str]) -> Iterator[Any]:
    """Yield (cell, record or exception) as Ray tasks finish (a local cluster, or the one in
    ``RAY_ADDRESS``); each task loads the config's ``plugins`` first, as the local pool's workers do."""
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
        remote = ray.remote(_run_with_plugins)
        pending = {remote.remote(list(plugins), c): c for c in todo}
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


@entry_point
def run_sweep(
    config: SweepConfig, out: Union[str, Path], workers: int = 1, max_cells: Optional[int] = None,
    progress: bool = True, on_done: Optional[Callable[[dict[str, Any]], None]] = None,
    executor: Literal["local", "ray"] = "local",
) -> list[dict[str, Any]]:
    """Run every cell not yet done (at most ``max_cells``), writing each as it finishes, and return every finished
    cell's record of this version as JSON (a cell of an older version is not done: run again, it is computed again).

    ``executor``: ``local`` (in this process with ``workers=1``, else a local process pool) or
    ``ray`` (Ray tasks; the driver still writes every result, so atomicity and resume are the same).
    """
    if executor not in ("local", "ray"):
        raise ConfigError(f"executor must be 'local' or 'ray', got {executor!r}")
    if workers < 1:
        raise ConfigError(f"run_sweep: workers={workers!r} must be >= 1 (--workers: processes running cells at once)")
    if max_cells is not None and max_cells < 0:
        raise ConfigError(f"run_sweep: max_cells={max_cells!r} must be None (every cell) or >= 0 (--max-cells)")
    out = out_dir("run_sweep", out)
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
    ours: list[bool] = []  # per failure: a refusal of the cell's own settings (it recurs) or not

    def fail(cell: Cell, err: BaseException) -> None:
        (out / "failed").mkdir(exist_ok=True)
        write_atomic(out / "failed" / f"{cell.key}.json", json.dumps({
            "key": cell.key, "cell": cell.__dict__, "error": f"{type(err).__name__}: {err}",
            "ours": isinstance(err, P0CircuitError),
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}, indent=1))
        failed.append(f"{cell.label()}: {type(err).__name__}: {err}")
        ours.append(isinstance(err, P0CircuitError))
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
            for cell, outcome in _ray_results(todo, workers, config.plugins):
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
            threads = max(1, (os.cpu_count() or 1) // workers)
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_start_worker, initargs=(config.plugins, threads)) as pool:
                futures = {pool.submit(run_cell, c): c for c in todo}
                for fut in as_completed(futures):
                    err = fut.exception()
                    if err is not None:
                        fail(futures[fut], err)
                    else:
                        finish(fut.result())
    finally:
        bar.close()
    readable = done_keys(out)  # a cell of an older version left as it is (max_cells, or its recompute failed): not one
    records = [r for r in rebuild_index(out) if r["key"] in readable]
    if failed:
        raise CellsFailed(len(failed), len(todo), out, failed, refused=sum(ours))
    return records


class CellsFailed(P0CircuitError, RuntimeError):
    """Some cells of a sweep raised; every other cell finished and was written."""

    def __init__(self, n_failed: int, n_run: int, out: Path, lines: list[str], refused: int = 0) -> None:
        shown = "\n  ".join(lines[:5]) + (f"\n  ... and {len(lines) - 5} more" if len(lines) > 5 else "")
        if refused == n_failed:  # each a refusal of the cell's own settings: a rerun meets it again
            then = ("each was refused for its settings, which a rerun meets again: change the config as the errors "
                    "say, then rerun (it runs only the failed cells)")
        else:
            then = ("a rerun retries only the failed ones" + (f"; {refused} of them were refused for their settings "
                                                               "and fail again until the config changes as their errors "
                                                               "say" if refused else ""))
        super().__init__(f"{n_failed} of {n_run} cells failed (errors and tracebacks in {out}/failed/; the other "
                         f"cells are written; {then}):\n  {shown}")
        self.n_failed = n_failed


@entry_point
def summary_table(records: Any) -> str:  # (checked here: a list, each a CellRecord or its JSON)
    """One line per cell: the grid coordinates, the signal, the circuit size and any scores (``records``: those
    :func:`run_sweep` returns, or :func:`~p0circuit.surfaces.sweep.store.read_records` reads)."""
    if not isinstance(records, list):
        raise BadInputError(f"summary_table takes a list of cell records, got {type(records).__name__}")
    typed = []
    for i, r in enumerate(records):
        try:
            typed.append(r if isinstance(r, CellRecord) else CellRecord.from_dict(r, f"summary_table: records[{i}]"))
        except ConfigError as err:
            raise BadInputError(f"{err}; pass the records run_sweep returns (or read_records reads)") from None
    lines = [f"{'model':18s} {'prompts':8s} {'corruption':10s} {'method':11s} {'metric':12s} signal  nodes edges  scores"]
    for r in sorted(typed, key=lambda r: r.grid.label()):
        c = r.grid
        key = Circuit.from_dict(r.circuit.to_dict()).level
        shown = " ".join(f"{k.split('_', 1)[1]}={v:.2f}" for k, v in (r.scores or {}).items()
                         if k.startswith(key) and v is not None)
        lines.append(f"{c.model:18s} {c.prompts:8s} {c.corruption:10s} {c.method:11s} {c.metric:12s} "
                     f"{str(r.signal):6s} {len(r.circuit.nodes):5d} {len(r.circuit.edges):5d}  {shown}")
    return "\n".join(lines)
