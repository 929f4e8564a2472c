"""Sweeps: validated TOML configs, atomic per-cell results, resume after interruption."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from p0circuit import BadInputError, ConfigError
from p0circuit.surfaces.cli import main
from p0circuit.surfaces.sweep import SweepConfig, run_sweep

CONFIG = """
[sweep]
models = ["planted:rope", "planted:nope"]
corruptions = ["shift", "resample"]
methods = ["activation"]
n_prompts = 6
seq_len = 12
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize(
    "table,msg",
    [
        ('modles = ["planted:rope"]', r"unknown sweep key\(s\) \['modles'\]; valid keys: \["),
        ('corruptions = ["shuffle"]', r"sweep.corruptions: \['shuffle'\] not valid; choose from \['copies', 'pos_mean', 'resample', 'shift'"),
        ('methods = ["acdc"]', r"sweep.methods: \['acdc'\] not valid; choose from"),
        ('models = ["planted:alibi"]', "use 'planted:<variant>' with variant in"),
        ('metrics = ["norm_ratio:x"]', r"sweep.metrics: metric 'norm_ratio:x' not valid: norm_ratio takes a block number, e.g. 'norm_ratio:2'"),
        ('metrics = ["sink_head"]', r"sweep.metrics: metric 'sink_head' not valid \(did you mean 'sink_heads'\?\); use one of \['sink_heads', 'attn_to_p0', 'norm_ratio:<layer>'\]"),
        ("n_prompts = 1", "sweep.n_prompts must be an integer >= 2"),
        ("threshold = -1", r"SweepConfig.threshold=-1 must be >= 0"),
        ("models = []", "sweep.models must be a non-empty list"),
    ],
)
def test_config_errors_name_the_key(tmp_path, table, msg):
    path = tmp_path / "bad.toml"
    path.write_text("[sweep]\n" + table + "\n")
    with pytest.raises(ConfigError, match=msg):
        SweepConfig.load(path)


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        SweepConfig.load(tmp_path / "none.toml")
    (tmp_path / "x.toml").write_text("[sweep\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        SweepConfig.load(tmp_path / "x.toml")
    (tmp_path / "y.toml").write_text("[other]\na = 1\n")
    with pytest.raises(ConfigError, match=r"exactly one \[sweep\] table"):
        SweepConfig.load(tmp_path / "y.toml")
    assert main(["sweep", str(tmp_path / "y.toml"), "--out", str(tmp_path / "o")]) == 2


def test_dry_run_lists_cells(config_file, tmp_path, capsys):
    assert main(["sweep", str(config_file), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("todo") == 4 and "4 cells, 0 already done" in out
    assert not (tmp_path / "out").exists()


def test_resume_loses_and_repeats_nothing(config_file, tmp_path):
    config = SweepConfig.load(config_file)
    out = tmp_path / "out"
    computed = []
    run_sweep(config, out, max_cells=1, progress=False, on_done=lambda r: computed.append(r["key"]))
    first = (out / "cells" / f"{computed[0]}.json").stat().st_mtime_ns
    records = run_sweep(config, out, progress=False, on_done=lambda r: computed.append(r["key"]))
    assert len(computed) == 4 and len(set(computed)) == 4  # each cell computed exactly once
    assert (out / "cells" / f"{computed[0]}.json").stat().st_mtime_ns == first
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and len({json.loads(l)["key"] for l in lines}) == 4
    by_corruption = {r["cell"]["corruption"]: r for r in records if r["cell"]["model"] == "planted:rope"}
    assert by_corruption["shift"]["scores"]["node_auroc"] == 1.0
    assert by_corruption["resample"]["signal"] is False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL, signal.SIGTERM])
def test_killed_sweep_resumes(tmp_path, sig):
    """Kill a sweep at a random point after its first cell: on restart every cell is there once,
    none half-written. SIGTERM ends it with a message and exit status 143. (Eight cells, the kill within 0.1 s of
    the first: with four cells and up to 0.5 s a quiet machine once finished the sweep before the kill.)"""
    config_file = tmp_path / "sweep.toml"
    config_file.write_text(CONFIG.replace('methods = ["activation"]', 'methods = ["activation", "path"]'))
    cells = 8
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "p0circuit.surfaces.cli", "sweep", str(config_file), "--out", str(out), "--quiet"]
    # SIGINT back to its default in the child: a suite started in the background (``cmd &``) passes it on ignored
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "cells").glob("*.json")):
        time.sleep(0.05)
    assert list((out / "cells").glob("*.json")), "no cell finished in time"
    time.sleep(random.Random(int(sig)).uniform(0, 0.1))  # a random point inside a later cell
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and b"terminated (SIGTERM)" in err and b"Traceback" not in err
    partial = {json.loads(p.read_text())["key"] for p in (out / "cells").glob("*.json")}  # every file parses
    assert 1 <= len(partial) < cells  # interrupted before the end
    index = out / "results.jsonl"  # the kill may land between a cell file and the index: both are whole
    if index.exists():
        assert {json.loads(l)["key"] for l in index.read_text().splitlines()} <= partial
    assert main(["sweep", str(config_file), "--out", str(out), "--quiet"]) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == cells and len({json.loads(l)["key"] for l in lines}) == cells
    assert partial <= {json.loads(l)["key"] for l in lines}


def test_shipped_demo_config_is_valid():
    from pathlib import Path

    config = SweepConfig.load(Path(__file__).parent.parent / "configs" / "demo.toml")
    assert len(config.cells()) == 18


@pytest.mark.ray
def test_sweep_on_a_local_ray_cluster(config_file, tmp_path):
    """Opt in with `pytest -m ray` after `pip install -e '.[ray]'`: same atomic, resumable results."""
    pytest.importorskip("ray")
    config = SweepConfig.load(config_file)
    out = tmp_path / "out"
    run_sweep(config, out, max_cells=2, progress=False, executor="ray", workers=2)
    assert len(list((out / "cells").glob("*.json"))) == 2
    records = run_sweep(config, out, progress=False, executor="ray", workers=2)
    assert len(records) == 4 and len({r["key"] for r in records}) == 4
    assert len((out / "results.jsonl").read_text().splitlines()) == 4


def test_unknown_executor(config_file, tmp_path):
    with pytest.raises(BadInputError, match="run_sweep: executor='slurm' \\(str\\) is not 'local' or 'ray'; pass"):
        run_sweep(SweepConfig.load(config_file), tmp_path, executor="slurm")


def test_spec_models_in_sweeps_and_discover(tmp_path, capsys):
    config = SweepConfig(models=["spec:nope"], metrics=["attn_to_p0"], n_prompts=4, seq_len=8)
    records = run_sweep(config, tmp_path / "s", progress=False)
    assert records[0]["cell"]["model"] == "spec:nope" and "sink_report" in records[0]
    with pytest.raises(ConfigError, match="'spec:<family>' with family in"):
        SweepConfig(models=["spec:mamba"])
    assert main(["discover", "--spec", "nope", "--out", str(tmp_path / "d"), "--n-prompts", "4",
                 "--seq-len", "8", "--methods", "activation"]) == 0
    assert "untrained nope model" in capsys.readouterr().out
