"""Time the suite's two tiers and write the figures into docs/contributing.md (block ``suite``).

    python benchmarks/time_suite.py            # both tiers, then the block is rewritten
    python benchmarks/time_suite.py --fast     # the fast tier only

Each tier runs as documented (the README's test command; ``P0_FAST=1`` for the fast tier; here with
``-q -p no:cacheprovider --durations=30``, which change only the output and the cache directory), in a subprocess,
and the block records its wall time, its counts, the cores, and how much CPU other processes used
meanwhile (from /proc/stat less the tier's own; a figure measured on a busy machine says so). It also
times a fixed reference workload before each tier (``REFERENCE``: the machine's speed that day), since
this machine's speed varies from day to day by up to a factor of two: a suite time is comparable across
days only beside it."""

import argparse
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Conditions  # noqa: E402  (record puts tests/ on the path)
import docblocks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIERS = {"fast": ({"P0_FAST": "1"}, "P0_FAST=1 python -m pytest -n 2"),
         "full": ({}, "python -m pytest -n 2")}
"""tier -> (its environment, the documented command); run as documented, with ``-q -p no:cacheprovider --durations=30``."""


REFERENCE = ("import time, torch\n"
             "torch.set_num_threads(1); a = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))\n"
             "best = 1e9\n"
             "for _ in range(3):\n"
             "    t = time.perf_counter()\n"
             "    for _ in range(50): a @ a\n"
             "    best = min(best, time.perf_counter() - t)\n"
             "print(best)")
"""The reference workload: 50 float32 products of two 1024 x 1024 matrices on one thread, the best of three
(10.7 GFLOP per run), in a fresh process."""


def reference() -> float:
    """Seconds of the reference workload now."""
    out = subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def run(tier: str) -> dict:
    env, command = TIERS[tier]
    args = command.split("python -m pytest", 1)[1].split()
    ref = reference()
    with Conditions() as cond:
        done = subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider", "--durations=30"], cwd=ROOT,
                              env={**os.environ, **env}, capture_output=True, text=True)
    log = Path(f"/tmp/p0circuit-suite-{tier}.log")
    log.write_text(done.stdout + done.stderr)  # what failed, if anything
    print(f"{tier}: {cond.seconds / 60:.1f} min, exit status {done.returncode}; output in {log}", flush=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary))
    return {"tier": tier, "command": command, "seconds": cond.seconds, "state": cond.state(), "counts": counts,
            "rc": done.returncode, "reference": ref}


def line(r: dict) -> str:
    c = r["counts"]
    status = "all passed" if r["rc"] == 0 else f"exit status {r['rc']}: {c.get('failed', 0)} failed"
    return (f"| {r['tier']} | `{r['command']}` | {r['seconds'] / 60:.1f} min | {r['reference']:.2f} s | "
            f"{c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped | "
            f"{status}; {r['state']} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true", help="the fast tier only")
    args = ap.parse_args()
    rows = [run("fast")] + ([] if args.fast else [run("full")])
    if args.fast:  # keep the full tier's row as it was
        old = [ln for ln in docblocks.read("docs/contributing.md", "suite").splitlines() if ln.startswith("| full |")]
    else:
        old = []
    text = "\n".join([f"Measured by `python benchmarks/time_suite.py` on {datetime.date.today()}, {os.cpu_count()} cores:",
                      "", "| tier | command | wall time | reference workload | tests | result |",
                      "|---|---|---|---|---|---|", *[line(r) for r in rows], *old,
                      "", "Reference workload: 50 float32 products of 1024 x 1024 matrices on one thread, the best of "
                      "three, timed just before the tier (`benchmarks/time_suite.py`): the machine's speed that day."])
    docblocks.write("docs/contributing.md", "suite", text)
    print(text)


if __name__ == "__main__":
    main()
