"""What makes position 0 a sink, beyond its norm (issue 47): each study on the plants, whose answers follow from their
weights, and every number against plain hooks (``tests/sink_oracle.py``, no p0circuit code) and, for the edits of
the P0 state, against transformers' own modules.

* What the sink reads: the plants' sink heads read the *normalized* state (RMSNorm before them), so scaled to an
  ordinary norm with its direction kept it keeps all their attention, and an ordinary direction with its norm kept
  keeps none: "the direction". The ``norm`` plant writes a large vector at every position after the amplifier,
  which turns a small P0 state away from the sink direction: there the heads need the norm too: "both".
* Detection: the cone-model plant's detector reads the undiluted identification head, so self-only attention from
  its block on makes every position P0-like; the learned-position and BOS-keyed plants detect P0 otherwise, and
  self-only attention changes nothing.
* Super weights: the amplifier writes the sink through one weight, the largest of its matrix; zeroed, the norm and
  the sink go, and the model is the same after the call.
* Every first token: the position-keyed plant makes every first token a sink; the BOS-keyed one only its BOS token.
"""

import re

import pytest
import torch

import p0circuit as p0
import sink_oracle as S
from p0circuit.studies.experiments.reads import EDITS, reads_of, uniform_alpha0
from tolerance import close

ONSET = 1  # the default plants' onset: the amplifier's block


def prompts(pm, n=8, length=16, seed=0, bos=False):
    return p0.probe_tokens(pm.model, n, length, seed=seed, regular=True, bos=bos)


def test_the_plants_sink_heads_read_the_direction(planted):
    r = p0.sink_reads(planted.model, prompts(planted), ONSET, bos=False, dims=[planted.layout.one("sink")])
    assert r.reads == r.reads_later == "the direction" and r.control
    assert r.sink_heads == ["A2.H0"] and r.later_heads == len(planted.sink_heads) - 1  # the first reader; later: block 3 (block 2, scale-blind, left out)
    assert r.edits["direction_replaced"].kept < 0.05  # the finding: an ordinary direction loses the sink
    assert r.edits["state_replaced"].kept < 0.05 and r.edits["random_direction"].kept < 0.2
    # the window is the block right after the onset, which reads h_0 through its pre-norm: blind to the scale, so
    # rescaled keeps the attention by arithmetic (a check of the edit, not a finding), and the record says so
    assert r.scale_blind and "keeps their attention by arithmetic" in r.evidence
    assert abs(r.edits["rescaled"].kept - 1) < 1e-4


def test_a_window_after_a_block_in_between_is_not_scale_blind(planted_models):
    """The norm plant's first reader is two blocks after the onset: there the norm can act, and it does."""
    pm = planted_models("norm")
    r = p0.sink_reads(pm.model, prompts(pm), ONSET, bos=False)
    assert not r.scale_blind and r.edits["rescaled"].kept < 0.5


def test_the_norm_plant_needs_the_norm_too(planted_models):
    pm = planted_models("norm")
    r = p0.sink_reads(pm.model, prompts(pm), ONSET, bos=False)
    assert r.reads == r.reads_later == "both" and r.control and not r.scale_blind
    assert r.edits["rescaled"].kept < 0.5 and r.edits["direction_replaced"].kept < 0.05
    assert r.window == [3] and r.sink_heads == ["A3.H0"]  # the first reader: no sink head in the writing block


@pytest.mark.parametrize("rescaled,replaced,answer", [(1.0, 0.0, "the direction"), (0.0, 1.0, "the norm"),
                                                      (0.1, 0.1, "both"), (0.9, 0.9, "neither alone"),
                                                      (0.5, 0.49, "the direction")])
def test_the_reads_rule(rescaled, replaced, answer):
    assert reads_of(rescaled, replaced, 0.5) == answer


@pytest.mark.parametrize("variant", ["rope", "norm"])
def test_the_edits_equal_plain_hooks(planted_models, variant):
    pm = planted_models(variant)
    toks = prompts(pm, seed=3)
    dims = [pm.layout.one("sink")]
    r = p0.sink_reads(pm.model, toks, ONSET, bos=False, dims=dims)
    for name in ("rescaled", "massive_removed", "direction_replaced", "state_replaced"):
        logits, alpha = S.tl_edited(pm.model, toks, ONSET, lambda h, n=name: S.edit_of(n, h, dims))
        per_block = alpha.mean((0, 2)).tolist()
        assert all(close(a, b, 1.0) for a, b in zip(r.edits[name].per_block, per_block)), name
        assert close(r.edits[name].loss, float(S.loss(logits, toks).mean()), 1.0), name
    assert close(r.uniform, sum(1 / (t + 1) for t in range(toks.shape[1])) / toks.shape[1], 1.0)


def test_the_edits_equal_transformers_own_modules(tmp_path):
    """A tiny Llama built by transformers: its decoder layer's output edited at position 0 by a plain forward hook,
    its attentions from ``output_attentions``, against the converted model's study."""
    from transformers import AutoModelForCausalLM

    from family_configs import make_checkpoint

    path = make_checkpoint("llama", tmp_path)
    model = p0.load_checkpoint(path)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    toks = torch.randint(0, model.cfg.d_vocab, (4, 10), generator=torch.Generator().manual_seed(0))
    r = p0.sink_reads(model, toks, 0, bos=False, dims=[0, 3])
    for name in ("rescaled", "massive_removed", "direction_replaced", "state_replaced"):
        logits, alpha = S.hf_edited(hf, toks, 0, lambda h, n=name: S.edit_of(n, h, [0, 3]))
        assert all(close(a, b, 1.0) for a, b in zip(r.edits[name].per_block, alpha.mean((0, 2)).tolist())), name
        assert close(r.edits[name].loss, float(S.loss(logits, toks).mean()), 10.0), name


def test_edits_that_leave_nothing_to_read_are_not_applicable(planted_models):
    """A state no later head attends to (the BOS-keyed plant without its BOS token): the answer says why, not a share."""
    pm = planted_models("bos")
    r = p0.sink_reads(pm.model, prompts(pm), ONSET, bos=False)
    assert r.reads.startswith("not applicable") and "no head after block 1 gives position 0" in r.reads


@pytest.mark.parametrize("variant,first", [("rope", 0), ("nope", 0), ("layer2", 2), ("learned", None), ("bos", None)])
def test_detection_is_where_each_plant_puts_it(planted_models, variant, first):
    pm = planted_models(variant)
    bos = variant == "bos"
    onset = pm.spec.circuit_layer + 1
    toks = prompts(pm, bos=bos)
    d = p0.diagonal_attention(pm.model, toks, onset, bos=bos)
    assert d.first == first
    if first is not None:
        assert all(s > 0.95 for s in d.norm_share[first:]) and all(c > 0.99 for c in d.cosine[first:])
        assert all(s < 0.2 for s in d.norm_share[:first])
    else:
        assert all(s < 0.2 for s in d.norm_share)
    for k in d.upto:  # against plain hooks
        h = S.tl_diagonal(pm.model, toks, onset, k).float()
        clean = S.tl_diagonal(pm.model, toks, onset, -1).float()[:, 0]
        share = h[:, 1:].norm(dim=-1) / clean.norm(dim=-1)[:, None]
        cos = torch.nn.functional.cosine_similarity(h[:, 1:], clean[:, None], dim=-1)
        assert close(d.norm_share[k], float(share.mean()), 1.0) and close(d.cosine[k], float(cos.mean()), 1.0)


def test_the_amplifier_writes_the_sink_through_one_super_weight(planted):
    pm, toks = planted, prompts(planted)
    layer, (n0,) = pm.neurons["amplifier"]
    sink = pm.layout.one("sink")
    before = {k: v.clone() for k, v in pm.model.state_dict().items()}
    w = p0.super_weights(pm.model, toks, ONSET, [f"M{layer}.N{n0}@0"], [sink], bos=False, massive=[sink])
    assert all(torch.equal(before[k], v) for k, v in pm.model.state_dict().items())  # restored, to the bit
    (weight,) = w.weights
    assert weight.rank == 1 and weight.z > 20 and weight.massive
    (alone,) = w.zeroed
    assert w.clean.norm_ratio > 10 and alone.norm_ratio < 1.5 and alone.attention < w.clean.attention / 2
    ratio, logits = S.tl_without_weight(pm.model, toks, ONSET, layer, n0, sink)
    assert close(alone.norm_ratio, ratio, 1.0) and close(alone.loss, float(S.loss(logits, toks).mean()), 10.0)
    listed = p0.weight_outliers(pm.model, massive=[sink])
    assert listed[0].block == layer and listed[0].neuron == n0 and listed[0].dim == sink


def test_a_weight_is_restored_when_the_forward_fails(planted, monkeypatch):
    from p0circuit.studies.experiments import super_weights as sw

    layer, (n0,) = planted.neurons["amplifier"]
    value = float(planted.model.blocks[layer].mlp.W_out[n0, planted.layout.one("sink")])

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sw, "_measure", lambda *a, **k: boom() if a[-1] else sw.Zeroed([], 1.0, 0.5, 0.5, 1.0))
    with pytest.raises(KeyboardInterrupt):
        p0.super_weights(planted.model, prompts(planted), ONSET, [f"M{layer}.N{n0}@0"], [planted.layout.one("sink")],
                         bos=False)
    assert float(planted.model.blocks[layer].mlp.W_out[n0, planted.layout.one("sink")]) == value


@pytest.mark.parametrize("variant", ["rope", "bos"])
def test_every_first_token(planted_models, variant):
    pm = planted_models(variant)
    onset = pm.spec.circuit_layer + 1
    ref = prompts(pm)  # no BOS: the ratio's denominator and the direction
    f = p0.first_token_map(pm.model, ref, onset)
    assert f.vocab == pm.spec.d_vocab
    if variant == "rope":  # position-keyed: whatever stands first becomes the sink
        assert f.sinks == 1.0 and f.not_sinks == 0 and f.aligned == 1.0
    else:  # BOS-keyed: only the BOS token
        assert f.not_sinks == pm.spec.d_vocab - 1 and f.lowest[0].id != pm.spec.bos_id
    with torch.no_grad():
        _, cache = pm.model.run_with_cache(ref, names_filter=f"blocks.{onset}.hook_resid_post")
    ordinary = float(cache[f"blocks.{onset}.hook_resid_post"][:, 1:].float().norm(dim=-1).mean())
    for point in f.lowest[:4] + f.prompts[:2]:
        state = S.tl_state(pm.model, point.id, onset)
        assert close(point.ratio, float(state.norm()) / ordinary, 1.0)


def test_a_mid_prompt_bos_token_is_a_sink_in_the_bos_plant(planted_models):
    """The BOS-keyed plant's detector fires wherever its BOS token stands, and the sink heads attend to it; the
    position-keyed plant leaves the same token ordinary mid-prompt."""
    pm = planted_models("bos")
    toks = prompts(pm, bos=True)
    (t,) = p0.special_tokens(pm.model, toks, bos=True, ids=[pm.spec.bos_id])
    assert t.called == "sink" and t.first_block == pm.spec.circuit_layer + 1 and t.max_head_attention > 0.5
    rope = planted_models("rope")
    (t,) = p0.special_tokens(rope.model, prompts(rope), bos=False, ids=[0])
    assert t.called == "ordinary" and t.first_block is None


def test_uniform_attention_baseline():
    assert uniform_alpha0(1) == 1.0 and close(uniform_alpha0(3), (1 + 1 / 2 + 1 / 3) / 3, 1.0)
    assert set(EDITS) == {"rescaled", "massive_removed", "direction_replaced", "random_direction", "state_replaced"}


@pytest.mark.parametrize("layer, neurons, said", [
    (3, ["M3.N0@0"], "block 3's MLP W_out has every entry equal"),  # the default plant's block 3 writes nothing
    (0, ["M1.N64@0"], "is in block 1, after block 0, where the norm ratio is measured"),
    (1, "M1.N64@0", "neurons='M1.N64@0' must be a list of neuron names"),
])
def test_super_weights_refuses_a_question_it_cannot_answer(planted, layer, neurons, said):
    with pytest.raises(p0.BadInputError, match=said):
        p0.super_weights(planted.model, prompts(planted), layer, neurons, [planted.layout.one("sink")], bos=False)


def test_a_sampled_first_token_map_gives_its_share_an_interval(planted_models):
    """Sampled (``most``), the share of first tokens that become sink states carries its 95% Wilson interval over the
    random draws; the BOS plant makes it checkable: only its BOS token is a sink, and the draws are its other tokens."""
    pm = planted_models("bos")
    onset = pm.spec.circuit_layer + 1
    full = p0.first_token_map(pm.model, prompts(pm), onset)
    assert full.sinks_interval is None and full.vocab == pm.spec.d_vocab
    most = pm.spec.d_vocab // 2
    part = p0.first_token_map(pm.model, prompts(pm), onset, most=most, seed=3)
    assert most <= part.vocab < pm.spec.d_vocab and "95% Wilson interval" in part.evidence
    low, high = part.sinks_interval
    assert 0.0 <= low < high <= 1.0 and low <= 1 / pm.spec.d_vocab * 4  # almost no draw is a sink here


def test_a_sampled_map_with_a_margin_stops_drawing_once_its_interval_is_that_narrow(planted_models, monkeypatch):
    """``margin``: a sampled map draws in rounds (a prefix of one seeded order) and stops once the share's 95% interval
    is within ``margin`` either side; each token's ratio is the one a full draw measures. The BOS plant's share is
    near 0 (only its BOS token makes a sink), so a wide margin stops after the first round and a tiny one draws all."""
    from p0circuit.measures.spread import share_interval
    from p0circuit.studies.experiments import first_tokens as ft
    pm = planted_models("bos")
    onset, vocab = pm.spec.circuit_layer + 1, pm.spec.d_vocab
    monkeypatch.setattr(ft, "ROUND", 8)
    most = vocab - 2
    every = p0.first_token_map(pm.model, prompts(pm), onset, most=most, seed=5)
    short = p0.first_token_map(pm.model, prompts(pm), onset, most=most, seed=5, margin=0.3)
    tight = p0.first_token_map(pm.model, prompts(pm), onset, most=most, seed=5, margin=1e-6)
    # never narrow enough: every draw, as without a margin (measured in rounds: equal ratios to float rounding)
    assert (tight.vocab, tight.sinks, tight.sinks_interval) == (every.vocab, every.sinks, every.sinks_interval)
    assert [p.id for p in tight.lowest] == [p.id for p in every.lowest]
    assert "rounds of 8" in short.evidence and short.vocab < every.vocab
    low, high = short.sinks_interval
    assert (high - low) / 2 <= 0.3
    drawn = len(torch.randperm(vocab, generator=torch.Generator().manual_seed(5))[:most][:8])  # one round's draws
    # over one round's draws: the interval of some count of hits among 8
    assert (low, high) in [tuple(round(v, 6) for v in share_interval(h, drawn)) for h in range(drawn + 1)]
    assert (low, high) not in [tuple(round(v, 6) for v in share_interval(h, 16)) for h in range(17)]
    full = {p.id: p.ratio for p in every.lowest + every.prompts + every.special}
    for point in short.lowest + short.prompts + short.special + tight.lowest:
        if point.id in full:
            assert close(point.ratio, full[point.id], 1e-6)
    for bad in (-0.1, 0.5, float("nan"), True, "0.1"):
        with pytest.raises(p0.BadInputError, match="first_token_map: margin="):
            p0.first_token_map(pm.model, prompts(pm), onset, most=most, margin=bad)


def test_the_wilson_interval():
    from p0circuit.measures.spread import share_interval
    low, high = share_interval(0, 10)  # the textbook case: 0 of 10 -> [0, 0.278]
    assert low == 0.0 and abs(high - 0.27753) < 1e-4
    low, high = share_interval(8150, 8192)
    assert low < 8150 / 8192 < high and high - low < 0.004
    for hits, n, said in ((3, 2, "hits <= draws"), (3, -1, "draws=-1 must be a whole number >= 1"), (-1, 4, "hits=-1"), (1, 0, "draws"), (1.5, 4, "hits=1.5"),
                          (True, 4, "hits=True")):
        with pytest.raises(p0.BadInputError, match=re.escape(said)):
            share_interval(hits, n)
