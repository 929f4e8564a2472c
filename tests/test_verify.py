"""Checkpoints are verified, never patched up silently (issue 14, class 1): every tensor present,
of the right shape and finite, extra tensors named, unreadable files one CheckpointError."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import p0circuit as p0
from p0circuit import CheckpointError, NonFiniteError
from p0circuit.studies.training import BigramBackcopy, TrainConfig, train
from p0circuit.studies.training.trainer import load_trained

from family_configs import make_checkpoint


@pytest.fixture()
def llama(tmp_path):
    return make_checkpoint("llama", tmp_path, with_tokenizer=True)


def _edit_weights(path, fn):
    file = path / "model.safetensors"
    state = load_file(str(file))
    fn(state)
    save_file(state, str(file), metadata={"format": "pt"})


def test_config_with_more_layers_than_the_weights(llama):
    cfg = json.loads((llama / "config.json").read_text())
    cfg["num_hidden_layers"] += 1  # one block more than the weights hold
    (llama / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config and weights disagree: .* missing: model\.layers\.{cfg['num_hidden_layers'] - 1}\."):
        p0.load_checkpoint(llama)


def test_a_missing_attention_weight(llama):
    _edit_weights(llama, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) the config needs are missing: model\.layers\.1\.self_attn\.k_proj"):
        p0.load_checkpoint(llama)


def test_an_extra_and_a_misshapen_weight(llama):
    _edit_weights(llama, lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"the config does not use: model\.layers\.0\.extra\.weight"):
        p0.load_checkpoint(llama)


def test_a_nan_weight(llama):
    def poison(state):
        state["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    _edit_weights(llama, poison)
    with pytest.raises(NonFiniteError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight hold NaN or inf"):
        p0.load_checkpoint(llama)


def test_the_dtype_asked_for_is_honoured(llama):
    assert p0.load_checkpoint(llama, dtype=torch.float16).W_E.dtype == torch.float16
    with pytest.raises(p0.BadInputError, match="floating torch dtype"):
        p0.load_checkpoint(llama, dtype=torch.int8)
    with pytest.raises(p0.BadInputError, match="floating torch dtype"):
        p0.load_checkpoint(llama, dtype="half")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_truncated_or_garbled_files(llama, name, damage):
    file = llama / name
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 3] if damage == "truncated" else bytes(b ^ 0x5A for b in data[:64]) + data[64:])
    with pytest.raises(CheckpointError, match=name.split(".")[0]):
        p0.load_checkpoint(llama)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    spec = p0.ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16)
    train(spec, BigramBackcopy(16, seed=0), TrainConfig(steps=2, batch_size=2, seq_len=8, n_checkpoints=1), out,
          progress=False)
    return next(out.glob("step_*"))


def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_training_checkpoint_that_disagrees_with_its_spec(trained, tmp_path):
    ckpt = _copy(trained, tmp_path / "c1")
    meta = json.loads((ckpt / "spec.json").read_text())
    meta["spec"]["n_layers"] = 3
    (ckpt / "spec.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"do not match its spec.json: .* missing: blocks\.2\."):
        load_trained(ckpt)
    ckpt = _copy(trained, tmp_path / "c2")
    _edit_weights(ckpt, lambda s: s.update({"blocks.0.attn.W_Q": torch.full_like(s["blocks.0.attn.W_Q"], float("inf"))}))
    with pytest.raises(NonFiniteError, match=r"blocks\.0\.attn\.W_Q hold NaN or inf"):
        load_trained(ckpt)


@pytest.mark.parametrize("name", ["spec.json", "model.safetensors"])
def test_training_checkpoint_files_truncated(trained, tmp_path, name):
    ckpt = _copy(trained, tmp_path / "c")
    data = (ckpt / name).read_bytes()
    (ckpt / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=name):
        load_trained(ckpt)
    with pytest.raises(CheckpointError, match=name):
        p0.load_model(f"checkpoint:{ckpt}")


def test_a_resume_must_continue_the_same_run(tmp_path):
    spec = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16)
    config = TrainConfig(steps=4, batch_size=2, seq_len=8, n_checkpoints=2)
    train(spec, BigramBackcopy(16, seed=0), config, tmp_path, progress=False)
    with pytest.raises(p0.ConfigError, match=r"holds a different run \(spec.n_layers: saved 1, now 2"):
        train(p0.ModelSpec(**{**spec.to_dict(), "n_layers": 2}), BigramBackcopy(16, seed=0), config, tmp_path, progress=False)
    with pytest.raises(p0.ConfigError, match=r"train.lr: saved 0.003, now 0.01"):
        train(spec, BigramBackcopy(16, seed=0), TrainConfig(**{**config.__dict__, "lr": 0.01}), tmp_path, progress=False)
    with pytest.raises(p0.ConfigError, match="data: saved"):
        train(spec, BigramBackcopy(16, seed=1), config, tmp_path, progress=False)
    with pytest.raises(p0.ConfigError, match="already holds a run of 4 steps, and steps=3 asks for no more"):
        train(spec, BigramBackcopy(16, seed=0), TrainConfig(**{**config.__dict__, "steps": 3}), tmp_path, progress=False)
    train(spec, BigramBackcopy(16, seed=0), TrainConfig(**{**config.__dict__, "steps": 6}), tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.glob("step_*"))[-1] == "step_6"


def test_non_finite_settings_and_a_diverging_loss_stop_training(tmp_path):
    for bad in (float("nan"), float("inf")):
        with pytest.raises(p0.ConfigError, match="TrainConfig.lr=(nan|inf) is not finite"):
            TrainConfig(lr=bad)
    with pytest.raises(p0.ConfigError, match=r"TrainConfig.seed=18446744073709551616 must be in \[0, 4294967295\]"):
        TrainConfig(seed=2**64)
    spec = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16)
    with pytest.raises(NonFiniteError, match=r"the training loss is (nan|inf) at step \d+"):
        train(spec, BigramBackcopy(16, seed=0), TrainConfig(steps=30, batch_size=2, seq_len=8, lr=1e30, warmup=0,
                                                             grad_clip=0.0), tmp_path, progress=False)


def test_non_finite_weights_activations_and_metrics_stop_patching():
    """Class 2: a NaN weight in a sink head, or a metric that is always NaN, raises instead of
    returning a plausible circuit."""
    plant = p0.build_planted()
    toks = p0.probe_tokens(plant.model, 4, 12, seed=0, regular=True)
    layer, head = plant.sink_heads[0]
    with torch.no_grad():
        saved = plant.model.blocks[layer].attn.W_Q[head, 0, 0].item()
        plant.model.blocks[layer].attn.W_Q[head, 0, 0] = float("nan")
    try:
        for method in ("activation", "path", "attribution"):
            with pytest.raises(NonFiniteError, match=rf"weight blocks\.{layer}\.attn\.W_Q holds NaN or inf"):
                p0.discover(plant.model, toks, method=method, metric=p0.AttnToP0(heads=list(plant.sink_heads)))
        with pytest.raises(NonFiniteError, match=rf"weight blocks\.{layer}\.attn\.W_Q holds NaN"):
            p0.sink_report(plant.model, toks)
    finally:
        with torch.no_grad():
            plant.model.blocks[layer].attn.W_Q[head, 0, 0] = saved
    blow_up = p0.CacheMetric(lambda acts, p0_: acts[p0.hooks.resid_post(1)][:, 0].sum() * 0 + 1.0, [(1, p0.hooks.resid_post(1))])
    with torch.no_grad():  # finite weights whose activations overflow
        half = p0.ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16).build()
        half.blocks[0].mlp.W_in.mul_(1e30)
        half.blocks[0].mlp.W_out.mul_(1e30)
    with pytest.raises(NonFiniteError, match=r"NaN or inf first appears at 'blocks\.0\.hook_mlp_out' in the clean run"):
        p0.activation_patch(half, torch.randint(0, 16, (2, 8)), metric=blow_up, min_signal=0)
    nan_metric = p0.CacheMetric(lambda acts, p0_: acts[p0.hooks.resid_post(1)].sum() * float("nan"),
                                [(1, p0.hooks.resid_post(1))], label="always_nan")
    with pytest.raises(NonFiniteError, match="metric always_nan is nan on the clean run"):
        p0.discover(plant.model, toks, metric=nan_metric)


def test_records_that_tell_the_truth_about_their_inputs():
    """Class 6: a CacheMetric whose declared layer is not its hook's, negative or float token ids
    in corruptions: refused, never run with a silently wrong number."""
    plant = p0.build_planted()
    toks = p0.probe_tokens(plant.model, 4, 12, seed=0, regular=True)
    liar = p0.CacheMetric(lambda acts, q: acts[p0.hooks.resid_post(2)][:, q].norm(), [(0, p0.hooks.resid_post(2))])
    with pytest.raises(p0.BadInputError, match=r"declares hook 'blocks\.2\.hook_resid_post' at layer 0, but that hook "
                                               r"belongs to block 2"):
        p0.activation_patch(plant.model, toks, metric=liar)
    with pytest.raises(p0.ConfigError, match=r"Resample.tokens holds negative ids \(down to -"):
        p0.activation_patch(plant.model, toks, corruption=p0.Resample(tokens=-toks), metric=p0.NormRatio(1))
    with pytest.raises(p0.ConfigError, match=r"Resample.tokens must hold integer token ids"):
        p0.activation_patch(plant.model, toks, corruption=p0.Resample(tokens=toks.float()), metric=p0.NormRatio(1))
    for filler in ((-1,), (10_000,), (1.5,)):
        with pytest.raises(p0.ConfigError, match=r"Shift.filler must be a tuple of token ids|Shift.filler=\(1.5,\) \(tuple\) is not a tuple of int"):
            p0.activation_patch(plant.model, toks, corruption=p0.Shift(1, filler=filler), metric=p0.NormRatio(1))
    with pytest.raises(p0.ConfigError, match="Shift.k=1.5 \\(float\\) is not int"):
        p0.activation_patch(plant.model, toks, corruption=p0.Shift(1.5), metric=p0.NormRatio(1))


def test_a_metric_that_becomes_infinite_under_a_patch_is_named():
    plant = p0.build_planted()
    toks = p0.probe_tokens(plant.model, 4, 12, seed=0, regular=True)
    with pytest.raises(NonFiniteError, match=r"norm_ratio@L1 is NaN or inf after patching R0@rest"):
        p0.activation_patch(plant.model, toks, nodes=["R0@rest", "M0@0"], corruption="zero", metric=p0.NormRatio(1))
