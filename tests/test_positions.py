"""Sinks wherever they sit: position classes, per-prompt positions, the ``swap`` corruption and
the advice of a run with no signal."""

import pytest
import torch

import p0circuit as p0
from p0circuit.measures.positions import classify, delimiter, find_positions, sink_positions
from p0circuit.patching.corruptions import CORRUPTIONS, Swap, advice
from p0circuit.patching.metrics import RunView
from p0circuit.core import hooks
from conftest import random_tokens


def test_delimiters_and_classes():
    assert delimiter(" ,") == "," and delimiter("\n\n") == "\n" and delimiter(" the") is None and delimiter("") is None
    text = {1: " ,", 2: "a", 3: "\n", 9: "<bos>"}.get
    classes = classify(torch.tensor([[9, 2, 1, 2, 1, 3], [2, 1, 9, 3, 3, 2]]), text, bos=9)
    assert classes[0] == ["P0 (BOS)", "other", "first ','", "other", "later ','", "first '\\n'"]
    assert classes[1] == ["P0", "first ','", "BOS", "first '\\n'", "later '\\n'", "other"]


def test_sink_positions_finds_a_planted_high_norm_position():
    resid = torch.ones(2, 4, 6, 8)  # (L, B, T, d)
    resid[1, :, 3] *= 20  # layer 1: position 3 of every prompt is a high-norm state
    patterns = torch.tril(torch.ones(6, 6)) / torch.arange(1, 7)[:, None]
    patterns = patterns.expand(2, 4, 2, 6, 6)
    classes = [["P0", "other", "other", "first ','", "other", "other"]] * 4
    texts = [["a", "b", "c", ",", "d", "e"]] * 4
    found = sink_positions(resid, patterns, classes, threshold=5.0, texts=texts)
    assert [(s.layer, s.where, s.share, s.positions) for s in found] == [(1, "first ','", 1.0, (3,))]
    assert found[0].ratio == pytest.approx(20.0) and found[0].tokens == ((",", 4),)


def test_find_positions(planted):
    toks = torch.tensor([[5, 1, 7, 1], [5, 7, 1, 2]])
    model = planted.model
    assert find_positions(model, toks, 2) == (2, 2) and find_positions(model, toks, "p0") == (0, 0)
    with pytest.raises(p0.BadInputError, match="2 of 2 prompts .* have no .first:,."):  # no tokenizer: no text
        find_positions(model, toks, "first:,")
    with pytest.raises(p0.BadInputError, match="not understood"):
        find_positions(model, toks, "second:,")
    with pytest.raises(p0.BadInputError, match="BOS id"):
        find_positions(model, toks, "bos")
    assert find_positions(model, toks, "bos", bos=7) == (2, 1)


def test_norm_ratio_per_prompt_positions():
    h = torch.randn(3, 7, 4)
    view = RunView({hooks.resid_post(0): h}, None, 1)  # a run shifted by one: positions count from its P0
    norms = h.norm(dim=-1)[:, 1:]
    want = torch.stack([norms[b, k] / torch.cat([norms[b, :k], norms[b, k + 1:]]).mean() for b, k in
                        enumerate((0, 2, 5))]).mean()
    metric = p0.NormRatio(0, pos=(0, 2, 5), where="first:,")
    assert float(metric(view)) == pytest.approx(float(want)) and metric.name == "norm_ratio@L0@first:,"
    with pytest.raises(p0.BadInputError, match="3 positions .* 2 prompts"):
        metric(RunView({hooks.resid_post(0): h[:2]}, None, 0))
    with pytest.raises(p0.ConfigError):
        p0.NormRatio(0, pos=(0, -1))


def test_swap_changes_the_token_and_keeps_the_position(planted):
    model = planted.model
    toks = random_tokens(64, 6, model.cfg.d_vocab, seed=0)
    prep = Swap().prepare(model, toks)
    assert prep.offset == 0 and prep.corrupt_tokens.shape == toks.shape
    assert bool((prep.corrupt_tokens[:, 0] != toks[:, 0]).all())
    assert torch.equal(prep.corrupt_tokens[:, 1:], toks[:, 1:])
    assert torch.equal(Swap(seed=1).prepare(model, toks).corrupt_tokens, Swap(seed=1).prepare(model, toks).corrupt_tokens)
    explicit = Swap(position=3, token=2).prepare(model, toks).corrupt_tokens
    assert explicit[:, 3].tolist() == [2] * 64
    assert "swap" in CORRUPTIONS
    with pytest.raises(p0.ConfigError, match="already at position 0 in every prompt"):
        Swap(token=4).prepare(model, torch.full((2, 5), 4))
    with pytest.raises(p0.BadInputError, match="longer than 6 tokens"):
        Swap(position=6).prepare(model, toks)
    with pytest.raises(p0.ConfigError):
        Swap(token=10 ** 6).prepare(model, toks)


@pytest.mark.parametrize("used", sorted(CORRUPTIONS))
@pytest.mark.parametrize("bos", [False, True])
def test_no_signal_advice_never_recommends_the_corruption_used(used, bos):
    text = advice(used, bos)
    recommended = text.split("try ", 1)[1]
    assert f"'{used}'" not in recommended and recommended.count("'") >= 4
    first_choice = "swap" if bos else "shift"
    assert (f"'{first_choice}'" in recommended) == (used != first_choice)


def test_no_signal_on_a_bos_run_recommends_swap(planted_models):
    pm = planted_models("bos")
    toks = p0.probe_tokens(pm.model, 8, 12, regular=True)
    toks = torch.cat([torch.zeros(8, 1, dtype=toks.dtype), toks], 1)  # the plant's BOS id is 0
    res = p0.activation_patch(pm.model, toks, corruption="shift", metric=p0.NormRatio(1), bos=True)
    assert not res.signal and "try 'swap'" in res.message and "try 'shift'" not in res.message
    swapped = p0.activation_patch(pm.model, toks, nodes=p0.candidate_nodes(pm.model, embed=True), corruption="swap",
                                  metric=p0.NormRatio(1), bos=True)
    assert set(swapped.kept(0.5)) == {n.name for n in pm.truth.writers}
