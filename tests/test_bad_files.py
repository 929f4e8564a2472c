"""Bad input that reaches the loaders and token checks (issue 19, item 6): token tensors of any
non-integer dtype, and config files holding any JSON type, get one clear error naming the
argument or the file, never a raw AttributeError or NotImplementedError."""

import json
import logging

import pytest
import torch

import p0circuit as p0
from family_configs import make_checkpoint

JSON_VALUES = [[], ["LlamaForCausalLM"], "LlamaForCausalLM", 3, 2.5, True, None, {}, {"architectures": "Llama"},
               {"architectures": [7]}, {"architectures": []}, {"architectures": ["BertModel"]}]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.bool, torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64, torch.float8_e4m3fn, torch.uint16, torch.uint32,
                                   torch.uint64])
def test_token_dtypes_are_named(dtype):
    model = p0.ModelSpec(n_layers=1).build()
    tokens = torch.ones(2, 5, dtype=dtype) if dtype.is_complex else torch.ones(2, 5).to(dtype)
    for call in (lambda: p0.sink_report(model, tokens), lambda: p0.activation_patch(model, tokens, corruption="shift")):
        with pytest.raises(p0.BadInputError, match=f"integer token ids.*got dtype {dtype}"):
            call()


def test_damaged_gguf_files_are_refused_from_the_header(tmp_path, monkeypatch):
    """Refused from the file's header and size, before transformers parses the file (which takes seconds)."""
    from p0circuit.models import gguf
    from p0circuit.models.gguf import smollm2_path

    def parsed(*args, **kwargs):
        raise AssertionError("the damaged file reached transformers' GGUF parser")

    monkeypatch.setattr(gguf, "_transformers_load", parsed)
    data = smollm2_path().read_bytes()
    cases = {"truncated.gguf": data[: len(data) // 2], "header_only.gguf": data[:4000], "garbage.gguf": b"GGUF" + b"\x07" * 64,
             "not_gguf.gguf": b"PK\x03\x04" + data[4:1000]}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(p0.CheckpointError, match="truncated|not a GGUF|not a readable GGUF"):
            p0.load_gguf(tmp_path / name, cache=False)


@pytest.mark.parametrize("value", JSON_VALUES, ids=[json.dumps(v)[:24] for v in JSON_VALUES])
def test_config_json_of_any_type(tmp_path, value):
    (tmp_path / "config.json").write_text(json.dumps(value))
    with pytest.raises(p0.CheckpointError, match=r"config\.json'|architecture") as err:
        p0.load_checkpoint(tmp_path)
    assert str(tmp_path) in str(err.value)


@pytest.mark.parametrize("value", [[], "x", 1, None, True])
def test_tokenizer_config_of_any_type(tmp_path, value):
    logging.disable(logging.WARNING)
    path = make_checkpoint("llama", tmp_path)
    (path / "tokenizer_config.json").write_text(json.dumps(value))
    with pytest.raises(p0.CheckpointError, match=r"tokenizer_config\.json' .*(not an object|is not valid JSON)"):
        p0.load_checkpoint(path)


@pytest.mark.parametrize("family", ["llama", "gemma3", "olmoe", "gpt_oss", "bloom"])
def test_half_precision_loads_or_is_refused_clearly(tmp_path, family):
    logging.disable(logging.WARNING)
    try:
        model = p0.load_checkpoint(make_checkpoint(family, tmp_path), dtype=torch.bfloat16)
    except p0.CheckpointError as e:
        assert "dtype=torch.float32" in str(e) or "does not reproduce" in str(e)
    else:
        assert model.cfg.dtype == torch.bfloat16 and bool(torch.isfinite(model(torch.tensor([[3, 4, 5]]))).all())


@pytest.mark.parametrize("variant", [dict(word_embed_proj_dim=16), dict(do_layer_norm_before=False)],
                         ids=["projected embeddings (OPT-350m)", "post-norm OPT"])
def test_variants_the_conversion_does_not_fit_are_refused(tmp_path, variant):
    import transformers as tf
    from transformers import AutoModelForCausalLM

    logging.disable(logging.WARNING)
    cfg = tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=64, vocab_size=64, **{"word_embed_proj_dim": 32, **variant})
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "opt")
    with pytest.raises(p0.CheckpointError, match="conversion does not fit this checkpoint|does not reproduce"):
        p0.load_checkpoint(tmp_path / "opt")
