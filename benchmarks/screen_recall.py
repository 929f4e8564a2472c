"""The analysis' node screen against exact patching, where the analysis uses it: SmolLM2's second P0 onset
(block 11), with and without BOS, for the norm ratio (the onset's node pass) and for the sink heads' attention
to P0 (the sink's own circuit, block 12), on the analysis' own prompts, corruption and settings.

For each case: the nodes exact activation patching of every candidate keeps at the analysis' threshold, the
share of them the screen keeps (recall), the largest exact |effect| the screen left unexamined, the time of
each, and the faithful-circuit search run on each result (its size, whether it is faithful, its faithfulness,
evaluations) and the nodes the two circuits share: the search is greedy, and the screen changes its order.

    python benchmarks/screen_recall.py [--write-docs]      # about 3 minutes on 2 quiet cores
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import p0circuit as p0
from p0circuit.core.defaults import SINK_EPS
from p0circuit.studies.analysis import steps
from p0circuit.studies.analysis.setting import Setting
from p0circuit.studies.experiments.reads import first_readers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Conditions, publish  # noqa: E402

LAYER = 11
"""SmolLM2's second P0 onset: 240 candidate nodes, over the analysis' ``exact_nodes`` (the first, block 2, has 60)."""


def case(model, toks, bos, corruption, label, metric, depth, s, include=()):
    t = time.perf_counter()
    setup = p0.Setup.of(model, toks, corruption=corruption, metric=metric, bos=bos)
    exact, _ = steps.nodes(setup, depth, s.threshold, 0, s.seed)
    t_exact = time.perf_counter() - t
    t = time.perf_counter()
    screened, summary = steps.nodes(setup, depth, s.threshold, s.exact_nodes, s.seed, include=include)
    t_screen = time.perf_counter() - t
    if not summary["screen"]:
        raise SystemExit(f"{label}: {summary['candidates']} candidates are not screened at exact_nodes={s.exact_nodes}")
    truth = set(exact.kept(s.threshold))
    found = {n for n, v in screened.normalized.items() if math.isfinite(v) and abs(v) >= s.threshold}
    unexamined = [n for n, v in screened.normalized.items() if math.isnan(v)]
    missed = sorted(((n, exact.normalized[n]) for n in unexamined), key=lambda kv: -abs(kv[1]))
    norm = isinstance(metric, p0.NormRatio)  # the sink's circuit asks faithfulness alone (sink_circuit's docstring)
    circuits = [steps.circuit(r, None, require_denoising=norm) for r in (exact, screened)]
    shared = set(circuits[0].get("nodes", [])) & set(circuits[1].get("nodes", []))
    row = {"case": f"{'with' if bos else 'without'} BOS, {label}", "candidates": summary["candidates"],
           "exact_keeps": len(truth), "screen_keeps": len(found), "recall": len(truth & found) / len(truth) if truth else 1.0,
           "missed": [(n, round(v, 3)) for n, v in missed if abs(v) >= s.threshold],
           "unexamined_max": abs(missed[0][1]) if missed else 0.0, "exact_s": t_exact, "screen_s": t_screen,
           "circuits": [{k: c.get(k) for k in ("size", "faithful", "faithfulness", "why")} |
                        {"evaluations": c.get("settings", {}).get("evaluations")} for c in circuits],
           "shared": len(shared), "included": summary["screen"].get("included", 0),
           "top_patched": summary["screen"]["exact_top"],
           "screened_circuit": circuits[1].get("nodes") or list(summary["nodes"])}
    print(json.dumps(row, default=float), flush=True)
    return row


def measure(s):
    model = p0.load_smollm2()
    p0.set_bos(model, "<|endoftext|>")  # the analysis' start token for SmolLM2 (its own is a chat marker)
    rows = []
    for bos in (False, True):
        setting = Setting(model, s, bos)
        toks = setting.prompts()
        shift = p0.Setup.of(model, toks, corruption=steps.get_corruption("shift", seed=s.seed), metric=p0.NormRatio(LAYER),
                            bos=bos)
        corruption = steps.choose(shift, ("swap", "shift"), s.seed)[0].corruption if bos else shift.corruption
        alpha = steps.sinks(setting, toks)[1]["alpha"]
        heads = first_readers(alpha, LAYER, SINK_EPS)
        rows.append(case(model, toks, bos, corruption, f"norm ratio at block {LAYER}", p0.NormRatio(LAYER), LAYER, s))
        # as the analysis does: the sink pass patches the (screened) norm circuit's nodes exactly too
        rows.append(case(model, toks, bos, corruption, f"the sink heads' attention to P0 (block {max(l for l, _ in heads)})",
                         p0.AttnToP0(heads=heads), max(l for l, _ in heads), s, include=rows[-1]["screened_circuit"]))
    return rows


def table(rows, cond, s) -> str:
    out = [cond.header("screen_recall.py") + f" SmolLM2-135M, the analysis' prompts ({s.n_prompts} x {s.length} tokens), "
           f"its corruption (shift without BOS; with BOS the one it chooses), the onset at block {LAYER}; the screen: "
           f"attribution over every candidate, then exact patching of the strongest estimates (the {steps.SCREEN_LEAST} "
           f"strongest, and of the next up to {steps.SCREEN_TOP} those at |estimate| >= {steps.SCREEN_FLOOR * s.threshold:g}: "
           f"'top patched') and {steps.SCREEN_SAMPLE} others drawn at random (for the sink's attention, as in the "
           f"analysis, also the norm circuit's nodes: the count in brackets); kept: |normalized effect| >= {s.threshold}. Circuits: "
           "the faithful-circuit search on each result (size, faithfulness; * faithful within the 20-node budget).", "",
           "| case | candidates | top patched | exact keeps | screen keeps | recall | kept nodes it missed (exact effect) | largest exact "
           "effect unexamined | time exact / screen | circuit on exact | circuit on screen | nodes shared |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = ["{}{} ({:.3f})".format(x["size"], "*" if x["faithful"] else "", x["faithfulness"]) for x in r["circuits"]]
        more = f" (+{r['included']})" if r["included"] else ""
        out.append(f"| {r['case']}{more} | {r['candidates']} | {r['top_patched']} | {r['exact_keeps']} | {r['screen_keeps']} | {r['recall']:.2f} | "
                   f"{', '.join(f'{n} ({v:+.2f})' for n, v in r['missed']) or 'none'} | {r['unexamined_max']:.3f} | "
                   f"{r['exact_s']:.1f} s / {r['screen_s']:.1f} s | {c[0]} | {c[1]} | {r['shared']} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/performance.md")
    ap.parse_args()
    s = p0.AnalysisSettings()
    torch.set_grad_enabled(False)
    with Conditions() as cond:
        rows = measure(s)
    publish("docs/performance.md", "screen-recall", table(rows, cond, s))


if __name__ == "__main__":
    main()
