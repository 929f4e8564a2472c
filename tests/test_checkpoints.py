"""Local checkpoints of six families load offline and match the Hugging Face logits.

Tolerance: max |logit difference| <= 1e-4 in float32 (observed about 1e-7). Sequences of 40
tokens are longer than Mistral's sliding window (8), so the window is exercised.
"""


import pytest
import torch

from p0circuit import BadInputError, CheckpointError, load_checkpoint, load_pretrained, sink_report, to_tokens
from p0circuit.models import positional_kind

from checkpoint_factory import VOCAB, family_configs, make_checkpoint

FAMILIES = list(family_configs())
EXPECTED_POS = {"llama": "rope", "pythia": "rope", "gpt2": "learned", "opt": "learned", "qwen2": "rope",
                "mistral": "rope"}


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpts")


@pytest.mark.parametrize("family", FAMILIES)
def test_local_checkpoint_logits_match_hf(family, ckpt_root):
    from transformers import AutoModelForCausalLM

    path = make_checkpoint(family, ckpt_root)
    model = load_checkpoint(path)
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokens = torch.randint(3, VOCAB, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(tokens).logits - model(tokens)).abs().max().item()
    assert diff <= 1e-4, f"{family}: max logit difference {diff}"
    assert positional_kind(model) == EXPECTED_POS[family]
    # the offline tokenizer works, and BOS is an explicit choice
    with_bos = to_tokens(model, "w5 w6 w7", prepend_bos=True)
    without = to_tokens(model, "w5 w6 w7", prepend_bos=False)
    assert without.tolist() == [[5, 6, 7]]
    assert with_bos.tolist() == [[0, 5, 6, 7]]
    # and the sink report runs on it
    report = sink_report(model, tokens)
    assert report.n_layers == 2


def test_family_specific_structure(ckpt_root):
    pythia = load_checkpoint(make_checkpoint("pythia", ckpt_root / "s"))
    assert pythia.cfg.parallel_attn_mlp and pythia.cfg.rotary_dim == 2  # rotary_pct 0.25 of d_head 8
    mistral = load_checkpoint(make_checkpoint("mistral", ckpt_root / "s"))
    assert mistral.cfg.window_size == 8 and mistral.cfg.gated_mlp


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
    with pytest.raises(CheckpointError, match="supported: "):
        load_checkpoint(tmp_path)


def test_missing_and_corrupt_weights(tmp_path):
    path = make_checkpoint("gpt2", tmp_path)
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
