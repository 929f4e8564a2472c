"""Local checkpoints with a tokenizer, of six families (one per loader path: learned and rotary positions,
parallel blocks, grouped-query attention, a sliding window), load offline, match the Hugging Face logits,
tokenize with an explicit BOS choice and run the sink report. Every family's logits and patching are
tested in test_families.py, on the same configs (tests/family_configs.py).

Tolerance: max |logit difference| <= tests/tolerance.py's REL32 (1.2e-4) of the largest logit, in float32
(observed about 1e-7). Sequences of 40 tokens are longer than Mistral's sliding window (4), so the window
is exercised.
"""


import pytest
import torch

from p0circuit import BadInputError, CheckpointError, ModelSpec, load_checkpoint, load_pretrained, sink_report, to_tokens
from p0circuit.models import positional_kind

from family_configs import VOCAB, WINDOW, make_checkpoint
from tolerance import tolerance

FAMILIES = ["llama", "pythia", "gpt2", "opt", "qwen2", "mistral"]
EXPECTED_POS = {"llama": "rope", "pythia": "rope", "gpt2": "learned", "opt": "learned", "qwen2": "rope",
                "mistral": "rope"}


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpts")


@pytest.mark.parametrize("family", FAMILIES)
def test_local_checkpoint_logits_match_hf(family, ckpt_root):
    from transformers import AutoModelForCausalLM

    path = make_checkpoint(family, ckpt_root, with_tokenizer=True)
    model = load_checkpoint(path)
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokens = torch.randint(3, VOCAB, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(tokens).logits
        diff, scale = (theirs - model(tokens)).abs().max().item(), theirs.abs().max().item()
    assert diff <= tolerance(scale=scale), f"{family}: max logit difference {diff} (logits up to {scale:.3g})"
    assert positional_kind(model) == EXPECTED_POS[family]
    # the offline tokenizer works, and BOS is an explicit choice
    with_bos = to_tokens(model, "w5 w6 w7", prepend_bos=True)
    without = to_tokens(model, "w5 w6 w7", prepend_bos=False)
    assert without.tolist() == [[5, 6, 7]]
    assert with_bos.tolist() == [[0, 5, 6, 7]]
    # and the sink report runs on it
    report = sink_report(model, tokens)
    assert report.n_layers == 3


def test_family_specific_structure(ckpt_root):
    pythia = load_checkpoint(make_checkpoint("pythia", ckpt_root / "s", with_tokenizer=True))
    assert pythia.cfg.parallel_attn_mlp and pythia.cfg.rotary_dim == 2  # rotary_pct 0.25 of d_head 8
    mistral = load_checkpoint(make_checkpoint("mistral", ckpt_root / "s", with_tokenizer=True))
    assert mistral.cfg.window_size == WINDOW and mistral.cfg.gated_mlp


def test_checkpoint_without_tokenizer_takes_tokens_only(tmp_path):
    model = load_checkpoint(make_checkpoint("llama", tmp_path, with_tokenizer=False))
    assert model.tokenizer is None
    with pytest.raises(BadInputError, match="has no tokenizer"):
        to_tokens(model, "w5", prepend_bos=False)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_checkpoint(tmp_path)


def test_corrupt_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        load_checkpoint(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["BertForMaskedLM"]}')
    with pytest.raises(CheckpointError, match="does not convert; p0circuit loads"):
        load_checkpoint(tmp_path)


def test_missing_and_corrupt_weights(tmp_path):
    path = make_checkpoint("gpt2", tmp_path, with_tokenizer=True)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="check that the weight files"):
        load_checkpoint(path)
    weights.unlink()
    with pytest.raises(CheckpointError, match="check that the weight files"):
        load_checkpoint(path)


def test_load_pretrained_offline_points_to_local_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="load_checkpoint"):
        load_pretrained("pythia-14m", prepend_bos=False, checkpoint_index=3)
    with pytest.raises(CheckpointError, match="is a local path; use load_checkpoint"):
        load_pretrained(str(tmp_path), prepend_bos=False)


PYTHIA_SCRIPT = r"""
import json, sys, torch
import p0circuit as p0
from transformers import AutoModelForCausalLM
model = p0.load_pretrained("pythia-14m", prepend_bos=False, checkpoint_index=3)
hf = AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True)
tokens = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    theirs = hf(tokens).logits
    diff, scale = (theirs - model(tokens)).abs().max().item(), theirs.abs().max().item()
print(json.dumps({"label": model.cfg.checkpoint_value, "diff": diff, "scale": scale, "bos": model.cfg.default_prepend_bos}))
"""


def test_pythia_checkpoint_index_path_offline(tmp_path):
    """The hub path (Pythia checkpoint_index) runs for real against a Hugging Face cache laid out on
    local disk: checkpoint_index 3 is revision 'step4' (TransformerLens' Pythia labels 0, 1, 2, 4, ...)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    src = make_checkpoint("pythia", tmp_path / "src", with_tokenizer=True)
    repo = tmp_path / "hf" / "hub" / "models--EleutherAI--pythia-14m"
    commit = "0" * 40
    shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    for ref in ("main", "step4"):
        (repo / "refs" / ref).write_text(commit)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", PYTHIA_SCRIPT, str(src)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["label"] == 4 and result["bos"] is False
    assert result["diff"] <= tolerance(scale=result["scale"])  # unprocessed weights: the same logits as the HF model


def test_linear_layout_changes_no_value():
    """The gated MLP and unembedding weights are stored transposed-contiguous (no copy per forward);
    every logit is bitwise the same."""
    from p0circuit.models.layout import linear_layout

    model = ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=50, n_ctx=16, mlp="gated").build()
    toks = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    before = model(toks)
    linear_layout(model)
    assert model.blocks[0].mlp.W_gate.T.is_contiguous() and model.unembed.W_U.T.is_contiguous()
    assert torch.equal(before, model(toks))
