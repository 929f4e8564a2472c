"""Integrated gradients (``attribution_patch(steps=...)``), the screen of the analysis' neuron pass.

Checked against plain TransformerLens hooks (``tests/oracle.py``): the estimates of one MLP's neurons add
up, as integrated gradients must (completeness), to the exact change when all of them are patched at
once; a single gradient (``steps=1``) does not on a metric that saturates.
"""

import pytest
import torch

import p0circuit as p0
import oracle as O
from conftest import random_tokens


@pytest.fixture(scope="module")
def setup(planted):
    toks = p0.regular_prompts(random_tokens(8, 12, planted.model.cfg.d_vocab, seed=3))
    layer, _ = planted.neurons["amplifier"]
    neurons = [n.name for n in p0.candidate_neurons(planted.model, [layer])]
    return planted.model, toks, layer, neurons


def test_integrated_gradients_add_up_to_the_joint_patch(setup):
    model, toks, layer, neurons = setup
    kw = dict(nodes=neurons, corruption=p0.Shift(filler=(O.FILLER,)), metric=p0.NormRatio(layer),
              min_signal=0)
    together = O.together(model, toks, neurons, O.Corr("shift"), O.Metric("norm_ratio", layer=layer))
    sums = {}
    for steps in (1, 64):
        est = p0.attribution_patch(model, toks, steps=steps, **kw)
        sums[steps] = sum(v - est.clean_metric for v in est.raw.values())
        clean = est.clean_metric
    exact = together - clean
    assert abs(exact) > 1.0  # the patch changes the metric a lot
    assert sums[64] == pytest.approx(exact, rel=0.02)
    assert abs(sums[1] - exact) > 0.05 * abs(exact)  # one gradient misses the saturation


def test_steps_are_checked(setup):
    model, toks, layer, neurons = setup
    with pytest.raises(p0.BadInputError, match="steps must be an integer >= 1"):
        p0.attribution_patch(model, toks, nodes=neurons[:2], steps=0, metric=p0.NormRatio(layer))
    with pytest.raises(p0.BadInputError, match="integrated gradients .* are for nodes"):
        p0.attribution_patch(model, toks, nodes=["M0@0"], level="edge", steps=4, metric=p0.NormRatio(layer))
