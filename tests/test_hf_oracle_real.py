"""The transformers oracle (``tests/hf_oracle.py``) on the three real models, SmolLM2-135M, Gemma 3 270M and
Qwen2.5-Coder-0.5B.

Each is loaded twice from the GGUF file its package ships (nothing is downloaded): by p0circuit (a
float32 ``HookedTransformer``, through TransformerLens' conversion) and by transformers itself
(``from_pretrained(dir, gguf_file=...)``, which dequantizes to float32), once per module. Their logits
are compared first (the same weights), then a few heads and MLPs of blocks 0-2, ``E@0`` and a few
edges into q, k, v, MLP inputs and the measured block output, patched by p0circuit (fast and
reference) and by plain PyTorch hooks on transformers' modules, on 2 short English prompts. On Qwen2.5 (14 query
heads sharing 2 key/value heads) heads of the second group and edges into both key/value heads' keys and values
are added: a key/value head's slice written at the other group's columns would differ there.
"""

import functools
import logging

import pytest
import torch

import hf_oracle as H
import p0circuit as p0
from p0circuit.models.gguf import gemma3_path, qwen25_path, smollm2_path
from test_families import sample
from test_hf_oracle import assert_same_logits, compare
from tolerance import tolerance

MODELS = {"smollm2": (p0.load_smollm2, smollm2_path, False), "gemma3": (p0.load_gemma3, gemma3_path, True),
          "qwen2.5": (p0.load_qwen25, qwen25_path, False)}
"""name: (p0circuit's loader, the GGUF file, whether prompts start with <bos>: Gemma 3 is trained with it)."""
NODES = ["A0.H0@0", "A0.H2@0", "A1.H1@0", "A2.H3@0", "M0@0", "M1@0", "M2@0", "E@0", "A1.H0@rest", "M1@rest"]
SENDERS = ["E@0", "A0.H1@0", "M0@0", "M1@0", "A0.H2@rest"]
MORE = {"qwen2.5": (["A0.H13@0", "A1.H7@0", "A2.H10@0", "A2.H12@rest"],
                    ["M0@0->A1.KV1@0.k", "M0@0->A1.KV1@0.v", "M1@0->A2.KV1@0.k", "M0@rest->A1.KV1@rest.k",
                     "M1@rest->A2.KV1@rest.v", "M1@rest->A2.H8@rest.q", "A0.H12@0->M1@0.mlp_in"])}
"""Nodes and edges added per model: Qwen2.5's second key/value group (heads 7-13, key/value head 1), chosen among
those that move the metric by more than the tolerance (most by 10-1000 times it), so that a slice taken from the
other group would differ."""


@pytest.fixture(scope="module", params=sorted(MODELS))
def real(request):
    """(name, p0circuit's model, transformers' model, 2 prompts of 8 tokens), one model at a time."""
    import gguf
    from transformers import AutoModelForCausalLM

    logging.disable(logging.WARNING)
    load, where, bos = MODELS[request.param]
    model, path = load(), where()
    with pytest.MonkeyPatch.context() as mp:  # one parse of the file for transformers' config and weights
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return request.param, model, H.HF(hf), p0.english_prompts(model, 2, 8, prepend_bos=bos)


def test_logits_equal_transformers(real):
    name, model, hf, tokens = real
    assert_same_logits(name, model, hf, tokens)


@pytest.mark.parametrize("corruption", ["shift", "swap"])
def test_activation_equals_transformers_hooks(real, corruption):
    name, model, hf, tokens = real
    nodes = NODES + MORE.get(name, ([], []))[0]
    bad, fast = compare(model, hf, "activation", nodes, corruption, tokens=tokens)
    assert not bad, f"{name}: {len(bad)} of {len(nodes)} nodes differ (name, fast, reference, hf): {bad[:4]}"
    assert max(abs(v - fast.clean_metric) for v in fast.raw.values()) > 1e-3


@pytest.mark.parametrize("corruption", ["shift", "swap"])
def test_path_equals_transformers_hooks(real, corruption):
    name, model, hf, tokens = real
    metric = p0.NormRatio(2)
    edges = sample([e.name for e in p0.candidate_edges(model, [p0.Node.parse(s) for s in SENDERS], receiver_layers=3,
                                                       metric=metric)])
    assert {e.rsplit(".", 1)[1] for e in edges} == {"q", "k", "v", "mlp_in", "resid"}
    edges += MORE.get(name, ([], []))[1]
    if model.cfg.n_key_value_heads not in (None, model.cfg.n_heads):  # grouped-query: keys and values per KV head
        assert {e.rsplit(".", 1)[1] for e in edges if ".KV" in e} == {"k", "v"}
    bad, fast = compare(model, hf, "path", edges, corruption, tokens=tokens)
    assert not bad, f"{name}: {len(bad)} of {len(edges)} edges differ (name, fast, reference, hf): {bad[:4]}"
    for which in ("k", "v"):  # the second group's keys and values move the metric: their comparison means something
        moved = [abs(fast.raw[e] - fast.clean_metric) for e in edges if ".KV1@" in e and e.endswith(f".{which}")]
        assert not moved or max(moved) > 2 * tolerance(scale=fast.clean_metric), (name, which, moved)
