"""Determinism: the same seed gives bitwise the same planted model, prompts, patching results,
sweep results and training checkpoints on the CPU; a different seed gives different ones (so the
equalities below are not vacuous)."""

import json

import pytest
import torch

import p0circuit as p0
from p0circuit.surfaces.sweep import SweepConfig, run_sweep
from p0circuit.studies.training import BigramBackcopy, TrainConfig, train

from conftest import random_tokens


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def twin():
    """A second, independent build of the default planted model."""
    return p0.build_planted()


def test_planted_model_is_a_function_of_its_spec(planted, twin):
    assert _same_state(planted.model.state_dict(), twin.model.state_dict())
    assert planted.truth.to_dict() == twin.truth.to_dict() and planted.neurons == twin.neurons
    assert not _same_state(planted.model.state_dict(), p0.build_planted(seed=4).model.state_dict())


@pytest.mark.parametrize("method", ["activation", "path", "attribution"])
def test_patching_results_are_bitwise_repeatable(planted, twin, method):
    """Two independent builds, prompts drawn twice from the same seed: every effect is equal as a float."""
    fn = {"activation": p0.activation_patch, "path": p0.path_patch, "attribution": p0.attribution_patch}[method]
    results = []
    for plant in (planted, twin):
        toks = p0.regular_prompts(random_tokens(6, 12, 32, seed=5))
        results.append(fn(plant.model, toks, corruption="pos_mean", metric=p0.NormRatio(1)))
    a, b = results
    assert a.raw == b.raw and a.normalized == b.normalized and a.clean_metric == b.clean_metric
    assert len(a.raw) > 10


SWEEP = """
[sweep]
models = ["planted:rope"]
corruptions = ["shift", "pos_mean"]
methods = ["activation"]
n_prompts = 5
seq_len = 10
seed = {seed}
"""


def _sweep(tmp_path, name, seed, workers):
    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP.format(seed=seed))
    out = tmp_path / name
    run_sweep(SweepConfig.load(path), out, workers=workers, progress=False)
    records = {}
    for f in sorted((out / "cells").glob("*.json")):
        record = json.loads(f.read_text())
        record.pop("seconds")  # wall time is the one field that may differ
        records[f.name] = record
    return records


def test_whole_sweep_is_repeatable_in_process_and_in_a_pool(tmp_path):
    here = _sweep(tmp_path, "a", seed=7, workers=1)
    pooled = _sweep(tmp_path, "b", seed=7, workers=2)  # spawned workers (a forked pool deadlocked)
    assert len(here) == 2 and here == pooled  # every effect, node, score and sink-report number
    other = _sweep(tmp_path, "c", seed=8, workers=1)
    assert [r["sink_report"] for r in other.values()] != [r["sink_report"] for r in here.values()]


def test_training_from_scratch_writes_identical_checkpoints(tmp_path):
    spec = p0.ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=32, n_ctx=16, seed=0)
    config = TrainConfig(steps=12, batch_size=8, seq_len=16, warmup=2, n_checkpoints=3)
    for run in ("a", "b"):
        train(spec, BigramBackcopy(vocab=32, seed=1), config, tmp_path / run, progress=False)
    steps = sorted(p.name for p in (tmp_path / "a").glob("step_*"))
    assert steps == sorted(p.name for p in (tmp_path / "b").glob("step_*")) and len(steps) == 3
    for step in steps:
        a = (tmp_path / "a" / step / "model.safetensors").read_bytes()
        assert a == (tmp_path / "b" / step / "model.safetensors").read_bytes(), step
    train(spec, BigramBackcopy(vocab=32, seed=2), config, tmp_path / "c", progress=False)
    assert (tmp_path / "c" / steps[-1] / "model.safetensors").read_bytes() != a
