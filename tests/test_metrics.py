"""Each metric against a hand-computed value on a tiny input."""

import math

import pytest
import torch

from p0circuit import BadInputError, MissingHookError, ModelSpec, NonFiniteError, sink_report
from p0circuit.core import hooks
from p0circuit.measures import (
    argmax_sink_position,
    attention_to_position,
    direction_stability,
    first_layer_at_least,
    massive_activations,
    norm_ratio,
    report_from_cache,
    sink_rate,
    sink_rate_per_layer,
)


def _patterns():
    # one layer, one sequence, two heads, T = 3 (rows: queries, columns: keys)
    h0 = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0.6, 0.2, 0.2]])
    h1 = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.1, 0.1, 0.8]])
    return torch.stack([h0, h1])[None, None]  # (L=1, B=1, H=2, T, T)


def test_alpha_by_hand():
    alpha = attention_to_position(_patterns(), 0)
    assert alpha.shape == (1, 1, 2)
    assert alpha[0, 0].tolist() == pytest.approx([(1 + 0.9 + 0.6) / 3, (1 + 0.5 + 0.1) / 3])
    alpha1 = attention_to_position(_patterns(), 1)  # queries 1, 2 see key 1
    assert alpha1[0, 0].tolist() == pytest.approx([(0.1 + 0.2) / 2, (0.5 + 0.1) / 2])


def test_sink_rate_by_hand():
    alpha = attention_to_position(_patterns(), 0)  # 0.833, 0.533
    assert float(sink_rate(alpha, 0.3)) == pytest.approx(1.0)
    assert float(sink_rate(alpha, 0.6)) == pytest.approx(0.5)
    two = torch.tensor([[[0.9, 0.1]], [[0.1, 0.1]]])  # (B=2, L=1, H=2): shares 0.5 and 0
    assert float(sink_rate(two, 0.3)) == pytest.approx(0.25)
    assert sink_rate_per_layer(two, 0.3).tolist() == pytest.approx([0.25])
    with pytest.raises(BadInputError, match="eps=1.5 must be in"):
        sink_rate(two, 1.5)


def test_alpha_rejects_bad_position():
    with pytest.raises(BadInputError, match="outside 0..2"):
        attention_to_position(_patterns(), 3)


def test_norm_ratio_by_hand():
    h = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]])  # norms 5, 1, 2
    assert norm_ratio(h).tolist() == pytest.approx([5 / 1.5])
    assert norm_ratio(h, pos=2).tolist() == pytest.approx([2 / 3])
    zero_rest = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    assert math.isnan(norm_ratio(zero_rest).item())
    with pytest.raises(BadInputError, match="no positions t > 0"):
        norm_ratio(torch.ones(1, 1, 2))


def test_direction_stability_by_hand():
    h0 = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    # cosines: (0,1) = 1/sqrt2, (0,2) = 0, (1,2) = 1/sqrt2
    assert float(direction_stability(h0)) == pytest.approx((2 / math.sqrt(2)) / 3)
    with pytest.raises(BadInputError, match="at least 2 prompts"):
        direction_stability(h0[:1])


def test_massive_activations_by_hand():
    h = torch.zeros(2, 3, 4)
    h[:, 1:] = 1.0  # rms 1 at t > 0
    h[:, 0, 2] = 150.0
    h[:, 0, 1] = 50.0
    assert massive_activations(h, ratio=100) == [(2, 150.0, 150.0)]
    assert [d for d, _, _ in massive_activations(h, ratio=40)] == [2, 1]


def test_first_layer_and_argmax():
    assert first_layer_at_least(torch.tensor([1.0, float("nan"), 12.0, 20.0]), 10) == 2
    assert first_layer_at_least(torch.tensor([1.0, 2.0]), 10) is None
    pos, scores = argmax_sink_position(_patterns(), max_pos=2)
    assert pos == 0 and scores.tolist() == pytest.approx([(2.5 / 3 + 1.6 / 3) / 2, 0.45 / 2])


@pytest.fixture(scope="module")
def small():
    return ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=40, n_ctx=16).build()


def test_report_matches_direct_computation(small):
    tokens = torch.randint(0, 40, (4, 10), generator=torch.Generator().manual_seed(0))
    rep = sink_report(small, tokens)
    _, cache = small.run_with_cache(tokens)
    h = cache[hooks.resid_post(1)]
    assert rep.norm_ratio_resid[1] == pytest.approx(float(norm_ratio(h).mean()), rel=1e-5)
    a = cache[hooks.pattern(0)][:, 1, :, 0].mean(-1).mean()  # layer 0, head 1, alpha_0
    assert rep.alpha[0][1] == pytest.approx(float(a), rel=1e-5)
    frame = rep.to_frame()
    assert list(frame.index) == [0, 1] and "norm_ratio_resid" in frame
    assert "Sink_0^0.3" in str(rep) and rep.to_dict()["n_prompts"] == 4


def test_report_single_prompt_has_no_stability(small):
    rep = sink_report(small, torch.randint(0, 40, (1, 5)))
    assert rep.direction_stability is None and "n/a" in str(rep)


@pytest.mark.parametrize(
    "tokens,msg",
    [
        (torch.zeros(3, 1, dtype=torch.long), "sequence length 1"),
        (torch.zeros(0, 5, dtype=torch.long), "empty batch"),
        (torch.tensor([[1, 99]]), "out of the vocabulary"),
    ],
)
def test_report_bad_tokens(small, tokens, msg):
    with pytest.raises(BadInputError, match=msg):
        sink_report(small, tokens)


def test_report_needs_hooks(small):
    _, cache = small.run_with_cache(torch.randint(0, 40, (2, 5)), names_filter=lambda n: "resid" in n)
    with pytest.raises(MissingHookError, match="the cache lacks .* hook"):
        report_from_cache(cache, 2)
    with pytest.raises(BadInputError, match="needs a transformer_lens HookedTransformer"):
        sink_report(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long))  # type: ignore[arg-type]


def test_report_names_first_nonfinite_layer():
    model = ModelSpec(n_layers=3, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=40, n_ctx=16).build()
    with torch.no_grad():
        model.blocks[1].mlp.W_in[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"weight blocks\.1\.mlp\.W_in holds NaN or inf"):
        sink_report(model, torch.randint(0, 40, (2, 6)))
    with torch.no_grad():  # finite weights whose activations overflow: the first hook that does is named
        model.blocks[1].mlp.W_in.fill_(1e30)
        model.blocks[1].mlp.W_out.fill_(1e30)
    with pytest.raises(NonFiniteError, match=r"NaN or inf first appears at 'blocks.1.hook_mlp_out'"):
        sink_report(model, torch.randint(0, 40, (2, 6)))


def test_weight_check_sums_first_and_tests_elements_only_where_a_sum_is_not_finite():
    from p0circuit.models.checks import check_finite_weights

    model = ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=40, n_ctx=16).build()
    with torch.no_grad():
        model.blocks[0].mlp.W_out.fill_(3e38)  # finite, but its sum overflows float32
    check_finite_weights(model)
    model.blocks[1].attn.W_V.data[0, 0, 0] = float("inf")  # written through .data: no version bump to rely on
    with pytest.raises(NonFiniteError, match=r"weight blocks\.1\.attn\.W_V holds NaN or inf"):
        check_finite_weights(model)


def test_sink_report_lists_every_norm_onset_and_erasure():
    from p0circuit.measures.sink_report import SinkReport

    ratios = [1.0, 1.2, 9.7, 8.0, 6.0, 1.1, 0.9, 151.0, 140.0]
    rep = SinkReport(n_prompts=2, seq_len=8, eps=0.3, norm_threshold=5.0, alpha=[[0.0]] * 9, sink_rate=0.0,
                     sink_rate_per_layer=[0.0] * 9, norm_ratio_resid=ratios, norm_ratio_resid_min=ratios,
                     norm_ratio_attn=ratios, norm_ratio_mlp=ratios, direction_stability=None, massive=[],
                     norm_onset_layer=2, head_onset_layer=None, sink_position=0)
    assert rep.norm_stages == [("onset", 2, 9.7), ("erasure", 5, 1.1), ("onset", 7, 151.0)]
    assert rep.norm_onsets == [2, 7]
    assert "onset at layer 2 (9.7x), erasure at layer 5 (1.1x), onset at layer 7 (151x)" in str(rep)


def test_every_metric_entry_has_one_route():
    """Each built-in entry's name lives in core/entries (no torch) and its build in patching/metrics, once;
    a plugin's entry carries its own build: no entry is built by a path of its own."""
    from p0circuit.core.entries import METRICS
    from p0circuit.patching.metrics import BUILT_IN

    assert {n for n, e in METRICS.items() if e.build is None} == set(BUILT_IN)
