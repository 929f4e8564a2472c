"""The third real model: Qwen2.5-Coder-0.5B-Instruct (``real:qwen2.5``), from the six chunk packages the README's
install line brings (``p0circuit/models/qwen.py``; nothing is downloaded at run time).

Qwen2.5 is a family the paper names, at real size for grouped-query attention (14 query heads share 2 key/value
heads), with q/k/v biases and a tokenizer that prepends nothing. Here: what it is (sizes and the variant line,
read from the file), what its with-BOS setting prepends, and that the conversion cache keeps its tokenizer.
Its logits and its nodes and edges against transformers' own load are in ``tests/test_hf_oracle_real.py``; bad
installs and files in ``tests/test_qwen_parts.py``.
"""

import logging

import pytest
import torch

import p0circuit as p0
from p0circuit.core.entries import REAL_MODELS
from p0circuit.models.gguf import variant

ENDOFTEXT = 151643
"""``<|endoftext|>``'s id: Qwen's document separator."""


@pytest.fixture(scope="module")
def qwen():
    """The model entry resolved once: the model, its start token, its variant."""
    logging.disable(logging.WARNING)
    return p0.load_model("real:qwen2.5")


def test_it_is_qwen2_5_0_5b_as_its_file_says(qwen):
    cfg = qwen.model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_model, cfg.d_mlp, cfg.d_vocab) == (
        24, 14, 2, 64, 896, 4864, 151936)
    assert cfg.rotary_base == 1_000_000 and cfg.normalization_type == "RMS" and cfg.gated_mlp
    assert all(bool(b.attn.b_Q.abs().sum() > 0) for b in qwen.model.blocks[:2])  # Qwen2's q/k/v biases
    assert qwen.variant == cfg.variant == variant("real:qwen2.5")
    assert qwen.variant.startswith(REAL_MODELS["qwen2.5"] + "; GGUF Q4_K_M (general.name 'Qwen2.5 Coder 0.5B Instruct "
                                   "AWQ', general.finetune 'Instruct-AWQ', a chat template)")


def test_with_bos_puts_the_document_separator_first(qwen):
    """The tokenizer prepends nothing; ``bos=True`` puts ``<|endoftext|>`` first (``START_TOKENS``), in the CLI and
    ``analyze`` (which set it from ``Resolved.start_token``) as in the text entry points."""
    model = qwen.model
    assert qwen.start_token == "<|endoftext|>" and model.tokenizer("The cat").input_ids[0] != ENDOFTEXT
    without = p0.english_prompts(model, 4, 12, prepend_bos=False)
    p0.set_bos(model, qwen.start_token)
    try:
        with_bos = p0.english_prompts(model, 4, 12, prepend_bos=True)
        assert p0.bos_label(model) == f"BOS '<|endoftext|>' (id {ENDOFTEXT})"
        reports = [p0.sink_report(model, with_bos, bos=True), p0.sink_report(model, without, bos=False)]
    finally:
        del model.p0circuit_bos_id
    assert with_bos[:, 0].tolist() == [ENDOFTEXT] * 4 and (without != ENDOFTEXT).all()
    assert torch.equal(with_bos[:, 1:], without[:, :11])  # the same text, one place later
    assert all(len(r.norm_ratio_resid) == 24 and len(r.alpha[0]) == 14 for r in reports)


def test_the_conversion_cache_keeps_the_tokenizer(qwen, gguf_parsed_once):
    """The tokenizer a load reads back from the conversion cache splits text as the GGUF file's own does."""
    from transformers import AutoTokenizer

    from p0circuit.models.gguf import qwen25_path

    path = qwen25_path()
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = open(p0.__file__.replace("__init__.py", "data/english.txt"), encoding="utf-8").read()[:3000]
    text += "\ndef f(x):\n    return x<|endoftext|><|im_start|>user"
    assert qwen.model.tokenizer(text).input_ids == theirs(text).input_ids
