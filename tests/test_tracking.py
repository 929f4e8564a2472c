"""The tracker on a synthetic series of planted variants whose stages are known."""

import pytest
import torch

import p0circuit as p0
from p0circuit import BadInputError, CheckpointError
from p0circuit.studies.tracking import checkpoint_series, plot_tracking, stage, track

from conftest import random_tokens


@pytest.fixture(scope="session")
def plants():
    """Step 10: circuit in middle layers; step 100: sink at position 1; step 1000: circuit at layers 0-1."""
    return {1000: p0.build_planted(n_layers=6), 10: p0.build_planted(n_layers=6, circuit_layer=2),
            100: p0.build_planted(n_layers=6, sink_pos=1)}


@pytest.fixture(scope="session")
def series(plants):
    return [(step, plant.model) for step, plant in plants.items()]


def tokens():
    toks = random_tokens(16, 32, 32, seed=4)
    return toks[p0.p0_like_positions(toks)[:, 1:].sum(1) == 0]


def test_stages_of_a_planted_series(series, plants, tmp_path):
    """Patching locates each plant's circuit exactly (its ground-truth nodes), and the stages follow."""
    frame = track(series, tokens())
    assert list(frame.index) == [10, 100, 1000]
    assert list(frame["stage"]) == ["early", "transition", "converged"]
    assert list(frame["located_by"]) == ["patching"] * 3
    assert list(frame["circuit_layers"]) == ["2-3", "0-1", "0-1"]
    for step, plant in plants.items():
        assert set(frame.loc[step, "circuit_nodes"].split()) == {n.name for n in plant.truth.writers}, step
    assert "patching" in frame.loc[10, "rule"] and "reaches middle layers" in frame.loc[10, "rule"]
    assert frame.loc[10, "norm_onset"] == 3 and frame.loc[1000, "norm_onset"] == 1
    assert frame.loc[100, "sink_position"] == 1 and frame.loc[1000, "sink_position"] == 0
    plot_tracking(frame, tmp_path / "track.png")
    assert (tmp_path / "track.png").stat().st_size > 1000


def test_norm_profile_where_patching_is_not_affordable(series):
    """The same series located from the norm profile only (a node budget below the models' size)."""
    frame = track(series, tokens(), max_nodes=10)
    assert list(frame["located_by"]) == ["norm profile", "none", "norm profile"]
    assert list(frame["stage"]) == ["early", "transition", "converged"]
    assert list(frame["circuit_layers"]) == ["3", "", "1"]
    with pytest.raises(p0.ConfigError, match="locate must be one of"):
        track(series, tokens(), locate="acdc")


def test_locate_on_planted_variants(planted_models):
    """locate() returns the planted nodes, their layers, and nothing for a model without a sink."""
    from p0circuit.studies.discovery.locate import locate

    for variant in ("rope", "learned", "layer2"):
        plant = planted_models(variant)
        where = locate(p0.Setup.of(plant.model, tokens(), corruption="shift"))
        assert set(where.nodes) == {n.name for n in plant.truth.writers}, variant
        assert where.by == "patching" and where.layers == tuple(sorted({n.layer for n in plant.truth.writers} - {-1}))
    untrained = p0.ModelSpec(pos="rope", n_layers=3, d_vocab=32).build()
    assert locate(p0.Setup.of(untrained, tokens(), corruption="shift")).by == "none"
    with pytest.raises(p0.BadInputError, match="setup"):
        locate(plant.model)  # the model alone: make a Setup


def test_untrained_model_is_early():
    model = p0.ModelSpec(pos="nope", n_layers=3, d_vocab=32).build()
    label, rule = stage(p0.sink_report(model, tokens()))
    assert label == "early" and "no layer reaches" in rule


def test_local_checkpoint_directory(tmp_path):
    from family_configs import make_checkpoint

    for step in (5, 50):
        make_checkpoint("llama", tmp_path, seed=step, with_tokenizer=True).rename(tmp_path / f"step_{step}")
    (tmp_path / "notes").mkdir()
    loaded = checkpoint_series(tmp_path)
    assert [s for s, _ in loaded] == [5, 50]
    frame = track(loaded, torch.randint(3, 64, (4, 16)))
    assert list(frame.index) == [5, 50] and set(frame["stage"]) <= {"early", "transition", "converged"}


def test_bad_series(tmp_path, series):
    with pytest.raises(CheckpointError, match=r"holds no step_<N> checkpoints \(directories or step_<N>.gguf files\)"):
        checkpoint_series(tmp_path)
    (tmp_path / "step_3").mkdir()
    with pytest.raises(CheckpointError, match="holds no spec.json or config.json and 0 .gguf files"):
        checkpoint_series(tmp_path)
    with pytest.raises(BadInputError, match="empty"):
        track([], tokens())
    with pytest.raises(BadInputError, match="duplicate steps"):
        track([series[0], series[0]], tokens())


def test_track_command(tmp_path, capsys):
    from family_configs import make_checkpoint

    from p0circuit.surfaces.cli import main

    for step in (1, 8):
        make_checkpoint("gpt2", tmp_path / "ck", seed=step, with_tokenizer=True).rename(tmp_path / "ck" / f"step_{step}")
    assert main(["track", str(tmp_path / "ck"), "--out", str(tmp_path / "out"), "--n-prompts", "4"]) == 0
    assert (tmp_path / "out" / "tracking.png").exists() and "stage" in capsys.readouterr().out
