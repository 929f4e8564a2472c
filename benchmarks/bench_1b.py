"""The 1B class on one machine: a random-weight checkpoint shaped like Llama-3.2-1B, made here with
transformers' own config class, loaded, measured and patched, each figure beside a forward of the
same batch timed in the same run.

    python benchmarks/bench_1b.py                       # 1.24B parameters, float32 (about 5 GB on disk)
    python benchmarks/bench_1b.py --shape small         # the same code path at 42M parameters (a minute)
    python benchmarks/bench_1b.py --shape narrow --analyze   # the 1B's depth and heads at d_model 512: the analysis
                                                        # counts about the 1B's forwards in a tenth of its time
    python benchmarks/bench_1b.py --device cuda --dtype bfloat16    # the GPU check (not for CI)
    python benchmarks/bench_1b.py --analyze             # also p0circuit.analyze, its time and its ETA

What it measures: peak resident memory while loading (a fresh process, ``benchmarks/load_memory.py``)
against the model's own size; the load time; one forward of 8 x 24 tokens; ``sink_report``; one
activation patch of every head and MLP at P0 and elsewhere up to block 2 (``NormRatio(2)``, shift); and
with ``--analyze`` the whole analysis at its defaults, with how far its progress bar's estimate was
from the time it took. Random weights have no sink (their P0 norm ratio stays near 1.2), so
``--analyze`` first plants one into the loaded weights (``benchmarks/sink_plant.py``: detection in
block 0, amplification in block ``--onset``), and the analysis has an onset to patch: a timing of the
analysis' steps at this size, not a finding.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Conditions, publish  # noqa: E402

SHAPES = {
    # Llama-3.2-1B's shape: 16 layers, d_model 2048, 32 query heads sharing 8 key/value heads, d_mlp 8192,
    # a vocabulary of 128,256, tied embeddings (1.24B parameters)
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=2048,
               rope_theta=500000.0),
    "small": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048),
    # the 1B shape's depth, heads and proportions at a quarter of its width (d_model 512, 73M parameters): the
    # analysis counts about the 1B's forwards, in a fraction of its time (for working on the analysis' cost)
    "narrow": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=32064, tie_word_embeddings=True, max_position_embeddings=2048,
                   rope_theta=500000.0),
    # 124M parameters: large enough that the weights dominate what a load allocates besides them
    # (TransformerLens' causal masks, the logit check's activations: about 70 MB here)
    "medium": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=6, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048),
}
INIT_STD = {"narrow": 0.04}
"""The weights' standard deviation where not 0.02: the narrow shape's doubled so that a query's and a key's products
at its d_head of 16 spread as the 1B's at 64 do (random heads then attend to a massive P0 state as often)."""
HERE = Path(__file__).resolve().parent
BLOCKS = ("1b-cpu-float32", "1b-cuda-bfloat16")
"""The docs blocks this benchmark writes (docs/performance.md): ``1b-<device>-<dtype>``."""


def make_checkpoint(out: Path, shape: str, seed: int = 0, dtype: str = "float32") -> Path:
    """A random-weight Llama checkpoint of ``shape`` in ``out`` (config.json and safetensors shards, one
    per block, stored in ``dtype``), written tensor by tensor: the names and shapes come from
    transformers' own model built on the meta device, so making it never holds more than one block's
    weights."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], architectures=["LlamaForCausalLM"], dtype=dtype)
    with torch.device("meta"):
        names = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings:
        names.pop("lm_head.weight", None)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    groups: dict[str, list[str]] = {}
    for name in names:
        key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(key, []).append(name)
    weight_map, total = {}, 0
    for i, (key, group) in enumerate(groups.items()):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: (torch.ones(names[n]) if n.endswith("norm.weight") else
                       torch.randn(names[n], generator=gen) * INIT_STD.get(shape, 0.02)).to(getattr(torch, dtype)) for n in group}
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: shard for n in group})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    config.save_pretrained(out)
    return out


def load_memory(path: Path, dtype: str) -> dict:
    """``benchmarks/load_memory.py`` in a fresh process: its JSON line."""
    out = subprocess.run([sys.executable, str(HERE / "load_memory.py"), str(path), "--dtype", dtype],
                         capture_output=True, text=True, check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, value


def recall_of_the_screen(model, result: dict, say) -> None:
    """The analysis' node screen at its first onset against exact patching of every candidate, on its own
    prompts, corruption and metric: the share of the nodes whose exact |effect| is at least the threshold
    that the screen's exact top kept (recall), and both times."""
    from p0circuit.patching import NormRatio
    from p0circuit.patching.corruptions import get_corruption
    from p0circuit.patching.setup import Setup
    from p0circuit.studies.analysis import AnalysisSettings, steps

    s, onset = result["settings"], next((o for v in result["onsets"].values() for o in v if o["where"] == "P0"), None)
    if onset is None or not onset.get("screen"):
        return
    from p0circuit.studies.analysis.setting import Setting
    toks = Setting(model, AnalysisSettings(**s), False).prompts()  # the analysis' own prompts without BOS
    setup = Setup.of(model, toks, corruption=get_corruption(onset["corruption"], seed=s["seed"]),
                     metric=NormRatio(onset["layer"]), bos=False)
    kw = dict(layer=onset["layer"], threshold=s["threshold"], seed=s["seed"])
    full_s, (full, _) = timed(lambda: steps.nodes(setup, exact_nodes=0, **kw))
    screen_s, (screened, _) = timed(lambda: steps.nodes(setup, exact_nodes=s["exact_nodes"], **kw))
    truth, kept = set(full.kept(s["threshold"])), set(screened.kept(s["threshold"]))
    missed = max((abs(full.normalized[n]) for n, v in screened.normalized.items() if v != v), default=0.0)
    say(f"the node screen at block {onset['layer']} against exact patching of all {len(full.raw)} candidates: it kept "
        f"{len(truth & kept)} of the {len(truth)} nodes at |effect| >= {s['threshold']} (recall "
        f"{len(truth & kept) / max(len(truth), 1):.2f}); the largest exact |effect| it left unexamined {missed:.3f}; "
        f"{screen_s:.0f} s against {full_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--dir", type=Path, help="where the checkpoint is (made there when missing)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--analyze", action="store_true", help="also run p0circuit.analyze on the model with a P0 sink "
                        "planted into its weights (minutes at 1B)")
    parser.add_argument("--onset", type=int, help="the block the planted sink's norm onset is at (default n_layers // 5)")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into docs/performance.md")
    args = parser.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text)
        lines.append(f"- {text}")

    import p0circuit as p0

    directory = args.dir or Path(tempfile.gettempdir()) / f"p0circuit-llama-{args.shape}-{args.dtype}"
    if not (directory / "config.json").is_file():
        t = time.perf_counter()
        make_checkpoint(directory, args.shape, dtype=args.dtype)
        print(f"made the {args.shape} checkpoint in {directory} ({time.perf_counter() - t:.0f} s)")
    with Conditions() as run:
        mem = load_memory(directory, args.dtype)
        say(f"load (`load_checkpoint`, logits checked against transformers): {mem['seconds']} s; peak resident "
            f"memory {(mem['peak'] - mem['before']) / 2**30:.2f} GiB above the {mem['before'] / 2**30:.2f} GiB before it, "
            f"for a model of {mem['model_bytes'] / 2**30:.2f} GiB ({mem['dtype']}): **{mem['ratio']:.2f}x** its size")
        model = p0.load_checkpoint(directory, dtype=getattr(torch, args.dtype), device=args.device)
        toks = p0.probe_tokens(model, 8, 24, seed=0)
        with torch.no_grad():
            model(toks)
            forward, _ = timed(lambda: model(toks), repeat=2)
        say(f"one forward of 8 x 24 tokens: {forward:.2f} s (the unit below)")
        report_s, rep = timed(lambda: p0.sink_report(model, toks, bos=False))
        say(f"`sink_report`: {report_s:.2f} s = {report_s / forward:.1f} forwards (random weights: P0 norm ratio "
            f"{min(rep.norm_ratio_resid):.2f}-{max(rep.norm_ratio_resid):.2f} per layer, no sink)")
        patch_s, res = timed(lambda: p0.activation_patch(model, toks, corruption="shift", metric=p0.NormRatio(2),
                                                         min_signal=0))
        say(f"`activation_patch` of {len(res.raw)} nodes (every head and MLP at P0 and elsewhere up to block 2; "
            f"`NormRatio(2)`, shift): {patch_s:.1f} s = {patch_s / forward:.1f} forwards")
        if args.analyze:
            from analysis_cost import eta_errors, kind
            from sink_plant import plant_sink

            onset = args.onset if args.onset is not None else max(1, model.cfg.n_layers // 5)
            if not 1 <= onset < model.cfg.n_layers:
                raise SystemExit(f"--onset must lie in 1..{model.cfg.n_layers - 1} (block 0 holds the detector)")
            info = plant_sink(model, onset)
            say(f"a P0 sink planted into the loaded weights (`benchmarks/sink_plant.py`: uniform heads A0.H0, A0.H4, ... "
                f"and block 0's MLP detect position 0, block {onset}'s MLP amplifies it): P0 norm ratio after block "
                f"{onset} {info['median_ratio']:.1f} on probe prompts (smallest per prompt {info['min_ratio']:.1f})")
            start = time.perf_counter()
            result = p0.analyze(model, progress=True)
            wall = time.perf_counter() - start
            t = result["timing"]
            onsets = [o["layer"] for v in result["onsets"].values() for o in v]
            first = next((o for v in result["onsets"].values() for o in v), {})
            circuit = first.get("circuit") or {}
            say(f"`analyze` ({result['settings']['n_prompts']} prompts x {result['settings']['length']} tokens, without "
                f"BOS: no tokenizer): **{wall:.0f} s** = {wall / forward:.0f} forwards of 8 x 24 tokens; onsets "
                f"{onsets or 'none'}; its steps {t['seconds']:.0f} s = {t['seconds'] / forward:.0f} forwards by time, their work "
                f"counted {t['forwards']:.0f} forwards ({t['with_grad']:.0f} with a backward; p0circuit/patching/work.py), so "
                f"{t['slowdown']:.2f}x the time that work takes at the unit forward, with other processes using "
                f"{t['others_cores']:.1f} cores on average meanwhile; {sum(t['predicted_forwards'].values()):.0f} forwards "
                f"predicted by the cost model; the progress bar's estimate of the total time at 25% / 50% / 75% of it: "
                + " / ".join(f"{v:+.0%}" for v in eta_errors(t).values()) + " of the real one")
            by_kind: dict = {}
            for key, fw in t["forwards_by_step"].items():  # the counted work of each step kind, largest first
                by_kind[kind(key)] = by_kind.get(kind(key), 0.0) + (fw or 0.0)
            say("its counted forwards by step kind: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(
                by_kind.items(), key=lambda kv: -kv[1]) if v >= 0.05))
            mem = result["memory"]
            if mem["steps"] and all(v is not None for v in mem["steps"].values()):
                peaks: dict = {}
                for key, gib in mem["steps"].items():  # each step's peak (reset before it): the largest per kind
                    peaks[kind(key)] = max(peaks.get(kind(key), 0.0), gib)
                say(f"peak resident memory of each analysis step kind (the model, {mem['weights']:.2f} GiB, included; "
                    f"{mem['at_start']:.2f} GiB resident when the steps began): "
                    + ", ".join(f"{k} {v:.2f} GiB ({v / mem['weights']:.2f}x the model)" for k, v in peaks.items()))
            recall_of_the_screen(model, result, say)
            if circuit.get("nodes"):
                say(f"its faithful circuit at block {first['layer']}: {', '.join(circuit['nodes'])} (faithfulness "
                    f"{circuit['faithfulness']:.2f}; the plant's nodes are A0.H0@0, A0.H4@0, ..., M0@0 and M{onset}@0); "
                    f"node screen: {(first.get('screen') or {}).get('how', 'every candidate patched exactly')}")
    shape = SHAPES[args.shape]
    head = (f"{run.header('bench_1b.py', args.device)} A random-weight Llama checkpoint ({shape['num_hidden_layers']} "
            f"layers, d_model {shape['hidden_size']}, {shape['num_attention_heads']} heads sharing "
            f"{shape['num_key_value_heads']} key/value heads, d_mlp {shape['intermediate_size']}, vocabulary "
            f"{shape['vocab_size']:,}), stored and loaded in {args.dtype}:")
    publish("docs/performance.md", f"1b-{args.device}-{args.dtype}" if args.shape == "1b" else f"{args.shape}-load",
            head + "\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
