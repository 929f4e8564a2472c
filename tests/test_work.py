"""Work counted, not timed (``p0circuit/patching/work.py``): a forward of the batch counts one, a forward
stopped early counts its blocks' share, the count is the same for the same work on any machine, and the
analysis records it per step and warns, with the reason, when its steps ran far slower than it predicts."""

import warnings

import pytest
import torch

import p0circuit as p0
from p0circuit.patching import work
from p0circuit.studies.analysis import cost
from p0circuit.studies.analysis.records import StateHeader
from p0circuit.studies.analysis.cost import SLOW_SECONDS
from p0circuit.studies.analysis.run import UNIT, _counted, _State


def test_a_forward_of_the_batch_counts_one(planted):
    model = planted.model
    tokens = p0.probe_tokens(model, 4, 12, seed=0, regular=True)
    with torch.no_grad(), work.Count(model) as c:
        model(tokens)
    assert c.forwards(tokens.numel()) == pytest.approx(1.0, abs=1e-12)
    with torch.no_grad(), work.Count(model) as c:
        model(tokens[:2])  # half the rows: half a forward of the batch
    assert c.forwards(tokens.numel()) == pytest.approx(0.5, abs=1e-12)


def test_a_forward_stopped_early_counts_its_blocks(planted):
    model = planted.model
    tokens = p0.probe_tokens(model, 4, 12, seed=0, regular=True)
    with torch.no_grad(), work.Count(model) as c:
        model(tokens, stop_at_layer=2)
    assert c.forwards(tokens.numel()) == pytest.approx(2 * cost.block_cost(model), rel=1e-12)
    assert c.work["unembed"] == 0 and c.work["with_grad"] == 0


def test_a_forward_with_gradients_is_counted_apart():
    model = p0.build_planted().model
    tokens = p0.probe_tokens(model, 2, 8, seed=0, regular=True)
    resid = model.embed(tokens) + model.pos_embed(tokens) if model.cfg.positional_embedding_type == "standard" else \
        model.embed(tokens)
    resid = resid.detach().requires_grad_(True)
    with torch.enable_grad(), work.Count(model) as c:
        model(resid, start_at_layer=0)
    assert c.forwards(tokens.numel()) == pytest.approx(1.0, rel=1e-12)
    assert c.with_grad(tokens.numel()) == pytest.approx(1.0, rel=1e-12)
    with torch.no_grad(), work.Count(model) as c:
        model(tokens)
    assert c.with_grad(tokens.numel()) == 0


def test_counting_leaves_no_hook_and_is_not_a_users_hook(planted):
    """The counter's hooks read shapes only: the fast path runs beside them and they are gone after."""
    model = planted.model
    tokens = p0.probe_tokens(model, 4, 12, seed=0, regular=True)
    with work.Count(model):
        fast = p0.activation_patch(model, tokens, corruption="shift", metric="norm_ratio:1")
    assert fast.signal
    from p0circuit.core.threads import _look  # the thread policy's look (core/threads.share) stays; no counter's hook

    assert all(h is _look for m in model.modules() for h in m._forward_pre_hooks.values())


def test_identical_analyses_count_the_same_forwards(planted):
    """The issue's complaint: two identical analyses reported 191 and 753 forwards (seconds over a noisy
    unit forward). Counted, they are equal step by step, and they add up to the total."""
    runs = [p0.analyze(planted, progress=False, lengths=(), n_prompts=4)["timing"] for _ in range(2)]
    assert runs[0]["forwards_by_step"] == runs[1]["forwards_by_step"]
    assert runs[0]["forwards"] == pytest.approx(sum(runs[0]["forwards_by_step"].values()), abs=0.2)
    free = {k for k, v in runs[0]["predicted_forwards"].items() if v == 0}  # no forward: the weight table reads weights,
    assert free == {"weights", "without_bos/P0@L1/edges", "without_bos/special"}  # the edges were searched with the
    assert all(v > 0 for k, v in runs[0]["forwards_by_step"].items() if k not in free)  # nodes; no tokenizer, no token
    assert all(runs[0]["forwards_by_step"][k] == 0 for k in free)


def _state(seconds: float, forwards: float) -> _State:
    state = _State(None, StateHeader(model="m", settings={}, prompt_source="p", prompts={}), resume=False)
    state.done = {UNIT: {"value": None, "seconds": 0.5}, "a/nodes": {"value": 1, "seconds": seconds, "forwards": forwards}}
    return state


@pytest.mark.parametrize("others,why", [(0.0, "quiet"), (1.5, "other processes used 1.5")])
def test_a_slow_analysis_warns_and_says_why(others, why):
    with pytest.warns(UserWarning, match=why):
        out = _counted(_state(seconds=4 * SLOW_SECONDS, forwards=10), 0.5, others)
    assert out["slowdown"] == pytest.approx(4 * SLOW_SECONDS / 0.5 / 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _counted(_state(seconds=4 * SLOW_SECONDS, forwards=4 * SLOW_SECONDS / 0.5), 0.5, others)  # as predicted: silent


def test_a_resumed_step_without_a_count_leaves_the_total_unknown():
    state = _state(seconds=1.0, forwards=2.0)
    del state.done["a/nodes"]["forwards"]  # a step restored from a state written before steps were counted
    out = _counted(state, 0.5, 0.0)
    assert out["forwards"] is None and out["slowdown"] is None
