"""An honest emergence experiment: does a P0 sink form in tiny no-BOS models trained on the CPU?

Known (science.md): a few million tokens did not form a P0 sink in pilot runs here; the
literature needs ~1e9 tokens at 60M parameters; weight decay and learning rate raise sinks; data
with a real need for a no-op (Bigram-Backcopy: most heads should do nothing on most tokens) should
help. Each recipe trains a model from scratch for a wall-clock budget (the step count comes from a
short timing run, so the cosine schedule ends where the budget does), then the tracker reports,
per checkpoint, Sink_0^0.3, the strongest head's attention to P0 and to the strongest sink
position, the P0 norm ratio and the stage.

Some recipes are *positive controls*: the same task with a BOS token at position 0 (Guo et al. 2024
see a sink form on BOS). If a control forms a sink and the no-BOS recipes do not, the negative
results say "identifying P0 without BOS is the hard part", not "the measurement is blind".
Measured here (docs/guide.md, "Does a P0 sink form in tiny no-BOS models?"): the 1-layer, 1-head,
context-16 control at lr 1e-2 / weight decay 1.0 formed an active-dormant sink in two seeds; no
no-BOS recipe formed a P0 sink, including that recipe without BOS at the same token count.

Results (negative ones included) go to stdout and ``benchmarks/results/emergence.json``; the
checkpoints stay in ``benchmarks/results/emergence/<recipe>/`` for the tracker and notebooks.

``python benchmarks/emergence.py [--minutes M] [--recipes a,b,...] [--threads T]``
(default 20 minutes per recipe, all recipes in sequence; run two processes with ``--threads 1``
and disjoint ``--recipes`` to use two cores).
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TQDM_DISABLE", "1")

from p0circuit import ModelSpec, sink_report  # noqa: E402
from p0circuit.studies.tracking import checkpoint_series, track  # noqa: E402
from p0circuit.studies.training import BigramBackcopy, MarkovSource, TrainConfig, train  # noqa: E402

BASE = dict(data="backcopy", layers=3, heads=4, lr=3e-3, wd=0.5, seq=64, batch=64, pos="rope", bos=False, triggers=3)
RECIPES = {
    # positive control: BOS at position 0
    "control-bos": dict(wd=0.1, bos=True),
    "control-bos-1L1H": dict(wd=0.1, bos=True, layers=1, heads=1),  # the minimal BB setting
    # short contexts: a dormant head that averages its context instead of sinking adds noise ~1/t
    "control-bos-short-ctx": dict(wd=0.1, bos=True, seq=16, batch=256),
    "control-bos-1L1H-short-ctx": dict(wd=0.1, bos=True, layers=1, heads=1, seq=16, batch=256),
    "control-bos-1L1H-short-ctx-lr1e-2-wd1": dict(lr=1e-2, wd=1.0, bos=True, layers=1, heads=1, seq=16, batch=256),
    "backcopy-1L1H-short-ctx": dict(wd=0.1, layers=1, heads=1, seq=16, batch=256),
    # the recipe of the control that formed a sink, without BOS: RoPE, and learned positions
    "backcopy-1L1H-short-ctx-lr1e-2-wd1": dict(lr=1e-2, wd=1.0, layers=1, heads=1, seq=16, batch=256),
    "backcopy-1L1H-short-ctx-lr1e-2-wd1-learned": dict(lr=1e-2, wd=1.0, layers=1, heads=1, seq=16, batch=256,
                                                      pos="learned"),
    # a second run of both with the whole budget on a quiet machine, and the control with another seed
    "backcopy-1L1H-short-ctx-lr1e-2-wd1-long": dict(lr=1e-2, wd=1.0, layers=1, heads=1, seq=16, batch=256),
    "control-bos-1L1H-short-ctx-lr1e-2-wd1-seed1": dict(lr=1e-2, wd=1.0, bos=True, layers=1, heads=1, seq=16,
                                                       batch=256, seed=1),
    # the no-BOS recipes
    "markov": dict(data="markov", wd=0.1),
    "backcopy": dict(),
    "backcopy-short-ctx": dict(seq=16, batch=256),
    "backcopy-1trigger-4L-wd1": dict(layers=4, wd=1.0, triggers=1),
    "backcopy-lr1e-2-wd1": dict(lr=1e-2, wd=1.0),
    "backcopy-nope": dict(pos="nope"),
    "backcopy-learned-pos": dict(pos="learned"),
}
VOCAB = 64
RESULTS = Path(__file__).parent / "results"


def setup(recipe, steps):
    seed = recipe.get("seed", 0)
    bos = VOCAB if recipe["bos"] else None
    if recipe["data"] == "markov":
        source = MarkovSource(VOCAB, k=4, seed=seed, bos=bos)
    else:
        source = BigramBackcopy(VOCAB, n_triggers=recipe["triggers"], seed=seed, bos=bos)
    spec = ModelSpec(n_layers=recipe["layers"], d_model=64, n_heads=recipe["heads"], d_head=64 // recipe["heads"], d_mlp=256,
                     d_vocab=VOCAB + (1 if bos is not None else 0), n_ctx=recipe["seq"], pos=recipe["pos"], seed=seed)
    config = TrainConfig(steps=steps, batch_size=recipe["batch"], seq_len=recipe["seq"], lr=recipe["lr"],
                         warmup=min(200, max(1, steps // 20)), weight_decay=recipe["wd"], n_checkpoints=10,
                         device="cpu")
    return spec, source, config


def steps_for(recipe, minutes):
    """Steps that fit the budget, from a 30-step timing run (training time only)."""
    spec, source, config = setup(recipe, 30)
    with tempfile.TemporaryDirectory() as tmp:
        train(spec, source, config, tmp, progress=False)  # warm-up of kernels and caches
        shutil.rmtree(tmp)
        t = time.perf_counter()
        train(spec, source, config, tmp, progress=False)
        per_step = (time.perf_counter() - t) / 30
    return max(100, int(minutes * 60 / per_step * 0.9)), per_step


def run(name, recipe, minutes):
    steps, per_step = steps_for(recipe, minutes)
    spec, source, config = setup(recipe, steps)
    out = RESULTS / "emergence" / name
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    model = train(spec, source, config, out, progress=False)
    seconds = time.perf_counter() - t
    seq = recipe["seq"]
    probe = source.batch(10**6, 32, seq)
    frame = track(checkpoint_series(out), probe)
    report = sink_report(model, probe)
    losses = {int(p.name[5:]): json.loads((p / "spec.json").read_text())["loss"] for p in out.glob("step_*")}
    uniform = sum(1 / (t + 1) for t in range(seq)) / seq  # alpha_0 of a head attending uniformly
    return {
        "recipe": name, **recipe, "steps": steps, "tokens": steps * recipe["batch"] * seq, "seconds": seconds,
        "seconds_per_step": per_step, "final_loss": losses[steps],
        "final_sink_rate": report.sink_rate, "final_max_alpha0": max(max(a) for a in report.alpha),
        "uniform_alpha0": uniform, "final_sink_position": report.sink_position,
        "final_sink_position_alpha": report.sink_position_max_alpha,
        "final_max_norm_ratio": max(report.norm_ratio_resid), "final_stage": frame["stage"].iloc[-1],
        "track": [{**row, "loss": losses[row["step"]]} for row in frame.reset_index()[
            ["step", "sink_rate", "sink_position", "max_norm_ratio", "stage"]].to_dict("records")],
    }


def entropy_floor(recipe, n=256):
    """The loss of a perfect predictor (mean conditional entropy over the predicted positions)."""
    from p0circuit.studies.training.data import _transitions

    _, source, _ = setup({**BASE, **recipe}, 1)
    probs = _transitions(VOCAB, 4, recipe.get("seed", 0))
    h = -(probs * probs.clamp_min(1e-12).log()).sum(1)  # entropy of the next token per token
    rows = source.batch(10**7, n, recipe["seq"])
    prev = rows[:, :-1]
    ent = h[prev.clamp_max(VOCAB - 1)]
    if recipe["data"] == "backcopy":
        trig = prev < recipe["triggers"]
        trig[:, 0] = False  # position 1 is never a copy
        if recipe["bos"]:
            trig[:, 1] = False  # the first data token follows BOS, the second is never a copy
        ent = torch.where(trig, torch.zeros_like(ent), ent)
    if recipe["bos"]:  # the first data token is drawn uniformly (from the non-trigger tokens for backcopy)
        first = VOCAB - (recipe["triggers"] if recipe["data"] == "backcopy" else 0)
        ent[:, 0] = math.log(first)
    return float(ent.mean())


def table(records):
    """The results as a Markdown table (``--table``)."""
    lines = ["| recipe | BOS | layers x heads | ctx | lr / wd | tokens | loss (floor) | Sink_0^0.3 | max alpha_0 (uniform) "
             "| P0 norm ratio | stage |", "|" + "---|" * 11]
    for r in records:
        lines.append(
            f"| {r['recipe']} | {'yes' if r['bos'] else 'no'} | {r['layers']}x{r.get('heads', 4)} {r['pos']} | {r['seq']} "
            f"| {r['lr']:g} / {r['wd']:g} | {r['tokens'] / 1e6:.1f}M | {r['final_loss']:.3f} ({entropy_floor(r):.3f}) "
            f"| {r['final_sink_rate']:.2f} | {r['final_max_alpha0']:.3f} ({r['uniform_alpha0']:.3f}) "
            f"| {r['final_max_norm_ratio']:.2f} | {r['final_stage']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0, help="training budget per recipe")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--table", action="store_true", help="print the collected results as a Markdown table and exit")
    args = ap.parse_args()
    if args.table:
        print(table([{**BASE, **json.loads(p.read_text())} for p in sorted((RESULTS / "emergence").glob("*.json"))]))
        return 0
    torch.set_num_threads(args.threads)
    names = args.recipes.split(",")
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        ap.error(f"unknown recipes {unknown}; known: {', '.join(RECIPES)}")
    RESULTS.mkdir(exist_ok=True)
    for name in names:
        r = run(name, {**BASE, **RECIPES[name]}, args.minutes)
        print(f"{name}: {r['tokens'] / 1e6:.1f}M tokens, {r['steps']} steps in {r['seconds']:.0f}s, loss "
              f"{r['final_loss']:.3f}; Sink_0^0.3={r['final_sink_rate']:.3f}, max alpha_0={r['final_max_alpha0']:.3f} "
              f"(uniform {r['uniform_alpha0']:.3f}), strongest sink at position {r['final_sink_position']} "
              f"(alpha {r['final_sink_position_alpha']:.3f}), max P0 norm ratio={r['final_max_norm_ratio']:.2f}, "
              f"stage={r['final_stage']}", flush=True)
        # one file per recipe, so parallel processes never write the same file
        (RESULTS / "emergence").mkdir(exist_ok=True)
        (RESULTS / "emergence" / f"{name}.json").write_text(json.dumps(r, indent=2))
    collected = [json.loads(p.read_text()) for p in sorted((RESULTS / "emergence").glob("*.json"))]
    (RESULTS / "emergence.json").write_text(json.dumps(collected, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
