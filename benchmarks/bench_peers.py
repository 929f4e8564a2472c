"""What a researcher would write instead, timed beside p0circuit on the analysis' own work
(SmolLM2-135M, 16 English prompts x 24 tokens, no BOS, metric = the P0 norm ratio after block 2,
corruption = the prompt shifted by one token, token-aligned). Needs ``.[real]``; nnsight is used when
installed (``pip install -e ".[peers]"``).

Three workloads, each patched exactly by every tool, with the values compared:

* ``nodes``: every head and MLP output at P0 in blocks 0-2 (30 nodes);
* ``edges``: the path-patching edges of the analysis at that onset (senders = the nodes it keeps,
  receivers = their MLP inputs and the key/value heads' q/k/v inputs up to block 2);
* ``neurons``: every neuron at P0 of the MLPs of blocks 0-2 (4,608).

Tools:

* ``ours``: ``p0circuit.activation_patch`` / ``path_patch``;
* ``tl_loop``: a hand loop over TransformerLens ``run_with_hooks(..., stop_at_layer=3)``, one forward of
  the batch per patch from the embedding (the loop a TransformerLens user writes);
* ``nnsight``: the same loop in nnsight (``NNsight(model).trace`` with a write at the patched module
  and ``tracer.stop()`` after block 2), one trace per patch;
* ``limit``: the layer-forward limit: for each patch only the blocks after the patched one (for a q/k/v
  receiver, from its own block; for a head or an MLP-input receiver, its own block's MLP first) up to
  block 2, on the positions from the patched one on, batched like ours, without the prefix keys those
  positions attend to: a lower bound no exact method can beat.

Also the neuron screen of the analysis (integrated gradients, 4 points per MLP, then exact patching of
the top 32) against full exact patching: its cost and its recall of the neurons whose exact effect is
>= 0.1, on SmolLM2 and Gemma 3 270M, with and without BOS.

Times are seconds in one run with a plain forward of the batch (``forward``) timed beside them; the
JSON keeps ratios. Results: ``benchmarks/results/peers.json``.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch

import p0circuit as p0
from p0circuit.core import hooks
from p0circuit.studies.analysis import steps as analysis_steps
from p0circuit.patching import NormRatio, ResidDim, get_corruption

import sys  # noqa: E402
sys.path.insert(0, str(Path(__file__).parent))
from record import Conditions, publish  # noqa: E402

LAYER = 2
ROOT = Path(__file__).resolve().parent.parent


def timed(fn, repeats=1):
    best, out = math.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def norm_ratio(resid):
    norms = resid.float().norm(dim=-1)
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


def site(node):
    """(hook name, index on axis 2 or None) of a P0 node or neuron."""
    if node.kind == p0.Kind.HEAD:
        return hooks.head_z(node.layer), node.head
    if node.kind == p0.Kind.NEURON:
        return hooks.mlp_post(node.layer), node.neuron
    return hooks.mlp_out(node.layer), None


def tl_nodes(model, clean, corr_cache, nodes):
    """The TransformerLens hand loop: one stopped forward per node."""
    out = {}
    for n in nodes:
        name, index = site(n)
        value = corr_cache[name][:, 1]  # clean position 0 sits at 1 in the shifted run

        def patch(act, hook, index=index, value=value):
            if index is None:
                act[:, 0] = value
            else:
                act[:, 0, index] = value[:, index]
            return act

        resid = model.run_with_hooks(clean, fwd_hooks=[(name, patch)], stop_at_layer=LAYER + 1)
        out[n.name] = norm_ratio(resid)
    return out


def module_path(nn_model, name):
    """The nnsight envoy of a TransformerLens hook point name."""
    obj = nn_model
    for part in name.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def nnsight_nodes(nn_model, clean, corr_cache, nodes):
    out = {}
    for n in nodes:
        name, index = site(n)
        value = corr_cache[name][:, 1]
        with nn_model.trace(clean) as tracer:
            point = module_path(nn_model, name)
            if index is None:
                point.output[:, 0] = value
            else:
                point.output[:, 0, index] = value[:, index]
            resid = module_path(nn_model, hooks.resid_post(LAYER)).output.save()
            tracer.stop()
        out[n.name] = norm_ratio(resid.value if hasattr(resid, "value") else resid)
    return out


def receiver_hook(edge):
    """TransformerLens' hook of an edge's receiver input, and the head index on its axis 2."""
    dst, which = edge.dst, edge.input.value
    if which == "mlp_in":
        return f"blocks.{dst.layer}.hook_mlp_in", None
    return f"blocks.{dst.layer}.hook_{which}_input", dst.head


def sender_change(model, clean_cache, corr_cache, src):
    """What the sender's corruption changes in the residual stream at P0 (SmolLM2 has no post-norms)."""
    if src.kind == p0.Kind.HEAD:
        w = model.blocks[src.layer].attn.W_O[src.head]
        z = hooks.head_z(src.layer)
        return (corr_cache[z][:, 1, src.head] - clean_cache[z][:, 0, src.head]) @ w
    name = hooks.mlp_out(src.layer)
    return corr_cache[name][:, 1] - clean_cache[name][:, 0]


def tl_edges(model, clean, clean_cache, corr_cache, edges):
    out = {}
    for e in edges:
        name, head = receiver_hook(e)
        delta = sender_change(model, clean_cache, corr_cache, e.src)

        def patch(act, hook, head=head, delta=delta):
            if head is None:
                act[:, 0] = act[:, 0] + delta
            else:
                act[:, 0, head] = act[:, 0, head] + delta
            return act

        resid = model.run_with_hooks(clean, fwd_hooks=[(name, patch)], stop_at_layer=LAYER + 1)
        out[e.name] = norm_ratio(resid)
    return out


def nnsight_edges(nn_model, model, clean, clean_cache, corr_cache, edges):
    out = {}
    for e in edges:
        name, head = receiver_hook(e)
        delta = sender_change(model, clean_cache, corr_cache, e.src)
        with nn_model.trace(clean) as tracer:
            point = module_path(nn_model, name)
            if head is None:
                point.output[:, 0] = point.output[:, 0] + delta
            else:
                point.output[:, 0, head] = point.output[:, 0, head] + delta
            resid = module_path(nn_model, hooks.resid_post(LAYER)).output.save()
            tracer.stop()
        out[e.name] = norm_ratio(resid.value if hasattr(resid, "value") else resid)
    return out


def limit(model, cache, starts, rows, mlp_first=()):
    """Plain batched suffix forwards: for each (first block, position) the blocks from it up to the
    metric's, on the positions from it on; for each (block, position) in ``mlp_first`` (a head's
    output changed: its own block's MLP must run again) that block's MLP first."""
    batch = next(iter(cache.values())).shape[0]
    per = max(1, rows // batch)
    for (layer, pos), k in _count(mlp_first).items():
        block, mid = model.blocks[layer], cache[hooks.resid_mid(layer)][:, pos:]
        for c in range(0, k, per):
            block.mlp(block.ln2(mid.repeat(min(per, k - c), 1, 1)))
    for (first, pos), k in _count(starts).items():
        if first > LAYER:
            continue
        resid = cache[hooks.resid_pre(first)][:, pos:]
        for c in range(0, k, per):
            model(resid.repeat(min(per, k - c), 1, 1), start_at_layer=first, stop_at_layer=LAYER + 1)


def _count(items):
    count = {}
    for s in items:
        count[s] = count.get(s, 0) + 1
    return count


def compare(ours, other, clean):
    return max(abs(ours.raw[k] - v) for k, v in other.items()) / max(1.0, abs(clean))


def peers(model, toks, only=("nodes", "edges", "neurons")):
    """The three workloads under every tool; times, ratios and agreement."""
    try:
        from nnsight import NNsight
        nn_model = NNsight(model)
    except ImportError:
        nn_model = None
    shift = p0.Shift(seed=0)
    corrupt = shift.prepare(model, toks).corrupt_tokens
    metric = NormRatio(LAYER)
    _, corr_cache = model.run_with_cache(corrupt, stop_at_layer=LAYER + 1)
    _, clean_cache = model.run_with_cache(toks, stop_at_layer=LAYER + 1)
    forward, _ = timed(lambda: model(toks), repeats=3)
    node_list = [n for n in p0.candidate_nodes(model, rest=False) if n.layer <= LAYER]
    node_res = p0.activation_patch(model, toks, nodes=node_list, corruption=shift, metric=metric)
    kept = [p0.Node.parse(n) for n in list(analysis_steps.strong(node_res, 0.1))[:8]]
    names = {(n.kind, n.layer, n.head) for n in kept}
    edge_list = [e for e in p0.candidate_edges(model, kept, receiver_layers=LAYER + 1)
                 if e.dst.pos == 0 and ((e.dst.kind, e.dst.layer, e.dst.head) in names or e.dst.kind == p0.Kind.KV_HEAD)]
    neuron_list = p0.candidate_neurons(model, range(LAYER + 1), positions=(0,))
    rows = 8 * toks.shape[0]
    out = {"forward_s": forward, "workloads": {}}
    work = {
        "nodes": (lambda: p0.activation_patch(model, toks, nodes=node_list, corruption=shift, metric=metric),
                  lambda: tl_nodes(model, toks, corr_cache, node_list),
                  (lambda: nnsight_nodes(nn_model, toks, corr_cache, node_list)) if nn_model else None,
                  [(n.layer + 1, 0) for n in node_list], len(node_list),
                  [(n.layer, 0) for n in node_list if n.kind == p0.Kind.HEAD]),
        "edges": (lambda: p0.path_patch(model, toks, edges=edge_list, corruption=shift, metric=metric),
                  lambda: tl_edges(model, toks, clean_cache, corr_cache, edge_list),
                  (lambda: nnsight_edges(nn_model, model, toks, clean_cache, corr_cache, edge_list)) if nn_model else None,
                  [(e.dst.layer + (1 if e.input.value == "mlp_in" else 0), 0) for e in edge_list], len(edge_list),
                  [(e.dst.layer, 0) for e in edge_list if e.input.value == "mlp_in"]),
        "neurons": (lambda: p0.activation_patch(model, toks, nodes=neuron_list, corruption=shift, metric=metric),
                    lambda: tl_nodes(model, toks, corr_cache, neuron_list[::16]),  # a 1/16 sample, scaled
                    (lambda: nnsight_nodes(nn_model, toks, corr_cache, neuron_list[::16])) if nn_model else None,
                    [(n.layer + 1, 0) for n in neuron_list], len(neuron_list), ()),
    }
    for name, (ours_fn, tl_fn, nn_fn, starts, count, mlp_first) in work.items():
        if name not in only:
            continue
        scale = 16 if name == "neurons" else 1
        repeats = 1 if name == "neurons" else 3  # best of 3 for every tool on the small workloads
        t_ours, ours = timed(ours_fn, repeats)
        t_lim, _ = timed(lambda: limit(model, clean_cache, starts, rows, mlp_first), repeats)
        split_inputs(model, name == "edges")  # the hand loops' edges read the receivers' inputs as hooks
        t_tl, tl = timed(tl_fn, repeats)
        t_tl *= scale
        t_nn, nn = (timed(nn_fn, repeats) if nn_fn else (math.nan, None))
        t_nn *= scale
        split_inputs(model, False)
        row = {"patches": count, "ours_s": t_ours, "tl_loop_s": t_tl, "nnsight_s": t_nn, "limit_s": t_lim,
               "ours_vs_limit": t_ours / t_lim if t_lim else math.nan, "tl_loop_over_ours": t_tl / t_ours,
               "nnsight_over_ours": t_nn / t_ours, "max_rel_diff_tl": compare(ours, tl, ours.clean_metric)}
        if nn is not None:
            row["max_rel_diff_nnsight"] = compare(ours, nn, ours.clean_metric)
        out["workloads"][name] = row
    return out


def split_inputs(model, on):
    """TransformerLens' per-head q/k/v input hooks and the MLP input hook (on for the hand-written path
    patching loops only: they make every forward slower, and p0circuit does not need them)."""
    model.cfg.use_split_qkv_input = on
    model.cfg.use_hook_mlp_in = on
    model.setup()


def screen_recall(model, toks, bos, layer, dim, mlps, keep=32, steps=4, threshold=0.1):
    """The analysis' neuron screen against full exact patching of the same neurons."""
    corruption = (analysis_steps.choose(model, toks, bos, ("swap", "shift"), NormRatio(layer), seed=0)[0] if bos
                  else get_corruption("shift"))  # the corruption analyze would use
    cands = p0.candidate_neurons(model, mlps, positions=(0,))
    metric = ResidDim(layer, dim)
    t_exact, exact = timed(lambda: p0.activation_patch(model, toks, nodes=cands, corruption=corruption, metric=metric,
                                                        bos=bos))
    t_screen, est = timed(lambda: p0.attribution_patch(model, toks, nodes=cands, corruption=corruption, metric=metric,
                                                        bos=bos, steps=steps, min_signal=0.0))
    ranked = sorted(est.normalized, key=lambda n: -abs(est.normalized[n]))[:keep]
    t_confirm, _ = timed(lambda: p0.activation_patch(model, toks, nodes=ranked, corruption=corruption, metric=metric,
                                                      bos=bos))
    big = {n for n, v in exact.normalized.items() if abs(v) >= threshold}
    return {"bos": bos, "layer": layer, "dim": dim, "mlps": list(mlps), "corruption": corruption.name,
            "candidates": len(cands), "exact_s": t_exact, "screen_s": t_screen, "confirm_s": t_confirm,
            "speedup": t_exact / (t_screen + t_confirm), "strong": sorted(big),
            "recall": len(big & set(ranked)) / len(big) if big else math.nan}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-gemma", action="store_true")
    ap.add_argument("--only", default="nodes,edges,neurons", help="workloads of the peer comparison")
    ap.add_argument("--no-recall", action="store_true", help="skip the screen's recall against full exact patching")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/performance.md and guide.md")
    args = ap.parse_args()
    with Conditions() as cond:
        result = measure(args)
    if args.only == "nodes,edges,neurons":
        publish("docs/performance.md", "peers", peers_table(result, cond))
    if "recall" in result and not args.skip_gemma:
        publish("docs/guide.md", "screen-recall", recall_table(result, cond))


WORKLOADS = {"nodes": "P0 nodes of blocks 0-2", "edges": "edges between the kept nodes", "neurons": "neurons at P0 of M0-M2"}


def peers_table(result, cond) -> str:
    p = result["peers"]
    rows = [f"{cond.header('bench_peers.py')} Best of 3 ({result['threads']} torch threads); one plain forward of the "
            f"batch = {p['forward_s']:.2f} s; the loops over neurons timed on every 16th neuron and scaled; the largest "
            "difference from the loops' values, relative to the clean metric: "
            f"{max(r['max_rel_diff_tl'] for r in p['workloads'].values()):.0e}.", "",
            "| workload (patches) | p0circuit | TransformerLens loop | nnsight loop | layer-forward limit | "
            "p0circuit vs the limit | loops / p0circuit |", "|---|---|---|---|---|---|---|"]
    for name, r in p["workloads"].items():
        nn = "not installed" if math.isnan(r["nnsight_s"]) else f"{r['nnsight_s']:.3g} s"
        rows.append(f"| {WORKLOADS[name]} ({r['patches']:,}) | {r['ours_s']:.3g} s | {r['tl_loop_s']:.3g} s | {nn} | "
                    f"{r['limit_s']:.3g} s | {r['ours_vs_limit']:.2f}x | {r['tl_loop_over_ours']:.1f}x / "
                    f"{r['nnsight_over_ours']:.1f}x |")
    return "\n".join(rows)


def recall_table(result, cond) -> str:
    rows = [cond.header("bench_peers.py"), "",
            "| model, BOS, onset (massive dimension) | corruption | neurons | exact effect >= 0.1 | recall | full exact | "
            "screen + confirm |", "|---|---|---|---|---|---|---|"]
    names = {"smollm2": ("SmolLM2", "`<|endoftext|>`"), "gemma3": ("Gemma 3", "`<bos>`")}
    for model, cases in result["recall"].items():
        label, token = names[model]
        for c in cases:
            bos = f"with {token}" if c["bos"] else "without"
            rows.append(f"| {label}, {bos}, block {c['layer']} ({c['dim']}) | {c['corruption']} | {c['candidates']:,} | "
                        f"{len(c['strong'])} | {c['recall']:.2f} | {c['exact_s']:.1f} s | "
                        f"{c['screen_s'] + c['confirm_s']:.1f} s |")
    return "\n".join(rows)


def measure(args):
    torch.set_grad_enabled(False)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    model = p0.load_smollm2()
    toks = p0.english_prompts(model, 16, 24, prepend_bos=False)
    result = {"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(),
              "peers": peers(model, toks, args.only.split(","))}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    if args.no_recall:
        (out / "peers_quick.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return result
    recall = [screen_recall(model, toks, False, 2, 507, [0, 1, 2]),
              screen_recall(model, toks, False, 11, 507, [8, 9, 10, 11])]
    p0.set_bos(model, "<|endoftext|>")
    with_bos = p0.english_prompts(model, 16, 25, prepend_bos=True)
    recall += [screen_recall(model, with_bos, True, 2, 507, [0, 1, 2])]
    result["recall"] = {"smollm2": recall}
    if not args.skip_gemma:
        gemma = p0.load_gemma3()
        g_bos = p0.english_prompts(gemma, 16, 25, prepend_bos=True)
        result["recall"]["gemma3"] = [screen_recall(gemma, g_bos, True, 0, 400, [0]),
                                      screen_recall(gemma, g_bos, True, 2, 400, [0, 1, 2])]
    (out / "peers.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
