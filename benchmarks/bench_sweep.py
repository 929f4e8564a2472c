"""Benchmark: a full position-aware activation-patching sweep, p0circuit vs TransformerLens.

Every head output and every MLP output at every position is patched (denoising a resampled
prompt, TransformerLens' convention), on a 4-layer and a 12-layer model, side by side in one run:

* ``tl``: ``transformer_lens.patching.get_act_patch_attn_head_out_by_pos`` + ``get_act_patch_mlp_out``;
* ``ours``: ``p0circuit.activation_patch`` (batched patches, forwards start at the patched layer);
* ``ideal``: the token-layer-forwards the sweep needs, with no patching at all: a node at
  (layer l, position p) changes block l's output only at p and, under the causal mask, nothing
  before p, so blocks l+1.. and the unembedding must run on positions p..; timed as plain batched
  forwards of those suffixes (without the prefix keys they attend to: a lower bound), in chunks of
  the same size as ours.

Goals (issue 3): ours >= 5x faster than tl, ours <= 1.5x ideal, and peak memory of the sweep <= 2x
one ``run_with_cache`` of the same batch (peak live tensor bytes, :mod:`memtrack`).
Results go to stdout and ``benchmarks/results/sweep.json`` (git-ignored). Run:
``python benchmarks/bench_sweep.py`` (``--quick`` for a smaller run).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens' sweeps draw progress bars

import torch
from transformer_lens import patching as tl_patching

import p0circuit as p0
from p0circuit import Kind, ModelSpec, Node
from p0circuit.patching import Resample

sys.path.insert(0, str(Path(__file__).parent))
from memtrack import PeakMemory  # noqa: E402
from record import Conditions, publish  # noqa: E402

SIZES = {
    "4-layer": dict(n_layers=4, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=512, n_ctx=64),
    "12-layer": dict(n_layers=12, d_model=256, n_heads=8, d_head=32, d_mlp=1024, d_vocab=1024, n_ctx=64),
}


def logit_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


def setup(size, batch, seq):
    model = ModelSpec(**SIZES[size], seed=0).build()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.cfg.d_vocab, (batch, seq), generator=gen)
    corrupt = torch.randint(0, model.cfg.d_vocab, (batch, seq), generator=gen)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    nodes = [Node(Kind.HEAD, l, h, p) for l in range(L) for p in range(seq) for h in range(H)]
    nodes += [Node(Kind.MLP, l, pos=p) for l in range(L) for p in range(seq)]
    return model, clean, corrupt, nodes


def run_tl(model, clean, corrupt):
    _, cache = model.run_with_cache(clean)
    heads = tl_patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, logit_diff)
    mlps = tl_patching.get_act_patch_mlp_out(model, corrupt, cache, logit_diff)
    return heads, mlps


def run_ours(model, clean, corrupt, nodes, rows=None):
    return p0.activation_patch(model, clean, nodes=nodes, corruption=Resample(tokens=corrupt), metric=p0.LogitMetric(logit_diff),
                               direction="denoise", min_signal=0, rows_per_forward=rows)


@torch.no_grad()
def run_ideal(model, clean, corrupt, nodes, rows, stop=None):
    """The token-layer-forwards the sweep needs, as plain batched forwards: a node at (layer l,
    position p) changes block l's output only at p, and under the causal mask nothing before p,
    so blocks l+1.. (up to ``stop``, when the metric reads no later block) must run on positions
    p.. (here without even the prefix keys to attend to)."""
    _, cache = model.run_with_cache(corrupt, names_filter=lambda n: n.endswith("hook_resid_post"), stop_at_layer=stop)
    batch = clean.shape[0]
    per_cell = {}
    for n in nodes:
        per_cell[(n.layer, n.pos)] = per_cell.get((n.layer, n.pos), 0) + 1
    per_chunk = max(1, rows // batch)
    for (layer, pos), count in per_cell.items():
        if stop is not None and layer + 1 >= stop:
            continue  # the metric reads this block's output: no forward
        resid = cache[p0.hooks.resid_post(layer)][:, pos:]
        for c in range(0, count, per_chunk):
            k = min(per_chunk, count - c)
            model(resid.repeat(k, 1, 1), start_at_layer=layer + 1, stop_at_layer=stop)


def timed(fn, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def peak_mib(fn):
    """Peak live tensor memory (MiB) that ``fn`` allocates."""
    with PeakMemory() as tracker:
        result = fn()
    del result
    return tracker.peak_bytes / 2**20


def table(results: dict, cond: Conditions) -> str:
    """The docs' table of this run."""
    first = next(iter(results.values()))
    rows = [f"{cond.header('bench_sweep.py')} Batch {first['batch']} x {first['seq']} tokens; the largest difference "
            f"from TransformerLens' values: {max(r['max_abs_diff_vs_tl'] for r in results.values()):.1e}.", "",
            "| model | nodes | TransformerLens | p0circuit | speed-up | vs. ideal | peak memory vs. one `run_with_cache` |",
            "|---|---|---|---|---|---|---|"]
    for size, r in results.items():
        c = SIZES[size]
        rows.append(f"| {c['n_layers']} layers, d={c['d_model']} | {r['nodes']} | {r['tl_s']:.3g} s | {r['ours_s']:.3g} s "
                    f"| {r['speedup_vs_tl']:.1f}x | {r['ratio_to_ideal']:.2f}x | {r['mem_ratio']:.2f}x |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    batch, seq = (4, 8) if args.quick else (8, 16)
    results = {}
    ok = True
    with Conditions() as cond:
        for size in SIZES:
            model, clean, corrupt, nodes = setup(size, batch, seq)
            rows = 8 * batch
            ours_res = run_ours(model, clean, corrupt, nodes)
            heads, mlps = run_tl(model, clean, corrupt)
            diff = max(
                max(abs(ours_res.raw[f"A{n.layer}.H{n.head}@{n.pos}"] - float(heads[n.layer, n.pos, n.head]))
                    for n in nodes if n.kind == Kind.HEAD),
                max(abs(ours_res.raw[f"M{n.layer}@{n.pos}"] - float(mlps[n.layer, n.pos])) for n in nodes if n.kind == Kind.MLP),
            )
            t_tl = timed(lambda: run_tl(model, clean, corrupt))
            t_ours = timed(lambda: run_ours(model, clean, corrupt, nodes), repeats=2)
            t_ideal = timed(lambda: run_ideal(model, clean, corrupt, nodes, rows), repeats=2)
            m_cache = peak_mib(lambda: model.run_with_cache(clean))
            m_ours = peak_mib(lambda: run_ours(model, clean, corrupt, nodes))
            r = {
                "nodes": len(nodes), "batch": batch, "seq": seq, "max_abs_diff_vs_tl": diff,
                "tl_s": t_tl, "ours_s": t_ours, "ideal_s": t_ideal,
                "speedup_vs_tl": t_tl / t_ours, "ratio_to_ideal": t_ours / t_ideal,
                "peak_mem_cache_mib": m_cache, "peak_mem_sweep_mib": m_ours,
                "mem_ratio": m_ours / max(m_cache, 1e-9),
            }
            r["pass"] = bool(r["speedup_vs_tl"] >= 5 and r["ratio_to_ideal"] <= 1.5 and r["mem_ratio"] <= 2
                             and diff <= 1e-4)
            ok &= r["pass"]
            results[size] = r
            print(f"{size}: {len(nodes)} nodes, batch {batch}x{seq}: tl {t_tl:.2f}s, ours {t_ours:.2f}s, ideal {t_ideal:.2f}s "
                  f"-> {r['speedup_vs_tl']:.1f}x faster than TL, {r['ratio_to_ideal']:.2f}x ideal; peak memory "
                  f"{m_ours:.1f} MiB vs run_with_cache {m_cache:.1f} MiB ({r['mem_ratio']:.2f}x); max |diff| vs TL {diff:.2e}"
                  f" -> {'PASS' if r['pass'] else 'FAIL'}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(results, indent=2))
    if not args.quick:
        publish("docs/performance.md", "sweep", table(results, cond))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
