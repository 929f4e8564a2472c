"""The paper's experiments, each checked where the answer is known."""

import numpy as np
import pandas as pd
import pytest

import p0circuit as p0
from p0circuit import BadInputError
from p0circuit.studies import experiments as ex

from conftest import random_tokens


def content_tokens(n=32, length=32, seed=0):
    """Prompts without token 0 (the BOS of the tests) and with x1 != x0."""
    toks = random_tokens(n, length, 31, seed) + 1
    same = toks[:, 1] == toks[:, 0]
    toks[same, 1] = toks[same, 0] % 31 + 1
    return toks


@pytest.fixture(scope="module")
def bos_plant(planted_models):
    return planted_models("bos")


def test_bos_ablation_position_keyed_plant_keeps_its_sink(planted, tmp_path):
    result = ex.bos_ablation(planted.model, content_tokens(), bos_token_id=0)
    assert result.with_bos.norm_onset_layer == 1 and result.without_bos.norm_onset_layer == 1
    assert result.layer_shift == 0
    assert result.to_frame().loc[1, "norm_ratio_without_bos"] >= 10
    result.plot(tmp_path / "bos.png")
    assert (tmp_path / "bos.png").stat().st_size > 1000


def test_bos_ablation_bos_keyed_plant_loses_its_sink(bos_plant):
    result = ex.bos_ablation(bos_plant.model, content_tokens(), bos_token_id=0)
    assert result.with_bos.norm_onset_layer == 1
    assert result.without_bos.norm_onset_layer is None and result.layer_shift is None
    assert max(result.without_bos.norm_ratio_resid) < 1.5
    assert {n.name for n in bos_plant.truth.writers} == {"E@0", "M0@0", "M1@0"}


def test_bos_ablation_bad_input(planted):
    toks = content_tokens()
    toks[0, 0] = 0
    with pytest.raises(BadInputError, match="already start with BOS"):
        ex.bos_ablation(planted.model, toks, bos_token_id=0)
    with pytest.raises(BadInputError, match="pass bos_token_id"):
        ex.bos_ablation(planted.model, content_tokens())
    with pytest.raises(BadInputError, match="leave no room for BOS"):
        ex.bos_ablation(planted.model, content_tokens(length=64), bos_token_id=0)


def test_cone_closed_form_matches_monte_carlo():
    mc = ex.cone_monte_carlo(mu=1.0, sigma=2.0, d=32, n_pos=16, n=4000, seed=1)
    z = (mc.sq_norm - ex.cone_expected_sq_norm(1.0, 2.0, 16)) / mc.sq_norm_se
    assert np.abs(z).max() < 4.5  # within statistical error at every position
    assert np.all(np.diff(mc.cos_u) > 0) and mc.cos_u[-1] > 0.85  # the direction converges to u


def test_cone_fit_recovers_the_planted_parameters(planted, tmp_path):
    curve = ex.measure_attention_output(planted.model, random_tokens(512, 32, 32, seed=2), layer=0, head=0)
    fit = ex.fit_cone(curve)
    assert fit.mu == pytest.approx(planted.spec.mu, rel=0.05)
    assert fit.sigma == pytest.approx(planted.spec.sigma, rel=0.05)
    assert fit.r2 > 0.99
    fit.plot(tmp_path / "cone.png")
    assert (tmp_path / "cone.png").exists()


def test_cone_fit_needs_positions():
    with pytest.raises(BadInputError, match="at least 3 positions"):
        ex.fit_cone(ex.ConeCurve(np.ones(2), np.zeros(2), np.ones(2)))


def test_perturbations_on_the_plant(planted, tmp_path):
    res = ex.perturbations(planted.model, content_tokens(), replacement=5)
    frame = res.to_frame()
    for name in ("original", "random_first", "replace_first", "shift_by_one"):
        assert frame.loc[name, "norm_onset"] == 1 and frame.loc[name, "sink_position"] == 0
    # repeating the first token makes position 1 a copy of P0: the sink heads split their attention
    assert frame.loc["repeat_first", "max_alpha0_L2"] < 0.6
    assert frame.loc["original", "max_alpha0_L2"] > 0.99
    res.plot(tmp_path / "perturb.png")
    with pytest.raises(BadInputError, match="unknown perturbation"):
        ex.perturbations(planted.model, content_tokens(), names=["reverse"])


@pytest.mark.parametrize("variant", ["nope", "rope"])
def test_repeat_all_is_the_documented_edge_case(planted_models, variant):
    """One repeated token: no position can be told apart, so there is no sink (norm ratio 1)."""
    frame = ex.perturbations(planted_models(variant).model, content_tokens(8), names=["repeat_all"]).to_frame()
    for layer in range(4):
        assert frame.loc["repeat_all", f"norm_ratio_L{layer}"] == pytest.approx(1.0, abs=1e-4)
    assert pd.isna(frame.loc["repeat_all", "norm_onset"])


def test_stabilization_and_direction(planted, tmp_path):
    toks = content_tokens(16)
    frame = ex.stabilization(planted.model, toks, delta=1.0)
    # after amplification ||h_0|| >= 10 ||h_t||: the direction change at P0 is ~100x smaller
    assert (frame.loc[1:, "ratio_p0_to_rest"] < 1 / 50).all()
    assert frame.loc[0, "ratio_p0_to_rest"] > 0.3
    direction = ex.direction_by_layer(planted.model, toks)
    assert (direction.loc[1:, "cos_h0"] > 0.99).all()
    assert (direction.loc[1:, "cos_h_other"] < direction.loc[1:, "cos_h0"]).all()  # from the amplifier on
    ex.plot_stabilization(frame, tmp_path / "stab.png")
    ex.plot_direction(direction, tmp_path / "direction.png")
    assert (tmp_path / "direction.png").exists()
    with pytest.raises(BadInputError, match="at least 2 prompts"):
        ex.direction_by_layer(planted.model, toks[:1])


def test_survey(tmp_path):
    frame = ex.survey(ex.default_models(), n_prompts=8, seq_len=24)
    assert frame.loc["planted learned", "identified_by"] == "position embedding"
    assert frame.loc["planted nope", "identified_by"] == "causal mask (layer-0 attention)"
    assert frame.loc["planted rope", "norm_onset"] == 1
    # at initialization the causal asymmetry already exists without positions (docs/science.md: 1.15-1.25)
    assert frame.loc["nope", "attn_signal"] > 1.05 and pd.isna(frame.loc["nope", "norm_onset"])
    assert 1.0 < frame.loc["nope", "norm_ratio_L0"] < 2.0
    assert set(frame.loc[["rope", "nope", "learned"], "positions"]) == {"rope", "nope", "learned"}
    ex.plot_survey(frame, tmp_path / "survey.png")
    assert (tmp_path / "survey.png").stat().st_size > 1000


def test_bos_ablation_on_a_local_checkpoint(tmp_path):
    from family_configs import make_checkpoint

    model = p0.load_checkpoint(make_checkpoint("llama", tmp_path, with_tokenizer=True))
    tokens = p0.to_tokens(model, ["w5 w6 w7 w8 w9 w10", "w11 w12 w13 w14 w15 w16"], prepend_bos=False)
    result = ex.bos_ablation(model, tokens)  # the tokenizer's BOS (id 0)
    assert result.with_bos.seq_len == 7 and result.without_bos.seq_len == 6
    assert list(result.to_frame().index) == list(range(model.cfg.n_layers))


def test_repeated_token_spread():
    nope = p0.ModelSpec(pos="nope", n_layers=3).build()
    assert (ex.repeated_token_spread(nope, token=3).relative_spread < 1e-5).all()
    rope = p0.ModelSpec(pos="rope", n_layers=3).build()
    assert (ex.repeated_token_spread(rope, token=3).relative_spread < 1e-5).all()
    learned = p0.ModelSpec(pos="learned", n_layers=3).build()
    with pytest.raises(BadInputError, match="learned position embeddings, so P0 is identifiable"):
        ex.repeated_token_spread(learned)
