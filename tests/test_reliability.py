"""Reliability: bad input never escapes as a deep torch error, killed training loses nothing.

The catalogue of bad inputs, each tested with its message (file: test):

* empty / length-1 prompts, tokens out of range, wrong dtypes and shapes, 1-D promotion:
  test_tokens.py: test_bad_tokens; here: test_any_token_tensor_is_measured_or_rejected_clearly
  (hypothesis over shapes, dtypes, ranges); empty strings and text: test_tokens.py
* BOS present where the run says no BOS, and the reverse (tensors and text beginning with the BOS
  string; every entry point): test_tokens.py: test_text_that_begins_with_the_bos_string_is_caught,
  test_token_tensors_are_checked_against_the_bos_choice, test_bos_claims_reach_every_entry_point
* wrong devices and dtypes of the model (split over devices, meta weights, mixed dtypes, cfg.device
  out of step), meta tokens: test_tokens.py: test_meta_tokens_and_split_or_mismatched_models_are_rejected
* mismatched clean/corrupted batches, a corruption that leaves the metric unchanged, shifts beyond
  the context: test_patching_errors.py
* unknown node, edge and hook names, bad metrics and options: test_patching_errors.py; here:
  test_any_node_name_parses_or_is_rejected_clearly (hypothesis)
* NaN/inf activations, naming the first layer: test_metrics.py: test_report_names_first_nonfinite_layer
* checkpoint directories with missing or corrupt files: test_checkpoints.py
* sweep configs with typos and bad values: test_sweep.py: test_config_errors_name_the_key, test_config_file_errors
* interruption: here (training) and test_sweep.py: test_killed_sweep_resumes (SIGINT, SIGKILL)
* determinism: test_determinism.py; numerical care at P0: test_numerics.py
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import p0circuit as p0
from p0circuit import BadInputError, P0CircuitError

DTYPES = [torch.long, torch.int32, torch.int16, torch.float32, torch.float16, torch.bool, torch.uint8]


@pytest.fixture(scope="module")
def small():
    return p0.ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 14), min_size=0, max_size=3),
    dtype=st.sampled_from(DTYPES),
    low=st.integers(-5, 25),
)
def test_any_token_tensor_is_measured_or_rejected_clearly(small, shape, dtype, low):
    """Random shapes, dtypes and ranges: a report, or a BadInputError that says what to do."""
    tokens = (torch.arange(max(1, int(torch.tensor(shape).prod()) if shape else 1)) % 7 + low)
    tokens = tokens[: int(torch.tensor(shape).prod()) if shape else 1].reshape(shape).to(dtype)
    try:
        report = p0.sink_report(small, tokens)
    except P0CircuitError as e:
        assert isinstance(e, BadInputError) and len(str(e)) > 30
    else:
        assert report.seq_len >= 2 and report.n_prompts >= 1


@settings(max_examples=25, deadline=None)
@given(name=st.text(min_size=0, max_size=12))
def test_any_node_name_parses_or_is_rejected_clearly(name):
    try:
        node = p0.Node.parse(name)
    except BadInputError as e:
        assert "expected e.g." in str(e)
    else:
        assert p0.Node.parse(node.name) == node


TRAIN = ["train", "--data", "markov", "--vocab", "16", "--layers", "2", "--d-model", "32", "--heads", "2",
         "--d-head", "16", "--steps", "120", "--batch-size", "16", "--seq-len", "32", "--warmup", "5",
         "--checkpoints", "12", "--quiet"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted training run the killed ones are compared with (made once)."""
    from p0circuit.surfaces.cli import main

    out = tmp_path_factory.mktemp("straight")
    assert main(TRAIN + ["--out", str(out)]) == 0
    return out


@pytest.mark.xdist_group("killed-training")  # one worker: the straight run is made once
@pytest.mark.parametrize("sig,seed", [(signal.SIGKILL, 0), (signal.SIGINT, 1)])
def test_killed_training_resumes_without_lost_steps(tmp_path, straight, sig, seed):
    """Kill a training run at a random point after its first checkpoint (SIGKILL, or SIGINT as from
    Ctrl-C); the resumed run ends bitwise equal to an uninterrupted one, every checkpoint step is
    there once, and no half-written checkpoint is left behind."""
    import random

    args = TRAIN
    from p0circuit.surfaces.cli import main

    rng = random.Random(seed)
    for attempt in range(3):
        out = tmp_path / f"killed{attempt}"
        # SIGINT back to its default in the child: a suite started in the background passes it on ignored
        proc = subprocess.Popen([sys.executable, "-m", "p0circuit.surfaces.cli", *args, "--out", str(out)],
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and not list(out.glob("step_*")):
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.5))  # somewhere in the run, maybe inside a save
        if proc.poll() is None:
            break
        # the run ended before the kill (a machine busy enough to keep this process from it): try again;
        # a run that was alive when killed is judged below, whatever it did
    else:
        raise AssertionError("three runs ended before their kill; make the run longer")
    os.kill(proc.pid, sig)
    status = proc.wait(timeout=60)
    done = sorted(int(p.name.split("_")[1]) for p in out.glob("step_*"))
    assert status == (-signal.SIGKILL if sig == signal.SIGKILL else 130), f"exit status {status} after {sig!r}"
    assert done and done[-1] < 120, f"the run went on to step {done[-1] if done else None} after {sig!r}"
    for step in done:  # whatever was written is whole
        assert (out / f"step_{step}" / "model.safetensors").exists() and (out / f"step_{step}" / "trainer.pt").exists()
    assert main(args + ["--out", str(out)]) == 0
    from p0circuit.studies.training import load_trained

    a, b = load_trained(straight / "step_120"), load_trained(out / "step_120")
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in straight.iterdir())  # no tmp left
