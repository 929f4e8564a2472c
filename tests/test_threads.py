"""The thread policy (p0circuit/core/threads.py): one thread while other processes keep the cores busy,
the count it found otherwise, and never over a user's own choice. The busy cases run a busy process beside
a fresh Python process and drive the policy's looks at the machine directly."""

import json
import os
import subprocess
import sys
import time

import pytest

from p0circuit.core import threads

CLEAN = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

LOOKS = """
import json, sys, time, torch
from p0circuit.core import threads
threads.INTERVAL = 0.2
for _ in range(4):  # looks 0.3 s apart: the first records, each later one decides
    threads.adapt()
    time.sleep(0.3)
print(json.dumps({**threads.status(), "torch_threads": torch.get_num_threads()}))
"""


def child(code: str, busy: bool = False, **env: str) -> dict:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if busy else 0)]
    try:
        out = subprocess.run([sys.executable, "-c", code], env={**CLEAN, **env}, capture_output=True, text=True,
                             timeout=300)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fewer_threads_beside_busy_processes():
    got = child(LOOKS, busy=True)  # torch's own default count: p0circuit may change it
    free = max(1, min(threads.default_threads(), int((os.cpu_count() or 1) - got["others_cores"])))
    assert got["torch_threads"] == free < threads.default_threads() or threads.default_threads() == 1, got
    assert got["others_cores"] > threads.BUSY and got["policy"].startswith("adaptive"), got


def test_the_count_comes_back_when_the_machine_is_quiet_again(monkeypatch):
    """Driven in this process: the looks are given the machine's and this process's CPU times."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (set for the suite's workers: a fixed share each)
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    policy, before = threads._Policy(), torch.get_num_threads()
    cpu = {"machine": 0.0, "own": 0.0}
    monkeypatch.setattr(threads, "_machine_cpu", lambda: cpu["machine"])
    monkeypatch.setattr(threads, "_own_cpu", lambda: cpu["own"])
    try:
        torch.set_num_threads(2)
        for machine_step, want in ((0.0, None), (1.5, 1), (0.05, 2), (1.2, 1), (0.4, 1), (0.1, 2)):
            cpu["machine"] += machine_step
            policy.sample = policy.sample and (policy.sample[0] - threads.INTERVAL, *policy.sample[1:])
            policy.adapt()
            if want is not None:
                assert torch.get_num_threads() == want, (machine_step, policy.others)
        assert policy.off is None and policy.drops == 2  # (0.4 cores of others: still one thread, no new drop)
        # a big machine: half a core of other work leaves the rest of the cores to p0circuit, not one thread
        monkeypatch.setattr(threads.os, "cpu_count", lambda: 64)
        big = threads._Policy()
        big.found = big.chosen = 2
        big.sample = (0.0, cpu["machine"], cpu["own"])
        cpu["machine"] += 0.5
        big.sample = (big.sample[0] - 2 * threads.INTERVAL, *big.sample[1:])
        big.adapt()
        assert torch.get_num_threads() == 2 and big.drops == 0
    finally:
        torch.set_num_threads(before)


def test_the_users_thread_count_wins():
    # OMP_NUM_THREADS (the user's, or --threads / set_threads): never changed, even beside busy processes
    got = child(LOOKS, busy=True, OMP_NUM_THREADS="2")
    assert got["torch_threads"] == 2 and got["policy"] == "fixed: OMP_NUM_THREADS is set", got
    # a count the user set before importing p0circuit (a notebook that imported torch first): theirs, kept
    other = 1 if threads.default_threads() > 1 else 2
    got = child(f"import torch\ntorch.set_num_threads({other})\nimport p0circuit\n" + LOOKS, busy=True)
    assert got["torch_threads"] == other and "before p0circuit's first look" in got["policy"], got
    # a count the user sets between p0circuit's looks: theirs from then on
    got = child("import torch\nfrom p0circuit.core import threads\nthreads.adapt()\n"
                f"torch.set_num_threads({other})\n" + LOOKS, busy=True)
    assert got["torch_threads"] == other and "outside p0circuit" in got["policy"], got


def test_the_cli_threads_flag_reaches_the_command(tmp_path):
    """``p0circuit --threads 1 ...`` as a user runs it: the analysis records the fixed count."""
    out = subprocess.run([sys.executable, "-m", "p0circuit.surfaces.cli", "analyze", "--model", "planted:rope",
                          "--threads", "1", "--out", str(tmp_path), "--quiet", "--n-prompts", "4"],
                         env=CLEAN, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    timing = json.loads((tmp_path / "analysis.json").read_text())["timing"]["threads"]
    assert timing["threads"] == 1 and timing["policy"] == "fixed: OMP_NUM_THREADS is set", timing


def test_threads_flag_sets_the_count_here_and_for_child_processes():
    got = child("import json, os, torch\nfrom p0circuit.surfaces.cli import build_parser\n"
                "from p0circuit.core.threads import set_threads\n"
                "set_threads(build_parser().parse_args(['--threads', '1', 'survey']).threads)\n"
                "print(json.dumps({'threads': torch.get_num_threads(), 'env': os.environ['OMP_NUM_THREADS']}))",
                OMP_NUM_THREADS="2")
    assert got == {"threads": 1, "env": "1"}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused_naming_the_fix(bad):
    from p0circuit.core.errors import P0CircuitError

    with pytest.raises(P0CircuitError, match=r"threads"):
        threads.set_threads(bad)


def test_the_cli_refuses_a_bad_threads_flag_before_any_work(capsys):
    from p0circuit.surfaces.cli import main

    for argv in (["--threads", "0", "survey"], ["survey", "--threads", "0"], ["analyze", "--threads=0"]):
        assert main(argv) == 2
        assert "--threads: set_threads: threads=0 must be in [1, 4096]" in capsys.readouterr().err, argv


def test_contention_sees_another_busy_process():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        with threads.Contention() as seen:
            time.sleep(1.0)  # this process idles: whatever the cores did was someone else's work
    finally:
        burner.kill()
        burner.wait()
    assert seen.others > threads.BUSY and seen.busy
    assert "other processes used" in seen.warning("the forward")


def _simulated(monkeypatch):
    """A fresh policy on a simulated 2-core machine whose CPU times the test sets (``cpu``), looks 2 s apart."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (set for the suite's workers: a fixed share each)
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "_POLICY", threads._Policy())
    cpu = {"machine": 0.0, "own": 0.0, "now": 100.0}
    monkeypatch.setattr(threads, "_machine_cpu", lambda: cpu["machine"])
    monkeypatch.setattr(threads, "_own_cpu", lambda: cpu["own"])
    monkeypatch.setattr(threads.time, "perf_counter", lambda: cpu["now"])
    return cpu


def _others_use(cpu, cores):
    """Two seconds pass in which other processes use ``cores`` of the machine (this process none)."""
    cpu["now"] += 2.0
    cpu["machine"] += 2.0 * cores


@pytest.mark.parametrize("build", ["spec", "planted", "wrapped"])
def test_the_users_own_forwards_share_a_busy_machine(monkeypatch, build):
    """Issue 52: a plain ``model(tokens)`` (and ``run_with_cache``) of a model p0circuit built, or was given,
    takes the policy's look too: one thread while others keep the cores busy, the count found once quiet."""
    import torch
    from transformer_lens import HookedTransformer

    import p0circuit as p0
    from p0circuit.patching.hooking import user_hooks

    before = torch.get_num_threads()
    cpu = _simulated(monkeypatch)
    spec = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=16, n_ctx=8)
    try:
        torch.set_num_threads(2)  # torch's own default here (the suite's workers take one thread each)
        if build == "spec":
            model = spec.build()
        elif build == "planted":
            model = p0.build_planted().model
        else:
            model = HookedTransformer(spec.to_config("cpu"))
            assert not model._forward_pre_hooks  # a model of the user's own: no look until p0circuit is given it
            p0.sink_report(model, p0.probe_tokens(model, 2, 6, seed=0, regular=True))
        tokens = p0.probe_tokens(model, 2, 6, seed=0, regular=True)
        with torch.no_grad():
            model(tokens)  # a look (the first was taken while the model was built or checked)
            _others_use(cpu, 1.8)
            model(tokens)
            assert torch.get_num_threads() == 1, threads.status()
            _others_use(cpu, 0.0)
            model.run_with_cache(tokens)
            assert torch.get_num_threads() == 2, threads.status()
        assert not user_hooks(model)  # the look is p0circuit's own: the fast path still runs
    finally:
        torch.set_num_threads(before)


def test_the_users_thread_choice_wins_in_their_own_forwards(monkeypatch):
    """``OMP_NUM_THREADS`` (or ``set_threads``, ``--threads``) and a ``torch.set_num_threads`` of the user's
    between two forwards: the look never changes the count again, busy or quiet."""
    import torch

    import p0circuit as p0

    before = torch.get_num_threads()
    model = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=16, n_ctx=8).build()
    tokens = p0.probe_tokens(model, 2, 6, seed=0, regular=True)
    try:
        for choice, want in (("environment", 2), ("torch", 1)):
            cpu = _simulated(monkeypatch)
            torch.set_num_threads(2)
            with torch.no_grad():
                model(tokens)  # the first look: 2 threads found
                if choice == "environment":
                    monkeypatch.setenv("OMP_NUM_THREADS", "2")
                else:
                    torch.set_num_threads(1)  # the user's own count, between two forwards
                for others in (1.8, 0.0):  # busy (p0circuit alone would take 1), then quiet (it would go back to 2)
                    _others_use(cpu, others)
                    model(tokens)
                    assert torch.get_num_threads() == want, (choice, others, threads.status())
            assert threads._POLICY.off, threads.status()
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    finally:
        torch.set_num_threads(before)


def test_the_look_is_added_once_and_pickles_with_the_model():
    import pickle

    import p0circuit as p0

    model = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=16, n_ctx=8).build()
    threads.share(threads.share(model))
    assert list(model._forward_pre_hooks.values()) == [threads._look]
    again = pickle.loads(pickle.dumps(model))
    assert list(again._forward_pre_hooks.values()) == [threads._look]
