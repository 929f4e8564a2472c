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
(sink report, activation and path patching) against ``run_with_cache``; and a neuron scan read at
P0 (every neuron of blocks 0-2 against the massive dimension 507 after block 2, ``ResidDim``): the
fast path runs position 0 alone; it is compared with the same engine reading every position, a
hand loop with ``stop_at_layer`` (the researcher's version, timed on 96 neurons and scaled) and the
layer-forward limit at P0 (``--neurons-only`` runs just this).
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
from p0circuit.studies.discovery.session import run_discovery
from p0circuit.models.gguf import load_smollm2
from p0circuit.models.resolve import Resolved
from p0circuit.patching import Resample

sys.path.insert(0, str(Path(__file__).parent))
from bench_sweep import run_ideal  # noqa: E402  (the same layer-forward limit as the toy benchmark)
from memtrack import PeakMemory  # noqa: E402
from record import Conditions, publish  # noqa: E402

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


class EveryPosition(p0.ResidDim):
    """ResidDim without its declared last position: the engine runs every position, as before."""

    def last_position(self, p0_index):
        return None


def hand_loop(model, clean, corrupt_cache, neurons, dim):
    """What a researcher writes: one hooked forward per neuron, stopped after block LAYER."""
    out = {}
    for n in neurons:
        name = p0.hooks.mlp_post(n.layer)
        value = corrupt_cache[name][:, n.pos + 1, n.neuron]  # shift: clean position p is p + 1

        def patch(act, hook, value=value, n=n):
            act[:, n.pos, n.neuron] = value
            return act

        seen = {}
        model.run_with_hooks(clean, fwd_hooks=[(name, patch), (p0.hooks.resid_post(LAYER),
                                                               lambda act, hook: seen.__setitem__("h", act))],
                             stop_at_layer=LAYER + 1)
        out[n.name] = float(seen["h"][:, 0, dim].float().mean())
    return out


def p0_limit(model, clean, neurons, rows):
    """The layer-forward limit of a scan read at P0: for each neuron, the blocks after its own up to
    LAYER on position 0 alone, as plain batched forwards of the same chunk size (no patching)."""
    _, cache = model.run_with_cache(clean, stop_at_layer=LAYER + 1)
    per = max(1, rows // clean.shape[0])
    for layer in sorted({n.layer for n in neurons}):
        if layer + 1 > LAYER:
            continue  # the metric reads this block's output: no forward at all
        count = sum(n.layer == layer for n in neurons)
        start = cache[p0.hooks.resid_pre(layer + 1)][:, :1]
        for c in range(0, count, per):
            model(start.repeat(min(per, count - c), 1, 1), start_at_layer=layer + 1, stop_at_layer=LAYER + 1)


def neuron_scan(model, clean, device, dim=507, sample=96):
    """Every neuron of blocks 0..LAYER at P0 against ResidDim(LAYER, dim) (the massive dimension),
    shift corruption: p0circuit (forwards stop at P0), the same engine reading every position, a
    hand loop with stop_at_layer (timed on ``sample`` neurons, scaled), and the P0 limit."""
    neurons = p0.candidate_neurons(model, range(LAYER + 1), positions=(0,))
    filler = 13  # one explicit filler token, so the hand loop builds the same shifted prompts itself
    kw = dict(nodes=neurons, corruption=p0.Shift(filler=(filler,)), min_signal=0)
    forward = timed(lambda: model(clean), device, repeats=3)
    ours = p0.activation_patch(model, clean, metric=p0.ResidDim(LAYER, dim), **kw)
    t_ours = timed(lambda: p0.activation_patch(model, clean, metric=p0.ResidDim(LAYER, dim), **kw), device, repeats=2)
    t_every = timed(lambda: p0.activation_patch(model, clean, metric=EveryPosition(LAYER, dim), **kw), device)
    _, corrupt_cache = model.run_with_cache(torch.cat([torch.full_like(clean[:, :1], filler), clean], dim=1))
    picked = neurons[:: max(1, len(neurons) // sample)][:sample]
    t = time.perf_counter()
    hand = hand_loop(model, clean, corrupt_cache, picked, dim)
    sync(device)
    t_hand = (time.perf_counter() - t) * len(neurons) / len(picked)
    rows = 8 * clean.shape[0]
    t_limit = timed(lambda: p0_limit(model, clean, neurons, rows), device, repeats=2)
    diff = max(abs(ours.raw[k] - v) for k, v in hand.items())
    return {"neurons": len(neurons), "neuron_scan_s": t_ours, "neuron_scan_in_forwards": t_ours / forward,
            "every_position_s": t_every, "speedup_vs_every_position": t_every / t_ours,
            "hand_loop_s_scaled": t_hand, "speedup_vs_hand_loop": t_hand / t_ours, "p0_limit_s": t_limit,
            "ratio_to_p0_limit": t_ours / t_limit, "max_abs_diff_vs_hand_loop": diff,
            "scale": abs(ours.clean_metric), "forward_s": forward}


def print_scan(scan):
    print(f"  neuron scan at P0 ({scan['neurons']} neurons, ResidDim({LAYER}, 507)): {scan['neuron_scan_s']:.2f}s "
          f"({scan['neuron_scan_in_forwards']:.1f} forwards); reading every position {scan['every_position_s']:.2f}s "
          f"({scan['speedup_vs_every_position']:.1f}x slower); hand loop with stop_at_layer {scan['hand_loop_s_scaled']:.0f}s "
          f"scaled ({scan['speedup_vs_hand_loop']:.0f}x slower); {scan['ratio_to_p0_limit']:.2f}x the P0 limit; "
          f"max |diff| vs the hand loop {scan['max_abs_diff_vs_hand_loop']:.1e} (values ~{scan['scale']:.0f})")


def scan_passes(scan):
    return bool(scan["speedup_vs_hand_loop"] >= 10 and scan["max_abs_diff_vs_hand_loop"] <= 1e-5 * max(1.0, scan["scale"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="4 x 12 tokens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--neurons-only", action="store_true", help="only the neuron scan read at P0")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/performance.md")
    args = ap.parse_args()
    with Conditions() as cond:
        r = measure(args)
    if not args.quick:
        if not args.neurons_only:
            publish("docs/performance.md", f"real-{args.device}", real_table(r, cond))
        publish("docs/performance.md", f"neuron-scan-{args.device}", scan_text(r["neuron_scan"], r, cond))
    sys.exit(0 if r["pass"] else 1)


def measure(args) -> dict:
    torch.set_grad_enabled(False)
    batch, seq = (4, 12) if args.quick else (8, 24)
    t = time.perf_counter()
    model = load_smollm2(device=args.device)
    load_s = time.perf_counter() - t
    clean = p0.probe_tokens(model, batch, seq, seed=0, regular=True)
    if args.neurons_only:
        scan = neuron_scan(model, clean, args.device)
        print(f"SmolLM2 {batch}x{seq}, {args.device}; one forward {scan['forward_s']:.3f}s")
        print_scan(scan)
        print("PASS" if scan_passes(scan) else "FAIL")
        return {"device": args.device, "batch": batch, "seq": seq, "neuron_scan": scan, "pass": scan_passes(scan)}
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
        "neuron_scan": neuron_scan(model, clean, args.device),
    }
    r["pass"] = bool(r["speedup_vs_tl"] >= 10 and r["ratio_to_limit"] <= 1.3 and diff <= 1e-4
                     and r["sink_report_in_forwards"] <= 2 and r["discovery_mem_ratio"] <= 2
                     and scan_passes(r["neuron_scan"]))
    print(f"SmolLM2 {batch}x{seq}, {len(nodes)} nodes ({len(reachable)} can reach NormRatio({LAYER})), "
          f"{args.device}; load {load_s:.1f}s; one forward {forward:.3f}s")
    print(f"  ours {t_ours:.2f}s ({r['ours_in_forwards']:.1f} forwards), TransformerLens {t_tl:.1f}s on the reachable "
          f"nodes ({r['tl_in_forwards']:.0f} forwards), limit {t_limit:.2f}s")
    print(f"  -> {r['speedup_vs_tl']:.0f}x faster than TransformerLens, {r['ratio_to_limit']:.2f}x the layer-forward limit; "
          f"max |diff| vs TL {diff:.1e}; inert nodes {inert:.1e}; peak memory {r['peak_mem_ours_mib']:.0f} MiB vs "
          f"run_with_cache {r['peak_mem_cache_mib']:.0f} MiB ({r['mem_ratio']:.2f}x)")
    print(f"  sink_report {t_report:.2f}s ({r['sink_report_in_forwards']:.2f} forwards); a sweep cell's discovery "
          f"(report, activation, path) peaks at {r['peak_mem_discovery_mib']:.0f} MiB ({r['discovery_mem_ratio']:.2f}x "
          f"run_with_cache)")
    print_scan(r["neuron_scan"])
    print("PASS" if r["pass"] else "FAIL")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"real_{args.device}.json").write_text(json.dumps(r, indent=2))
    return r


def real_table(r: dict, cond: Conditions) -> str:
    """The docs' account of the full run."""
    n, reach = r["nodes"], r["reachable"]
    return "\n".join([
        f"{cond.header('bench_real.py', r['device'])} {r['batch']} x {r['seq']} tokens, NormRatio({LAYER}), "
        "denoising a resampled prompt:", "",
        "| | time | in forwards of the batch |", "|---|---|---|",
        f"| one plain forward | {r['forward_s']:.3f} s | 1 |",
        f"| p0circuit, all {n} nodes | {r['ours_s']:.3g} s | {r['ours_in_forwards']:.1f} |",
        f"| layer-forward limit of the {reach} nodes that can reach the metric | {r['limit_s']:.3g} s | "
        f"{r['limit_s'] / r['forward_s']:.1f} |",
        f"| TransformerLens `generic_activation_patch`, the {reach} reachable nodes only | {r['tl_s']:.1f} s | "
        f"{r['tl_in_forwards']:.0f} |", "",
        f"p0circuit is {r['speedup_vs_tl']:.0f}x faster than TransformerLens on the reachable nodes alone, "
        f"{r['ratio_to_limit']:.2f}x the layer-forward limit, with values equal to {r['max_abs_diff_vs_tl']:.1e} and the "
        f"{n - reach} unreachable nodes at {r['max_inert_effect']:.1g}; its peak memory is "
        f"{r['peak_mem_ours_mib']:.0f} MiB against {r['peak_mem_cache_mib']:.0f} MiB for one `run_with_cache`, and "
        f"what one sweep cell runs (sink report, activation and path patching) peaks at "
        f"{r['discovery_mem_ratio']:.2f}x of it. `sink_report` costs {r['sink_report_in_forwards']:.2f} forwards."])


def scan_text(scan: dict, r: dict, cond: Conditions) -> str:
    """The docs' account of the neuron scan read at P0."""
    return (f"{cond.header('bench_real.py' + (' --neurons-only' if 'nodes' not in r else ''), r['device'])} "
            f"Every neuron of blocks 0-{LAYER} at P0 ({scan['neurons']} neurons, {r['batch']} x {r['seq']} tokens, "
            f"`ResidDim({LAYER}, 507)`, shift): {scan['neuron_scan_s']:.2g} s ({scan['neuron_scan_in_forwards']:.1f} "
            f"forwards of the batch) against {scan['every_position_s']:.3g} s for the same engine reading every "
            f"position ({scan['speedup_vs_every_position']:.1f}x), {scan['hand_loop_s_scaled']:.0f} s for a hand loop "
            f"of `run_with_hooks(..., stop_at_layer={LAYER + 1})` per neuron (timed on a sample and scaled; "
            f"{scan['speedup_vs_hand_loop']:.0f}x), and {scan['ratio_to_p0_limit']:.2f}x the layer-forward limit at "
            f"P0; values equal the hand loop's to {scan['max_abs_diff_vs_hand_loop']:.1e} on values near "
            f"{scan['scale']:.0f}.")


if __name__ == "__main__":
    main()
