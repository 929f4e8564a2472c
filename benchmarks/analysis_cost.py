"""What `p0circuit analyze` costs, against what its cost model (``p0circuit/studies/analysis/cost.py``)
predicted: each model analysed by the command itself (a fresh process, ``--fresh``, its wall time
measured), then, from its ``analysis.json``, every step kind's counted forwards (p0circuit/patching/work.py)
and seconds beside the predicted forwards, and how far the progress bar's estimate
of the total time was from the real one when a quarter, half and three quarters of the time had passed
(read from the estimate the analysis records every second, ``timing.eta``: p0circuit/studies/analysis/eta.py).

    python benchmarks/analysis_cost.py                                  # SmolLM2 (one onset, then both), Gemma 3, Qwen2.5 (about 10 minutes)
    python benchmarks/analysis_cost.py --models real:smollm2 --out DIR  # the runs are kept in DIR (the atlas reads them)

A model entry may carry ``analyze`` options after it (``"real:smollm2 --max-onsets 2"``: both of SmolLM2's P0
onsets). Each run gets torch's default OpenMP wait policy (``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` removed from
its environment), as a user's would: a passive policy set for a busy machine costs a quiet one about 1.2x.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Conditions, publish  # noqa: E402

KINDS = ("sinks", "first_tokens", "keyed", "nodes", "edges", "neurons", "reads", "detection", "sink", "weights",
         "corruptions", "length", "spread", "special")
"""Step kinds (the last part of a state key, without its layer or length): ``sink`` is the sink's own circuit,
``weights`` the super weights (the model's table and each onset's zeroing), ``spread`` the intervals over new
prompts and the length scan."""


def kind(key: str) -> str:
    """A step's kind from its state key (``without_bos/P0@L2/nodes`` -> ``nodes``, ``first_tokens@L2`` ->
    ``first_tokens``, ``without_bos/length12`` -> ``length``)."""
    name = re.match(r"[a-z_]+", key.rsplit("/", 1)[-1]).group(0)
    if name not in KINDS:
        raise SystemExit(f"analysis_cost.py: step {key!r} is of a kind this table does not know ({name!r}); add it "
                         "to KINDS")
    return name


def eta_errors(timing: dict) -> dict[str, float]:
    """(the bar's estimate of the total time - the real total) / the real total, at a quarter, a half and
    three quarters of the time the bar was open (from the sink report's start to the last step's end; the
    forward timed before it is left out): read from the estimates the analysis recorded every second
    (``timing.eta``: what its bar showed, also when hidden)."""
    log = timing["eta"]
    real = log[-1][0]
    out = {}
    for share in (0.25, 0.5, 0.75):
        at, guess = min(log, key=lambda p: abs(p[0] - share * real))
        out[f"{share:.0%}"] = (guess - real) / real
    return out


ROWS = ("real:smollm2", "real:smollm2 --max-onsets 2", "real:gemma3", "real:qwen2.5")
"""The analyses measured by default: each model's default, and SmolLM2 with its second P0 onset too."""
POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""OpenMP settings removed from each run's environment (module docstring)."""


def measure(row: str, out: Path) -> dict:
    entry, *options = row.split()
    env = {k: v for k, v in os.environ.items() if k not in POLICY}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "p0circuit", "analyze", "--model", entry, *options, "--out", str(out),
                              "--fresh", "--quiet"], env={**env, "TQDM_DISABLE": "1"}, stdout=subprocess.DEVNULL)
    _, status, _ = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"p0circuit analyze --model {row} failed (exit status {child.returncode})")
    wall = time.perf_counter() - start
    d = json.loads((out / "analysis.json").read_text())
    t = d["timing"]
    measured, predicted, seconds = defaultdict(float), defaultdict(float), defaultdict(float)
    for key, secs in t["steps"].items():
        measured[kind(key)] += t["forwards_by_step"][key]  # counted (p0circuit/patching/work.py), not timed
        seconds[kind(key)] += secs
        predicted[kind(key)] += t["predicted_forwards"].get(key, 0.0)
    mem = d["memory"]
    peak = defaultdict(float)  # GiB: the largest peak of a step of each kind (the peak is reset before each step)
    for key, gib in mem["steps"].items():
        if gib is not None:  # None: not measured (not Linux)
            peak[kind(key)] = max(peak[kind(key)], gib)
    onsets = d["settings"]["max_onsets"]
    return {"model": d["model"] + (f", {onsets} P0 onsets" if onsets > 1 else ""), "wall": wall, "weights_gib": mem["weights"], "load_gib": mem["at_start"],
            "peak": dict(peak), "steps_s": t["seconds"], "forward_s": t["forward_s"],
            "measured": dict(measured), "predicted": dict(predicted), "seconds": dict(seconds), "eta": eta_errors(t),
            "counted": t["forwards"], "with_grad": t["with_grad"], "slowdown": t["slowdown"],
            "prompts": f"{d['settings']['n_prompts']} x {d['settings']['length']} tokens"}


def table(rows: list[dict], cond: Conditions) -> str:
    lines = [cond.header("analysis_cost.py") + " Each model analysed by `p0circuit analyze` in a fresh process "
             "(the model read from the conversion cache; torch's default OpenMP wait policy). Forwards are *counted* (hooks on every block's attention "
             "and MLP and on the unembedding add up the rows each call runs, in forwards of the batch; a backward is "
             "not counted, the forward work done with gradients is: `p0circuit/patching/work.py`); predicted: the "
             "cost model, before the step ran; the steps' seconds over what the counted work (backwards at twice "
             "their forward) takes at one forward's speed timed in the same run.", "",
             "| model (prompts) | wall time | steps | one forward | " + " | ".join(KINDS) +
             " | total (of it with gradients) | seconds over the count's | the bar's estimate of the total at 25% / 50% / 75% of the time |",
             "|---|---|---|---|" + "---|" * len(KINDS) + "---|---|---|"]
    for r in rows:
        cells = [f"{r['measured'].get(k, 0):.0f} / {r['predicted'].get(k, 0):.0f}" for k in KINDS]
        total = f"{r['counted']:.0f} ({r['with_grad']:.0f}) / {sum(r['predicted'].values()):.0f}"
        eta = " / ".join(f"{v:+.0%}" for v in r["eta"].values())
        lines.append(f"| {r['model']} ({r['prompts']}) | {r['wall']:.0f} s | {r['steps_s']:.0f} s | "
                     f"{r['forward_s']:.2f} s | " + " | ".join(cells) + f" | {total} | {r['slowdown']:.2f}x | {eta} |")
    lines += ["", "Each step kind: counted / predicted forwards of the batch. Seconds per step kind: " + "; ".join(
        f"{r['model']}: " + ", ".join(f"{k} {r['seconds'].get(k, 0):.0f} s" for k in KINDS) for r in rows) + ".", "",
              "Memory, from the same runs (`analysis.json`'s `memory`): the model's own size (parameters and buffers), "
              "the process's resident memory when the steps began (the interpreter, torch and the loaded model), and "
              "each step kind's peak (the largest over its steps; the heap's free pages are returned and the peak "
              "reset before each step, so each is what the process held at most during that step, the model "
              "included; -: not measured):", "",
              "| model | model size | at the start | " + " | ".join(KINDS) + " |", "|---|---|---|" + "---|" * len(KINDS)]
    for r in rows:
        start = "-" if r["load_gib"] is None else f"{r['load_gib']:.2f} GiB"
        lines.append(f"| {r['model']} | {r['weights_gib']:.2f} GiB | {start} | "
                     + " | ".join(f"{r['peak'][k]:.2f} GiB" if r["peak"].get(k) else "-" for k in KINDS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(ROWS), help="model entries, each with analyze options after it")
    ap.add_argument("--out", type=Path, default=Path("runs/analysis_cost"))
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    rows = []
    with Conditions() as cond:
        for entry in args.models:
            rows.append(measure(entry, args.out / "-".join(entry.replace(":", "-").replace("--", "").split())))
            print(json.dumps(rows[-1], default=float))
    publish("docs/performance.md", "analysis-cost", table(rows, cond))


if __name__ == "__main__":
    main()
