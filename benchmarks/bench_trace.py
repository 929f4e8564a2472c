"""What a model's first patching call pays once (issue 52): the hook-order trace (``p0circuit/patching/order.py``),
by parts and whole, counted (``patching/work.py``: rows and weight passes) and timed, and a first node patch
against a second, per model, each model in a fresh process.

Per model: load it, one plain forward of 8 English prompts x 24 tokens, then (in this order) a node patch at
P0 of every head and MLP (``NormRatio`` after block 2, shift; the first call, which traces), a second one,
the trace by parts again and the whole-model trace, each timed and counted, with plain forwards of the batch
timed before and after (the unit: their median). ``--write-docs`` writes docs/performance.md's block.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record import Conditions, publish  # noqa: E402

MODELS = {"smollm2": "SmolLM2-135M", "gemma3": "Gemma 3 270M"}


def child(name: str) -> dict:
    import torch

    import p0circuit as p0
    from p0circuit.patching import NormRatio, order, work

    torch.set_grad_enabled(False)
    model = getattr(p0, f"load_{name}")()
    tokens = p0.english_prompts(model, 8, 24, prepend_bos=False)
    rows = tokens.numel()

    def forward():
        t = time.perf_counter()
        model(tokens)
        return time.perf_counter() - t

    forward()
    forwards = [forward() for _ in range(3)]
    nodes = p0.candidate_nodes(model, rest=False)

    def counted(fn):
        with work.Count(model) as c:
            t = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t
        return {"s": seconds, "rows": c.forwards(rows), "passes": c.passes()}

    def patch():
        p0.activation_patch(model, tokens, nodes=nodes, corruption="shift", metric=NormRatio(2))

    out = {"first": counted(patch), "second": counted(patch), "parts": counted(lambda: order.trace(model)),
           "whole": counted(lambda: order.trace(model, whole=True)),
           "structures": len(set((order.structures(model) or {}).values())), "layers": model.cfg.n_layers}
    forwards += [forward() for _ in range(3)]
    unit = statistics.median(forwards)
    for key in ("first", "second", "parts", "whole"):
        out[key]["forwards_timed"] = out[key]["s"] / unit
    out["forward_s"] = unit
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per model, the models interleaved")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1"), "OMP_WAIT_POLICY": "PASSIVE",
           "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    runs: dict[str, list] = {}
    with Conditions() as cond:
        for _ in range(args.reps):
            for name in args.models.split(","):
                out = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True,
                                     text=True, timeout=1800)
                if out.returncode:
                    raise RuntimeError(out.stderr[-3000:])
                r = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault(name, []).append(r)
                print(name, {k: r[k] for k in ("first", "second", "parts", "whole")}, flush=True)
    (Path(__file__).parent / "results").mkdir(exist_ok=True)
    (Path(__file__).parent / "results" / "trace.json").write_text(json.dumps(runs, indent=1))

    def med(name, key, field):
        return statistics.median(r[key][field] for r in runs[name])

    lines = [f"{cond.header('bench_trace.py')} 8 x 24 tokens, one torch thread, `OMP_WAIT_POLICY=PASSIVE`, "
             f"{args.reps} fresh processes per model (medians); timed in forwards of the batch timed in the same "
             "process; counted: rows and weight passes in forwards (`patching/work.py`).", "",
             "| model | blocks (structures) | trace by parts: timed / counted rows + passes | whole-model trace: "
             "timed / counted | first node patch at P0 / second (timed) | first - second, counted |",
             "|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        extra = statistics.median((r["first"]["rows"] + r["first"]["passes"]) - (r["second"]["rows"] + r["second"]["passes"])
                                  for r in rs)
        lines.append(f"| {MODELS[name]} | {rs[0]['layers']} ({rs[0]['structures']}) | "
                     f"{med(name, 'parts', 'forwards_timed'):.3f} / {med(name, 'parts', 'rows') + med(name, 'parts', 'passes'):.3f} | "
                     f"{med(name, 'whole', 'forwards_timed'):.2f} / {med(name, 'whole', 'rows') + med(name, 'whole', 'passes'):.2f} | "
                     f"{statistics.median(r['first']['s'] / r['second']['s'] for r in rs):.2f}x | {extra:.3f} |")
    publish("docs/performance.md", "one-time", "\n".join(lines))


if __name__ == "__main__":
    main()
