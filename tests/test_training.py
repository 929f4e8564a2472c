"""Training: deterministic data, log-spaced atomic checkpoints, bitwise resume, tracking."""

import pytest
import torch

from p0circuit import BadInputError, ConfigError, ModelSpec
from p0circuit.studies.tracking import checkpoint_series, track
from p0circuit.studies.training import BigramBackcopy, MarkovSource, TextSource, TrainConfig, load_trained, train

SPEC = ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=33, n_ctx=32, pos="nope")
CONFIG = TrainConfig(steps=30, batch_size=8, seq_len=16, lr=1e-2, warmup=5, n_checkpoints=5)


def test_sources_are_deterministic_by_step():
    src = MarkovSource(vocab=32, k=2, seed=1)
    a, b = src.batch(7, 4, 10), src.batch(7, 4, 10)
    assert torch.equal(a, b) and a.shape == (4, 10) and not torch.equal(a, src.batch(8, 4, 10))
    probs = src.transitions()
    assert ((probs > 0).sum(1) == 2).all() and torch.allclose(probs.sum(1), torch.ones(32))
    assert all(probs[a[i, t], a[i, t + 1]] > 0 for i in range(4) for t in range(9))  # transitions are legal
    with_bos = MarkovSource(vocab=32, k=2, seed=1, bos=32).batch(7, 4, 10)
    assert (with_bos[:, 0] == 32).all() and torch.equal(with_bos[:, 1:], a[:, :-1])


def test_bigram_backcopy_copies_after_triggers():
    rows = BigramBackcopy(vocab=32, n_triggers=3, seed=0).batch(0, 16, 40)
    for row in rows.tolist():
        for t in range(2, 40):
            if row[t - 1] < 3:
                assert row[t] == row[t - 2]


def test_text_source(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first document here\n\nsecond one, a bit longer than that\n\n\n\nthird")
    packed = TextSource(str(path)).batch(0, 3, 8)
    assert packed.shape == (3, 8) and int(packed.max()) < 256
    docs = TextSource(str(path), pack=False).batch(0, 20, 8)
    starts = {bytes(r).decode()[:5] for r in docs.tolist()}
    assert starts <= {"first", "secon"}  # rows start at document starts ("third" is too short)
    with pytest.raises(ConfigError, match=r"TextSource.path='.*none.txt' is not a file; pass the path of a UTF-8"):
        TextSource(str(tmp_path / "none.txt"))  # refused when the source is made, before any training


def test_training_learns_and_checkpoints(tmp_path):
    src = MarkovSource(vocab=32, k=2, seed=0)
    model = train(SPEC, src, CONFIG, tmp_path, progress=False)
    steps = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("step_*"))
    assert steps == CONFIG.checkpoint_steps() and steps[-1] == 30 and steps[0] == 1
    import json

    first = json.loads((tmp_path / "step_1" / "spec.json").read_text())["loss"]
    last = json.loads((tmp_path / "step_30" / "spec.json").read_text())["loss"]
    assert last < first - 0.5  # a 2-successor chain is learnable: loss falls well below log(32)
    reloaded = load_trained(tmp_path / "step_30")
    toks = src.batch(999, 2, 16)
    assert torch.equal(reloaded(toks), model(toks))
    assert not list(tmp_path.glob(".tmp_*"))
    frame = track(checkpoint_series(tmp_path), toks)
    assert list(frame.index) == steps


def test_resume_is_bitwise_identical(tmp_path):
    src = BigramBackcopy(vocab=32, seed=2)
    straight = train(SPEC, src, CONFIG, tmp_path / "a", progress=False)
    train(SPEC, src, CONFIG, tmp_path / "b", stop_after=13, progress=False)  # interrupted after step 13
    resumed = train(SPEC, src, CONFIG, tmp_path / "b", progress=False)  # resumes from the step-8 checkpoint
    for (name, p), (_, q) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(p, q), name


def test_training_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="TrainConfig.steps must be a positive int"):
        TrainConfig(steps=0)
    with pytest.raises(ConfigError, match="device must be 'auto', 'cpu' or 'cuda'"):
        TrainConfig(device="tpu")
    with pytest.raises(ConfigError, match="exceeds the model's n_ctx=32"):
        train(SPEC, MarkovSource(32), TrainConfig(steps=2, seq_len=64), tmp_path, progress=False)
    (tmp_path / "x.txt").write_text("some text\n\nmore text")
    with pytest.raises(ConfigError, match="the data use 257 token ids but the model has d_vocab=33"):
        train(SPEC, TextSource(str(tmp_path / "x.txt"), bos=256), TrainConfig(steps=2, seq_len=8), tmp_path,
              progress=False)


def test_train_and_track_commands(tmp_path, capsys):
    from p0circuit.surfaces.cli import main

    out = tmp_path / "run"
    args = ["train", "--data", "markov", "--vocab", "16", "--layers", "2", "--d-model", "16", "--heads", "2",
            "--d-head", "8", "--steps", "6", "--batch-size", "4", "--seq-len", "12", "--warmup", "2",
            "--quiet", "--out", str(out)]
    assert main(args) == 0
    assert (out / "step_6" / "model.safetensors").exists()
    assert main(["track", str(out), "--out", str(tmp_path / "t"), "--n-prompts", "4", "--seq-len", "12"]) == 0
    assert main(["train", "--data", "wiki", "--out", str(out)]) == 2
    assert "use 'markov', 'backcopy' or 'text:<path>'" in capsys.readouterr().err
    assert main(["track", str(out), "--bos", "--out", str(tmp_path / "t")]) == 2  # trained without BOS
    assert "--bos needs one known BOS id" in capsys.readouterr().err


def test_a_model_trained_with_bos_knows_its_bos_id(tmp_path, capsys):
    """Checkpoints remember the BOS id; probes then start with it (--bos) or never do (default)."""
    from p0circuit.surfaces.cli import main
    from p0circuit.models.tokens import bos_id

    out = tmp_path / "run"
    assert main(["train", "--data", "backcopy", "--vocab", "16", "--bos", "--layers", "1", "--d-model", "16",
                 "--heads", "2", "--d-head", "8", "--steps", "4", "--batch-size", "4", "--seq-len", "12",
                 "--warmup", "1", "--checkpoints", "2", "--quiet", "--out", str(out)]) == 0
    assert bos_id(load_trained(out / "step_4")) == 16
    for flag in ([], ["--bos"]):
        assert main(["track", str(out), *flag, "--n-prompts", "64", "--seq-len", "8", "--out", str(tmp_path / "t")]) == 0
    with pytest.raises(BadInputError, match="says no BOS"):
        track(checkpoint_series(out), torch.full((2, 5), 16), bos=False)


def test_hf_dataset_source_offline_error():
    from p0circuit.studies.training import hf_dataset_source

    with pytest.raises(BadInputError, match="without network access use TextSource"):
        hf_dataset_source("definitely/not-a-cached-dataset", limit=2)
