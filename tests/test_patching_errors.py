"""Bad input to the patching engine gets a clear error that says what to do."""

import inspect

import pytest
import torch

import p0circuit as p0
from p0circuit import BadInputError, ConfigError, MissingHookError
from p0circuit.patching import Resample, Shift

from conftest import random_tokens


@pytest.fixture(scope="module")
def toks():
    return random_tokens(3, 10, 32, seed=2)


def test_unalignable_shapes(planted, toks):
    with pytest.raises(BadInputError, match=r"cannot be aligned position by position.*use shift"):
        p0.activation_patch(planted.model, toks, corruption=Resample(tokens=toks[:, :5]))


def test_shift_beyond_context(planted):
    long = random_tokens(2, 64, 32, seed=0)
    with pytest.raises(BadInputError, match="use prompts of at most 62 tokens"):
        p0.activation_patch(planted.model, long, corruption=Shift(2))


@pytest.mark.parametrize(
    "nodes,err,msg",
    [
        (["A0.X@0"], BadInputError, "unknown node name 'A0.X@0'"),
        (["A9.H0@0"], BadInputError, "names layer 9, but the model has layers 0..3"),
        (["A0.H5@0"], BadInputError, "names head 5"),
        (["M0@40"], BadInputError, "names position 40, but prompts have length 10"),
        (["PE@0"], MissingHookError, "no additive position embedding"),
        ([], BadInputError, "no candidate nodes given"),
        (["M0@0", "M0@0"], BadInputError, "duplicate nodes"),
    ],
)
def test_bad_nodes(planted, toks, nodes, err, msg):
    with pytest.raises(err, match=msg):
        p0.activation_patch(planted.model, toks, nodes=nodes, corruption="shift", metric=p0.NormRatio(1))


def test_non_scalar_metric(planted, toks):
    metric = p0.LogitMetric(lambda logits: logits[:, -1, 0], label="per_prompt")
    with pytest.raises(BadInputError, match="'per_prompt' returned a tensor of shape \\(3,\\).*must return one number"):
        p0.activation_patch(planted.model, toks, nodes=["M0@0"], corruption="shift", metric=metric)


def test_metric_hook_missing(planted, toks):
    metric = p0.CacheMetric(lambda a, p: a["x"].mean(), [(0, "blocks.0.hook_nonexistent")], label="bad")
    with pytest.raises(MissingHookError, match="no hook 'blocks.0.hook_nonexistent' that metric 'bad' reads"):
        p0.activation_patch(planted.model, toks, nodes=["M0@0"], corruption="shift", metric=metric)


@pytest.mark.parametrize(
    "metric,msg",
    [
        (p0.NormRatio(7), "NormRatio: layer 7 is outside 0..3"),
        (p0.AttnToP0(), "AttnToP0 needs heads="),
        (p0.AttnToP0(heads=[(2, 9)]), "head 9 is outside 0..1"),
        (42, "metric=42 \\(int\\) is not str or PatchMetric or None; pass a metric such as"),
    ],
)
def test_bad_metrics(planted, toks, metric, msg):
    with pytest.raises(BadInputError, match=msg):
        p0.activation_patch(planted.model, toks, nodes=["M0@0"], corruption="shift", metric=metric)


def test_a_metric_name_that_is_not_one(planted, toks):
    with pytest.raises(ConfigError, match="metric 'attention' not valid.*; use one of"):
        p0.activation_patch(planted.model, toks, nodes=["M0@0"], corruption="shift", metric="attention")


def test_bad_options(planted, toks):
    with pytest.raises(ConfigError, match=r"unknown corruption 'shuffle'; choose one of \['copies', 'pos_mean', 'resample', 'shift', 'swap', 'zero'\]"):
        p0.activation_patch(planted.model, toks, corruption="shuffle")
    with pytest.raises(ConfigError, match="unknown method 'acdc'; choose one of"):
        p0.discover(planted.model, toks, method="acdc")
    with pytest.raises(ConfigError, match="direction='denoise' needs a corrupted run"):
        p0.activation_patch(planted.model, toks, corruption="pos_mean", direction="denoise")
    with pytest.raises(BadInputError, match="activation_patch: direction='sideways' .* is not 'noise' or 'denoise'"):
        p0.activation_patch(planted.model, toks, direction="sideways")
    with pytest.raises(ConfigError, match="Shift.k=0 must be >= 1"):
        p0.activation_patch(planted.model, toks, corruption=Shift(0))


def test_one_options_object(planted, toks):
    """The shared options are one PatchOptions: keywords override it, each method takes exactly the
    options it uses, and a method or options object that does not fit is refused before any work."""
    from p0circuit.core.errors import BadCallError
    from p0circuit.patching.options import FIELDS

    nodes = ["A0.H0@0", "M1@0"]
    options = p0.PatchOptions(corruption="shift", metric="norm_ratio:1", min_signal=0)
    by_object = p0.activation_patch(planted.model, toks, nodes=nodes, options=options)
    by_keywords = p0.activation_patch(planted.model, toks, nodes=nodes, corruption="shift", metric="norm_ratio:1",
                                      min_signal=0)
    assert by_object.raw == by_keywords.raw
    overridden = p0.activation_patch(planted.model, toks, nodes=nodes, options=options, direction="denoise")
    assert overridden.direction == "denoise" and overridden.raw != by_object.raw
    assert options.direction == "noise"  # the object is not changed by an override
    for method in (p0.activation_patch, p0.path_patch, p0.discover):
        assert set(FIELDS) <= set(inspect.signature(method).parameters), method  # help() shows every option
    assert "reference" not in inspect.signature(p0.attribution_patch).parameters
    with pytest.raises(BadCallError, match="attribution_patch does not take reference="):
        p0.attribution_patch(planted.model, toks, options=options.but(reference=True))
    with pytest.raises(BadCallError, match="unexpected keyword argument 'reference'"):
        p0.attribution_patch(planted.model, toks, reference=True)
    with pytest.raises(ConfigError, match="method 'attribution' does not take reference="):
        p0.discover(planted.model, toks, method="attribution", reference=True)
    with pytest.raises(BadInputError, match=r"options=.* is not PatchOptions or None; pass p0circuit.PatchOptions\(...\)"):
        p0.activation_patch(planted.model, toks, options={"corruption": "shift"})
    with pytest.raises(ConfigError, match=r"PatchOptions.min_signal=-1 must be >= 0"):
        p0.PatchOptions(min_signal=-1)
    with pytest.raises(BadInputError, match=r"activation_patch: rows_per_forward=0 must be in \[1, "):
        p0.activation_patch(planted.model, toks, rows_per_forward=0)
    with pytest.raises(ConfigError, match="must take the shared options; decorate it with @p0circuit.takes_options"):
        p0.patching.register(p0.Method("bare", lambda model, tokens, *, corruption="shift": None, "node"))
    assert "bare" not in p0.METHODS


def test_bad_edges(planted, toks):
    with pytest.raises(BadInputError, match="have no direct path"):
        p0.path_patch(planted.model, toks, edges=["M2@0->M1@0.mlp_in"], corruption="shift", metric=p0.NormRatio(1))
    with pytest.raises(BadInputError, match="have no direct path"):
        p0.path_patch(planted.model, toks, edges=["M0@0->A1.H0@rest.k"], corruption="shift", metric=p0.NormRatio(1))
    with pytest.raises(BadInputError, match="unknown edge name"):
        p0.path_patch(planted.model, toks, edges=["M0@0=>M1@0"], corruption="shift", metric=p0.NormRatio(1))


def test_bad_model_and_tokens(planted):
    with pytest.raises(BadInputError, match=r"model=Linear\(.*is not HookedTransformer; build one with p0circuit.ModelSpec"):
        p0.activation_patch(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(BadInputError, match="sequence length 1"):
        p0.activation_patch(planted.model, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(BadInputError, match="out of the vocabulary"):
        p0.activation_patch(planted.model, torch.full((2, 5), 40))


def test_mismatched_clean_and_corrupted_batches(planted, toks):
    other = random_tokens(5, 10, 32, seed=1)
    with pytest.raises(BadInputError, match=r"clean tokens \(3, 10\) and corrupted tokens \(5, 10\) cannot be aligned"):
        p0.activation_patch(planted.model, toks, corruption=Resample(tokens=other))


def test_a_corruption_that_leaves_the_metric_unchanged_gives_no_number(planted, toks):
    """Resampling with the clean prompts themselves: no signal, NaN effects, and a message that says why."""
    result = p0.activation_patch(planted.model, toks, corruption=Resample(tokens=toks.clone()))
    assert not result.signal
    assert all(v != v for v in result.normalized.values())  # NaN, never a normalized 0/0
    assert "this corruption does not change the metric" in result.message
    circuit = p0.discover(planted.model, toks, corruption=Resample(tokens=toks.clone()))
    assert circuit.nodes == () and circuit.settings["interpretation"].startswith("no signal")
