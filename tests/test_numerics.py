"""Numerical care at P0: norms in float32 whatever the input dtype, and the attribution check that
flags where the linearization (or the precision) breaks near the huge P0 norm."""

import copy

import torch

import p0circuit as p0
from p0circuit.measures import massive_activations, norm_ratio

from conftest import random_tokens


def test_norms_are_computed_in_float32_for_half_inputs():
    """A P0 row of 1000s: its squares overflow float16 (max 65504); the metrics must not."""
    h = torch.ones(2, 5, 64)
    h[:, 0] = 1000.0
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.allclose(norm_ratio(h.to(dtype)), norm_ratio(h), rtol=1e-3)
        assert massive_activations(h.to(dtype), ratio=100) == massive_activations(h, ratio=100) != []


def test_attribution_check_on_the_planted_model(planted):
    toks = p0.regular_prompts(random_tokens(8, 16, 32, seed=3))
    check = p0.check_attribution(planted.model, toks, corruption="shift", metric=p0.NormRatio(1))
    assert check.p0_scale_ratio > 10  # the plant's P0 norm is >= 10x the others (PlantSpec.norm_ratio)
    assert check.precision == {}  # float32 attribution equals float64 within 1e-3
    diff = max(abs(check.approx.normalized[n] - check.precise.normalized[n]) for n in check.exact.normalized)
    assert diff < 1e-4
    truth = {n.name for n in planted.truth.writers}
    # the threshold components of the circuit are mis-estimated; nothing outside the circuit is
    assert {"A0.H0@0", "M0@0"} <= set(check.linearization) <= truth
    assert not check.ok and "linearization" in check.summary()
    table = check.table()
    assert table.loc["A0.H0@0", "linearization_flag"] and abs(table.loc["A0.H0@0", "exact"] - 1) < 0.05


def test_attribution_check_flags_low_precision(planted):
    """The same model in bfloat16: the float64 comparison flags the circuit's P0 nodes."""
    half = copy.deepcopy(planted.model).to(torch.bfloat16, print_details=False)
    toks = p0.regular_prompts(random_tokens(8, 16, 32, seed=3))
    check = p0.check_attribution(half, toks, corruption="shift", metric=p0.NormRatio(1), nodes=["A0.H0@0", "M0@0", "M1@0", "A2.H0@0"])
    assert set(check.precision) and set(check.precision) <= {"A0.H0@0", "M0@0", "M1@0"}
    assert "bfloat16 - float64" in check.summary()
    assert half.cfg.dtype == torch.bfloat16  # the caller's model is left as it was


def test_attribution_check_on_edges(planted):
    """Edge level: EAP against path patching on the planted edges, without the float64 copy."""
    toks = p0.regular_prompts(random_tokens(8, 16, 32, seed=3))
    edges = [e.name for e in planted.truth.edges]
    check = p0.check_attribution(planted.model, toks, corruption="shift", metric=p0.NormRatio(1), level="edge", edges=edges,
                                 precision=False)
    assert check.precise is None and check.precision == {}
    assert set(check.exact.normalized) == set(edges) and set(check.linearization) <= set(edges)
    assert "precision" not in check.summary()
