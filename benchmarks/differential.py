"""The long differential run, split over processes, and its record in docs/reliability.md.

    python benchmarks/differential.py --cases 10000 --processes 2

runs ``tests/test_differential.py::test_fast_and_reference_equal_the_oracle_long`` in ``--processes``
processes (one torch thread each, each with its own random seed and ``cases / processes`` cases),
sums what each compared and refused, and writes the block ``differential`` of docs/reliability.md:
the cases compared, the cases refused with a clear error (an answer, not compared), the differences
found (a failing process; its case is printed) and the wall time. ``--from-logs LOG...`` writes the
block from the progress logs and outputs of processes started by hand (the same test, with
``P0_DIFF_LOG``)."""

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import docblocks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/test_differential.py::test_fast_and_reference_equal_the_oracle_long"


def _last_counts(log: Path) -> tuple[int, int]:
    lines = [ln for ln in log.read_text().splitlines() if "compared" in ln] if log.exists() else []
    m = re.match(r"(\d+) compared, (\d+) refused", lines[-1]) if lines else None
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def record(runs: list[tuple[Path, Path]], seconds: float, note: str) -> str:
    """The block's text from each process's (progress log, pytest output)."""
    compared = refused = failed = 0
    for log, out in runs:
        c, r = _last_counts(log)
        text = out.read_text() if out.exists() else ""
        ok = re.search(r"\b1 passed\b", text) is not None
        compared, refused, failed = compared + c, refused + r, failed + (not ok)
    verdict = "no difference" if not failed else f"{failed} process(es) stopped on a difference (see their output)"
    return (f"Last long run ({datetime.date.today()}, `python benchmarks/differential.py`, {len(runs)} processes of one "
            f"thread each on {os.cpu_count()} cores, {note}): **{compared:,} random cases compared, {verdict}**; "
            f"{refused:,} more were refused by p0circuit with a clear error (an answer: nothing to compare); "
            f"{seconds / 60:.0f} minutes of wall time.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--from-logs", nargs="*", help="LOG OUT pairs of runs started by hand")
    ap.add_argument("--minutes", type=float, help="with --from-logs: their wall time")
    ap.add_argument("--note", default="the machine otherwise quiet")
    args = ap.parse_args()
    if args.from_logs:
        pairs = list(zip(map(Path, args.from_logs[::2]), map(Path, args.from_logs[1::2])))
        text = record(pairs, (args.minutes or 0) * 60, args.note)
    else:
        start, procs, pairs = time.perf_counter(), [], []
        for i in range(args.processes):
            log, out = Path(f"/tmp/p0-diff-{i}.log"), Path(f"/tmp/p0-diff-{i}.out")
            log.unlink(missing_ok=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "P0_DIFF_LOG": str(log),
                   "P0_DIFF_CASES": str(args.cases // args.processes)}
            procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "full",
                                           TEST], cwd=ROOT, env=env, stdout=out.open("w"), stderr=subprocess.STDOUT))
            pairs.append((log, out))
        for p in procs:
            p.wait()
        text = record(pairs, time.perf_counter() - start, args.note)
    docblocks.write("docs/reliability.md", "differential", text)
    print(text)


if __name__ == "__main__":
    main()
