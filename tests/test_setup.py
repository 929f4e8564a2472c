"""One checked setup, carried by every result and circuit made from it, and every number of the search
layer guarded like the engine's (p0circuit/patching/setup.py, circuit_search.py, circuit_edges.py,
faithfulness.py)."""

import dataclasses
import re

import pytest
import torch

import p0circuit as p0
from p0circuit.patching.setup import Setup

LAYER = 1


@pytest.fixture(scope="module")
def screened(planted):
    toks = p0.probe_tokens(planted.model, 12, 16, seed=3, regular=True)
    res = p0.activation_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    return toks, res


def test_a_result_carries_its_setup_and_a_circuit_its_result(planted, screened):
    toks, res = screened
    assert res.setup.model is planted.model and torch.equal(res.setup.tokens, toks) and res.setup.options.bos is False
    assert res.settings["bos"] is False and res.settings["tokens"]["sha256"] == res.setup.describe()["tokens"]["sha256"]
    found = p0.faithful_circuit(res)
    assert found.result is res and found.setup is res.setup and found.search.faithful
    assert found.search.settings["setup"]["corruption_params"]["k"] == 1 == found.settings["setup"]["corruption_params"]["k"]
    edges = p0.faithful_edges(found)
    assert edges.search is found.search and edges.result is res and edges.setup is res.setup
    assert "result" not in found.search.to_dict() and "circuit" not in edges.edge_search.to_dict()  # descriptions only
    assert "setup" in found.search.to_dict()["settings"] and "search" not in found.to_dict()


def test_a_search_given_another_setup_is_refused_naming_what_differs(planted, screened):
    toks, res = screened
    other = Setup.of(planted.model, toks, corruption=p0.Shift(2), metric=p0.NormRatio(LAYER), bos=False)
    for call in (lambda: p0.faithful_circuit(res, setup=other), lambda: p0.faithfulness_curve(res, setup=other)):
        with pytest.raises(p0.BadInputError, match=r"another setup \(corruption_params: the result's \{'k': 1.*given \{'k': 2"):
            call()
    other_bos = Setup.of(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=None)
    with pytest.raises(p0.BadInputError, match="bos: the result.s False, given None"):
        p0.faithful_circuit(res, setup=other_bos)
    # the same study given again is accepted (a setup made anew equals the result's)
    same = Setup.of(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    assert p0.faithful_circuit(res, setup=same).nodes == p0.faithful_circuit(res).nodes


def test_a_swap_result_searched_with_another_token_is_refused(planted):
    """The issue's case: a circuit searched under Swap(token=2) on a result made with Swap(token=3)."""
    toks = p0.probe_tokens(planted.model, 12, 16, seed=3, regular=True)
    res = p0.activation_patch(planted.model, toks, corruption=p0.Swap(token=3), metric=p0.NormRatio(LAYER),
                              bos=False, nodes=["A0.H0@0", "M0@0", "M1@0", "E@0"])
    other = Setup.of(planted.model, toks, corruption=p0.Swap(token=2), metric=p0.NormRatio(LAYER), bos=False)
    with pytest.raises(p0.BadInputError, match="corruption_params"):
        p0.faithful_circuit(res, setup=other)


def test_a_result_read_back_without_its_setup(planted, screened):
    toks, res = screened
    bare = dataclasses.replace(res, setup=None)  # what a result read back from a file is
    with pytest.raises(p0.BadInputError, match=r"carries no setup .*setup=p0.Setup.of"):
        p0.faithful_circuit(bare)
    wrong = Setup.of(planted.model, toks, corruption=p0.Shift(2), metric=p0.NormRatio(LAYER), bos=False)
    with pytest.raises(p0.BadInputError, match="not the one the result was computed with"):
        p0.faithful_circuit(bare, setup=wrong)
    other_tokens = Setup.of(planted.model, toks.flip(0), corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    with pytest.raises(p0.BadInputError, match="tokens"):
        p0.faithful_circuit(bare, setup=other_tokens)
    right = Setup.of(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    assert p0.faithful_circuit(bare, setup=right).nodes == p0.faithful_circuit(res).nodes


def test_the_old_call_form_says_the_new_one(planted, screened):
    toks, res = screened
    with pytest.raises(p0.BadCallError, match=r"faithful_circuit\(result"):
        p0.faithful_circuit(planted.model, toks, result=res, corruption="shift", metric=p0.NormRatio(LAYER))
    with pytest.raises(p0.BadInputError, match="is not PatchResult; pass the PatchResult of activation_patch"):
        p0.faithfulness_curve(planted.model)


def test_weights_changed_since_the_result_are_refused(planted, screened):
    toks, res = screened
    model = planted.model
    w = model.blocks[0].mlp.W_out
    saved = w.detach().clone()
    with torch.no_grad():
        w.mul_(1.5)
    try:
        with pytest.raises(p0.BadInputError, match=r"weights changed since the result was computed \(blocks\.0\.mlp\.W_out"):
            p0.faithful_circuit(res)
    finally:
        with torch.no_grad():
            w.copy_(saved)  # bitwise: the searches below check the weights' digest


class _FailsOnNewRuns:
    """A metric that is finite on every run it has seen, and NaN on any other once ``strict``: one that
    fails only on some runs (as a float16 overflow of several patches together does)."""

    def __init__(self):
        self.strict, self.learning, self.seen = False, True, set()

    def __call__(self, acts, p0_):
        resid = acts[p0.hooks.resid_post(LAYER)].float()
        norms = resid.norm(dim=-1)
        value = (norms[:, p0_] / norms[:, p0_ + 1:].mean(-1)).mean()
        key = round(float(value), 4)
        if self.strict and key not in self.seen:
            return torch.tensor(float("nan"))
        if self.learning:
            self.seen.add(key)
        return value


def _metric(fn):
    return p0.CacheMetric(fn, [(LAYER, p0.hooks.resid_post(LAYER))])


def test_a_non_finite_search_step_raises_the_engines_error(planted):
    """NaN in a multi-node evaluation never stands beside faithful=True: the search raises NonFiniteError,
    naming the step, in every search of the layer."""
    toks = p0.probe_tokens(planted.model, 12, 16, seed=3, regular=True)
    fn = _FailsOnNewRuns()
    res = p0.activation_patch(planted.model, toks, corruption="shift", metric=_metric(fn), bos=False)
    # a second result: a search of ``res`` again would reuse its first search's evaluations, not run them
    unsearched = p0.activation_patch(planted.model, toks, corruption="shift", metric=_metric(fn), bos=False)
    fn.learning = False  # from here on only the clean, corrupted and single-node runs are known
    found = p0.faithful_circuit(res)  # every value finite: a circuit
    fn.strict = True
    with pytest.raises(p0.NonFiniteError, match=r"after corrupting \d+ of \d+ candidate nodes together"):
        p0.faithful_circuit(unsearched)
    with pytest.raises(p0.NonFiniteError, match="faithfulness_curve at fraction"):
        p0.faithfulness_curve(res, fractions=(0.05, 0.5))
    # the edge search: every single edge's value known (learned from path patching its candidates alone), so
    # the NaN comes from the search's own evaluations of many edges together
    fn.strict = False
    candidates = list(p0.faithful_edges(found).edge_search.effects)
    fn.learning = True
    p0.path_patch(planted.model, toks, edges=candidates, corruption="shift", metric=_metric(fn), bos=False,
                  min_signal=0)
    fn.learning, fn.strict = False, True
    with pytest.raises(p0.NonFiniteError, match="faithful_edges' evaluation"):
        p0.faithful_edges(found)


def test_setup_but_changes_only_how_patches_run(planted, screened):
    _, res = screened
    assert res.setup.but(direction="denoise").options.direction == "denoise"
    with pytest.raises(p0.BadInputError, match="make a new Setup.of"):
        res.setup.but(corruption="zero")
    zero = Setup.of(planted.model, res.setup.tokens, corruption="zero", metric=p0.NormRatio(LAYER))
    with pytest.raises(p0.ConfigError, match="needs a corrupted run"):
        zero.but(direction="denoise")


def test_one_circuit_type_scored_without_a_plotting_library(planted, screened):
    """A search's node and edge circuits become the one Circuit type that p0.compare scores and the figures
    draw; compare, prune and auroc live beside the type and import no graphviz."""
    import subprocess
    import sys

    _, res = screened
    nodes_c = p0.faithful_circuit(res)
    edges_c = p0.faithful_edges(nodes_c)
    found, edges = nodes_c.search, edges_c.edge_search
    assert isinstance(nodes_c, p0.Circuit) and isinstance(edges_c, p0.Circuit) and not hasattr(nodes_c, "to_circuit")
    assert nodes_c.level == "node" and edges_c.level == "edge" and nodes_c.node_names == set(found.nodes)
    assert edges_c.edge_names == set(edges.edges) and edges_c.settings["faithfulness"] == found.faithfulness
    assert edges_c.settings["edge_faithfulness"] == edges.faithfulness
    assert edges_c.settings["setup"] == res.setup.describe()
    assert p0.compare(nodes_c, planted.truth)["node_recall"] == 1.0
    assert p0.prune(nodes_c, top_k=1).node_names <= nodes_c.node_names
    code = ("import sys, p0circuit.core.circuits as c; c.compare, c.prune, c.auroc; "
            "sys.exit(int('graphviz' in sys.modules or 'torch' in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    from p0circuit.patching import circuit_search
    assert not hasattr(circuit_search, "prune")  # one prune: the search's own is acdc_prune


def test_moved_names_point_at_what_exists():
    """Every replacement _moved.py names (module.attribute) imports: a doc never sends users to nothing."""
    import importlib
    import re

    from p0circuit import _moved

    said = " ".join(list(_moved.MODULES.values()) + list(_moved.NAMES.values()))
    for path in sorted(set(re.findall(r"p0circuit(?:\.\w+)+", said))):
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"_moved.py names {path}, which does not exist"
                obj = getattr(obj, attr)
            break


def test_a_search_refuses_a_model_that_now_carries_hooks(planted):
    """A result made on the slow path (reference=True) is searched on the fast path, which refuses the model's
    own hooks, as patching does."""
    toks = p0.probe_tokens(planted.model, 8, 12, seed=4, regular=True)
    res = p0.activation_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False,
                              nodes=["A0.H0@0", "M0@0", "M1@0"], reference=True)
    planted.model.blocks[0].hook_resid_pre.add_hook(lambda act, hook: act, is_permanent=True)
    try:
        with pytest.raises(p0.BadInputError, match="carries hooks of its own"):
            p0.faithful_circuit(res)
    finally:
        planted.model.reset_hooks(including_permanent=True)


def test_a_subclass_that_keeps_a_builtin_name_is_told_apart(planted):
    """``class MyShift(Shift)`` records as 'shift', but its setup names its class: a search given a real Shift
    setup is refused."""
    from p0circuit.patching.corruptions import Shift

    class MyShift(Shift):
        pass

    toks = p0.probe_tokens(planted.model, 8, 12, seed=4, regular=True)
    mine = Setup.of(planted.model, toks, corruption=MyShift(), metric=p0.NormRatio(LAYER), bos=False)
    theirs = Setup.of(planted.model, toks, corruption=Shift(), metric=p0.NormRatio(LAYER), bos=False)
    assert mine.describe()["corruption"] == "shift"
    assert any("corruption_class" in d for d in mine.differences(theirs))


def test_a_result_pickles_without_its_model(screened):
    import pickle

    _, res = screened
    copy = pickle.loads(pickle.dumps(res))
    assert copy.setup is None and copy.raw == res.raw and res.setup is not None
    with pytest.raises(p0.BadInputError, match="carries no setup"):
        p0.faithful_circuit(copy)


def test_a_transformer_lens_4_install_is_refused_with_the_reason(monkeypatch):
    from p0circuit.core import versions

    monkeypatch.setattr(versions, "version", lambda name: "4.3.0")
    with pytest.raises(p0.ConfigError, match=r"needs transformer-lens >=3.9,<4; 4.3.0 is installed.*hook_mlp_in"):
        versions.check_transformer_lens()
    monkeypatch.setattr(versions, "version", lambda name: "3.9.0")
    versions.check_transformer_lens()


def test_every_method_runs_on_a_setup_with_the_same_numbers(planted, screened):
    """Issue 51, item 1: the patching methods take ``setup=`` (checked once) and give the numbers of the loose call;
    a setup with anything it fixes beside it, or with the model and tokens too, is refused naming what to do."""
    from p0circuit.patching.methods.triage import triage_patch

    toks, _ = screened
    kw = dict(corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    setup = Setup.of(planted.model, toks, **kw)
    for method, more in ((p0.activation_patch, {}), (p0.path_patch, {}), (p0.attribution_patch, {}),
                         (triage_patch, {"top": 3, "sample": 2})):
        loose, held = method(planted.model, toks, **kw, **more), method(setup=setup, **more)
        assert held.raw == loose.raw and held.setup is setup, method.__name__
    assert p0.activation_patch(setup=setup, min_signal=0.5).raw == p0.activation_patch(setup=setup).raw
    for bad, said in ((dict(setup=setup, corruption="zero"), "the setup fixes corruption="),
                      (dict(setup=setup, bos=True), "the setup fixes bos="),
                      (dict(setup="shift"), "setup"), (dict(), "needs the model and the tokens")):
        with pytest.raises(p0.P0CircuitError, match=said):
            p0.activation_patch(**bad)
    with pytest.raises(p0.P0CircuitError, match="not both"):
        p0.activation_patch(planted.model, toks, setup=setup)


def test_a_setup_varies_what_a_study_varies(planted, screened):
    """``measuring`` (another metric on the same runs), ``corrupting`` (another corruption), ``rows`` (a sub-batch):
    each the setup ``Setup.of`` would make, checked where it must be."""
    toks, _ = screened
    setup = Setup.of(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    other = setup.measuring(p0.NormRatio(0))
    assert other.prep is setup.prep and other.metric.name == "norm_ratio@L0" and setup.metric.name == "norm_ratio@L1"
    fresh = Setup.of(planted.model, toks, corruption="shift", metric=p0.NormRatio(0), bos=False)
    assert p0.activation_patch(setup=other).raw == p0.activation_patch(setup=fresh).raw
    assert setup.corrupting("zero").prep.name == "zero" and setup.corrupting("zero").metric.name == setup.metric.name
    part = setup.rows(slice(0, 4))
    assert part.tokens.shape[0] == 4 and torch.equal(part.tokens, toks[:4])
    assert p0.activation_patch(setup=setup.rows([0, 2])).raw == p0.activation_patch(
        planted.model, toks[[0, 2]], corruption="shift", metric=p0.NormRatio(LAYER), bos=False).raw
    for call, said in ((lambda: setup.measuring(p0.NormRatio(99)), "99"),
                       (lambda: setup.measuring(None), "needs a metric"),
                       (lambda: setup.corrupting("nonesuch"), "nonesuch"),
                       (lambda: setup.rows(slice(5, 5)), "selects no prompt"),
                       (lambda: setup.rows(3), "slice or a list")):
        with pytest.raises(p0.P0CircuitError, match=said):
            call()


def test_a_method_given_a_setup_checks_the_model_is_still_as_it_was(planted):
    """Review of issue 51: ``setup=`` checked nothing, so a hook added, or a weight changed, after ``Setup.of`` gave a
    silently wrong number; now both are refused, as the loose call refuses them (and ``measuring`` never
    re-baselines a stale setup); a setup option the method does not take (``reference``) is refused too."""
    from p0circuit.patching.methods.triage import triage_patch

    model = p0.build_planted().model
    toks = p0.probe_tokens(model, 8, 16, seed=0, regular=True)
    setup = Setup.of(model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    model.blocks[1].hook_resid_pre.add_hook(lambda x, hook: x * 3)
    with pytest.raises(p0.BadInputError, match="hooks of its own"):
        p0.activation_patch(setup=setup)
    model.reset_hooks(including_permanent=True)
    with torch.no_grad():
        model.blocks[0].mlp.W_out.mul_(1.01)
    for call in (lambda: p0.activation_patch(setup=setup), lambda: p0.path_patch(setup=setup, min_signal=0.0),
                 lambda: setup.measuring(p0.NormRatio(0))):
        with pytest.raises(p0.BadInputError, match="weights changed since the setup was made"):
            call()
    fresh = Setup.of(model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False, reference=True)
    with pytest.raises(p0.P0CircuitError, match="does not take reference="):
        triage_patch(setup=fresh)
    with pytest.raises(p0.P0CircuitError, match=r"setup.measuring\(metric\)"):
        p0.activation_patch(setup=fresh, metric="norm_ratio:0")
    for index, said in (([99], "0..7"), ([True, False], "True"), ([1.9], "1.9"), (slice(None, None, -1), "step")):
        with pytest.raises(p0.BadInputError, match=re.escape(said)):
            fresh.rows(index)


def test_searches_of_one_result_share_their_evaluations_bit_for_bit(planted):
    """A second search of the same result (another target, or the same again) reruns no evaluation an earlier one ran
    on the same fixed base, and finds exactly what a search of a fresh result finds; the store goes with the result."""
    import gc
    from p0circuit.patching import circuit_search
    toks = p0.probe_tokens(planted.model, 12, 16, seed=3, regular=True)

    def make():
        return p0.activation_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    shared, alone = make(), make()
    first = p0.faithful_circuit(shared).search
    assert first.settings["reused"] == 0 and first.settings["evaluations"] > 3
    again = p0.faithful_circuit(shared).search
    assert again.settings["reused"] == again.settings["evaluations"]  # every evaluation (denoising too) reused
    for target, tolerance in ((0.8, 0.05), (0.95, 0.02)):
        other = p0.faithful_circuit(shared, target=target, tolerance=tolerance).search
        fresh = p0.faithful_circuit(alone, target=target, tolerance=tolerance).search
        assert 0 < other.settings["reused"] <= other.settings["evaluations"] == fresh.settings["evaluations"]
        for name in ("nodes", "faithfulness", "denoising", "completeness", "faithful", "why"):
            assert getattr(other, name) == getattr(fresh, name), name  # equal, not close
    key = id(shared)
    assert key in circuit_search._MEMOS
    del shared, first, again, other
    gc.collect()
    assert key not in circuit_search._MEMOS


def test_a_search_with_a_given_setup_refuses_a_model_changed_since_and_keeps_no_model_alive(planted):
    """A result read back without its setup is searched with ``setup=``: a weight edit since that setup was made is
    refused (a store of earlier evaluations would otherwise answer with the old model's numbers), and the store holds
    the setup weakly."""
    import gc
    import pickle
    import weakref
    from p0circuit.patching import circuit_search

    pm = p0.build_planted()  # its own copy: the weights are edited here
    toks = p0.probe_tokens(pm.model, 8, 16, seed=3, regular=True)
    kw = dict(corruption="shift", metric=p0.NormRatio(LAYER), bos=False)
    bare = pickle.loads(pickle.dumps(p0.activation_patch(pm.model, toks, **kw)))
    setup = Setup.of(pm.model, toks, **kw)
    first = p0.faithful_circuit(bare, setup=setup).search
    with torch.no_grad():
        pm.model.blocks[0].mlp.W_out.mul_(1.0005)
    with pytest.raises(p0.BadInputError, match="weights changed since the setup was made"):
        p0.faithful_circuit(bare, setup=setup)
    assert first.faithful
    held = weakref.ref(setup)
    del setup
    gc.collect()
    assert held() is None and id(bare) in circuit_search._MEMOS  # the store lives with the result, not the setup


def test_a_job_read_by_another_metric_shares_its_runs_and_gives_a_fresh_job_s_numbers(planted):
    """PatchJob.measuring: a second metric of the same block reads the cached clean and corrupted runs (no forward),
    and every number equals a fresh job's of that metric; a metric of another block runs its own; a bad metric is
    refused by name before any forward."""
    from p0circuit.patching.circuit_search import search_job
    from p0circuit.patching.job import PatchJob
    from p0circuit.patching.ops import node_op
    from p0circuit.patching.engine import run_groups
    from p0circuit.patching.work import Count
    from p0circuit.core.types import Node

    model = planted.model
    toks = p0.probe_tokens(model, 4, 12, seed=1, regular=True)
    setup = Setup.of(model, toks, corruption=p0.Shift(1), metric=p0.NormRatio(1), bos=False)
    job = search_job(setup).cache({"blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"})
    with Count(model) as counted:
        shared = job.measuring(p0.ResidDim(1, 3))
    assert counted.forwards(48) == 0 and shared.clean is job.clean and shared.corr is job.corr
    fresh = search_job(setup.measuring(p0.ResidDim(1, 3))).cache({"blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"})
    assert (shared.clean_metric, shared.base_metric) == (fresh.clean_metric, fresh.base_metric)
    node = Node.parse("M0@0")
    patched = [run_groups(j.base(), [[node_op(j, node, "noise", [0])]], j.rows_per_forward)[0] for j in (shared, fresh)]
    assert patched[0] == patched[1]
    other = job.measuring(p0.NormRatio(2))  # another block: its own runs, to block 2
    assert other.clean is not job.clean and isinstance(other, PatchJob)
    assert other.clean_metric == search_job(setup.measuring(p0.NormRatio(2))).cache(set()).clean_metric
    with pytest.raises(p0.BadInputError, match="metric"):
        job.measuring(None)
    for bad in (p0.NormRatio(99), "no_such_metric", p0.ResidDim(1, 10**6)):  # past the model, unknown, out of range
        with pytest.raises(p0.P0CircuitError):
            job.measuring(bad)


def test_a_setup_under_another_corruption_shares_its_clean_run(planted):
    """Inside sharing_clean, Setup.corrupting keeps the clean run's activations and gradients (the same model, weights,
    prompts and metric): an attribution under the second corruption runs no clean forward or backward of its own, and
    every number equals a fresh setup's; another metric, weights edited in between, or the block's end start nothing
    shared (a result made inside keeps no activations, and a model changed afterwards is never answered from before)."""
    from p0circuit.patching.circuit_search import search_job
    from p0circuit.patching.setup import sharing_clean
    from p0circuit.patching.work import Count

    model = planted.model
    toks = p0.probe_tokens(model, 4, 12, seed=2, regular=True)
    origin = Setup.of(model, toks, corruption=p0.Shift(1), metric=p0.NormRatio(1), bos=False)
    assert origin.clean is None and origin.corrupting(p0.Swap()).clean is None  # outside the block: nothing shared
    fresh_setup = Setup.of(model, toks, corruption=p0.Swap(), metric=p0.NormRatio(1), bos=False)
    with Count(model) as fresh:
        alone = p0.attribution_patch(setup=fresh_setup, min_signal=0)
    with sharing_clean(origin) as first:
        p0.attribution_patch(setup=first, min_signal=0)  # the clean run and its gradients, kept
        second = first.corrupting(p0.Swap())
        assert second.clean is first.clean and first.measuring(p0.NormRatio(2)).clean is None
        with Count(model) as shared:
            estimate = p0.attribution_patch(setup=second, min_signal=0)
        job, own = search_job(second).cache(set()), search_job(fresh_setup).cache(set())
        assert (job.clean_metric, job.base_metric) == (own.clean_metric, own.base_metric)
        w = model.blocks[0].mlp.W_out
        old = w.data[0, 0].item()
        try:
            w.data[0, 0] += 1.0  # an edit between two corruptions: the clean run is not shared
            assert first.corrupting(p0.Zero()).clean is None
        finally:
            w.data[0, 0] = old
    assert estimate.raw == alone.raw and estimate.clean_metric == alone.clean_metric
    assert shared.forwards(48) < fresh.forwards(48) and fresh.with_grad(48) > 0 == shared.with_grad(48)
    assert not first.clean.runs and not first.clean.grads and not first.clean.open  # closed: nothing held
    again = p0.attribution_patch(setup=second, min_signal=0)  # after the block: its own runs
    assert again.raw == alone.raw and not second.clean.runs
    for bad in (None, model, toks, "shift"):
        with pytest.raises(p0.BadInputError, match="sharing_clean takes a p0circuit.Setup"):
            with sharing_clean(bad):
                pass
