"""What the planted model guarantees, asserted on random prompts of every length.

Guarantees (see p0circuit.models.planted.build): on a prompt where the detector flags only the sink
position (``p0_like_positions`` is {0}), the residual norm at the sink after the amplifier block
is >= norm_ratio (10) times the mean of the other positions, and every sink head puts >= 0.8 of
every query's attention (queries at or after the sink) on the sink. Where the plant cannot hold
(a prefix made of one repeated token) the failure is exact and tested too.
"""


import pytest

import p0circuit as p0
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p0circuit import ConfigError, PlantSpec, build_planted, p0_like_positions, positional_kind, sink_report
from p0circuit.core import hooks
from p0circuit.core.types import Kind, Node

from conftest import PLANT_VARIANTS, random_tokens
from tolerance import assert_close


def sink_facts(pm, tokens):
    """(norm ratio after the amplifier block per prompt, min attention to the sink per prompt)."""
    sp = pm.spec.sink_pos
    layer = pm.spec.circuit_layer + 1
    _, cache = pm.model.run_with_cache(tokens)
    norms = cache[hooks.resid_post(layer)].norm(dim=-1)
    others = torch.cat([norms[:, :sp], norms[:, sp + 1:]], 1).mean(1)
    att = torch.stack([cache[hooks.pattern(l)][:, h, sp:, sp] for l, h in pm.sink_heads])  # (S, B, Q)
    return norms[:, sp] / others, att.amin(dim=(0, 2))


def regular(pm, tokens):
    if pm.spec.pos == "learned":
        return torch.ones(len(tokens), dtype=torch.bool)
    return p0_like_positions(tokens, pm.spec.theta)[:, 1:].sum(1) == 0


@pytest.mark.parametrize("variant", [v for v in PLANT_VARIANTS if v != "bos"])  # bos: its sink needs BOS at P0
def test_sink_holds_at_every_length(planted_models, variant):
    pm = planted_models(variant)
    V, T = pm.spec.d_vocab, pm.spec.n_ctx
    min_len = 2 + pm.spec.sink_pos
    for length in range(min_len, T + 1):
        toks = random_tokens(16, length, V, seed=length)
        ok = regular(pm, toks)
        ratio, att = sink_facts(pm, toks[ok])
        assert ok.float().mean() > 0.8
        assert (ratio >= pm.spec.norm_ratio).all(), (variant, length, ratio.min())
        assert (att >= 0.8).all(), (variant, length, att.min())


def test_bos_plant_sink_holds_with_its_bos_token_first(planted_models):
    """The BOS-keyed plant, prompts starting with its BOS token: the norm ratio and the sink heads'
    attention hold as for the position plants (its calibration probe starts with that token; a probe
    without it left the sink heads scaled for a P0 that is not a sink, at 0.16 of their attention)."""
    pm = planted_models("bos")
    for length in (2, 16, pm.spec.n_ctx):
        toks = p0.probe_tokens(pm.model, 16, length, seed=length, regular=True, bos=True)
        ratio, att = sink_facts(pm, toks)
        assert (ratio >= pm.spec.norm_ratio).all(), (length, ratio.min())
        assert (att >= 0.8).all(), (length, att.min())


@settings(max_examples=40, deadline=None)
@given(
    variant=st.sampled_from(["rope", "nope", "learned"]),
    length=st.integers(2, 64),
    seed=st.integers(0, 2**31 - 1),
)
def test_sink_property(planted_models, variant, length, seed):
    pm = planted_models(variant)
    toks = random_tokens(4, length, pm.spec.d_vocab, seed)
    ok = regular(pm, toks)
    if ok.any():
        ratio, att = sink_facts(pm, toks[ok])
        assert (ratio >= 10).all() and (att >= 0.8).all()


@pytest.mark.parametrize("variant", ["rope", "nope"])
def test_repeated_token_prompt_has_no_distinguished_position(planted_models, variant):
    """The documented edge case: one repeated token makes every position a copy of P0."""
    pm = planted_models(variant)
    toks = torch.full((1, 20), 5)
    _, cache = pm.model.run_with_cache(toks)
    for layer in range(pm.spec.n_layers):
        r = cache[hooks.resid_post(layer)][0]
        assert_close(r, r[:1].expand_as(r), what=f"block {layer}'s positions")
    ratio, _ = sink_facts(pm, toks)
    assert ratio.item() == pytest.approx(1.0, abs=1e-4)
    pat = cache[hooks.pattern(2)][0, 0]  # a sink head: attention is uniform, 1/(t+1) on P0
    assert pat[:, 0].tolist() == pytest.approx([1 / (t + 1) for t in range(20)], abs=1e-5)


def test_first_token_repeated_makes_position_1_a_copy(planted_models):
    pm = planted_models("rope")
    toks = random_tokens(8, 30, pm.spec.d_vocab, seed=1)
    toks[:, 1] = toks[:, 0]
    assert p0_like_positions(toks)[:, 1].all()
    _, cache = pm.model.run_with_cache(toks)
    r = cache[hooks.resid_post(3)]
    assert_close(r[:, 0], r[:, 1], what="positions 0 and 1 after block 3")
    pat = cache[hooks.pattern(2)][:, 0, 2:]  # queries t >= 2 split their attention over positions 0, 1
    assert torch.allclose(pat[..., 0] + pat[..., 1], torch.ones_like(pat[..., 0]), atol=1e-2)
    assert (pat[..., 0] < 0.8).all()


def test_learned_positions_sink_survives_repeated_tokens(planted_models):
    """Negative control: with a learned P0 embedding the repeated-token edge case does not apply."""
    pm = planted_models("learned")
    assert positional_kind(pm.model) == "learned"
    ratio, att = sink_facts(pm, torch.full((2, 20), 5))
    assert (ratio >= 10).all() and (att >= 0.8).all()


def test_nope_plant_has_no_positional_signal(planted_models):
    assert positional_kind(planted_models("nope").model) == "nope"
    assert positional_kind(planted_models("rope").model) == "rope"


def test_identification_head_is_uniform_and_cone_shaped(planted):
    """A0.H0 attends uniformly; its output at P0 has ||o_0||^2 = mu^2 + sigma^2 exactly."""
    toks = random_tokens(64, 32, 32, seed=7)
    _, cache = planted.model.run_with_cache(toks)
    pat = cache[hooks.pattern(0)][:, 0]
    expected = torch.tril(torch.ones(32, 32)) / torch.arange(1, 33)[:, None]
    assert torch.allclose(pat, expected.expand_as(pat), atol=1e-6)
    o = torch.einsum("bph,hd->bpd", cache[hooks.head_z(0)][:, :, 0], planted.model.W_O[0, 0])
    sq = o.pow(2).sum(-1)  # (B, T)
    mu, sigma = planted.spec.mu, planted.spec.sigma
    assert torch.allclose(sq[:, 0], torch.full_like(sq[:, 0], mu**2 + sigma**2), rtol=1e-4)
    # cone model: E||o_t||^2 = mu^2 + sigma^2/(t+1) over uniform random tokens (s_j zero-mean)
    for t in (1, 3, 15):
        assert sq[:, t].mean().item() == pytest.approx(mu**2 + sigma**2 / (t + 1), rel=0.15)


def test_detector_neurons_fire_only_at_p0(planted):
    toks = random_tokens(32, 40, 32, seed=3)
    toks = toks[p0_like_positions(toks)[:, 1:].sum(1) == 0]
    _, cache = planted.model.run_with_cache(toks)
    layer, idx = planted.neurons["detector"]
    acts = cache[hooks.mlp_post(layer)][..., list(idx)].sum(-1)  # (B, T)
    assert (acts[:, 0] > 0).all() and (acts[:, 1:] == 0).all()
    layer, idx = planted.neurons["amplifier"]
    amp = cache[hooks.mlp_post(layer)][..., list(idx)].sum(-1)
    assert (amp[:, 0] > 0).all() and (amp[:, 1:] == 0).all()


def test_distractors_do_real_work_on_the_logits(planted):
    """Zeroing a distractor head or the content neurons changes the logits."""
    toks = random_tokens(8, 24, 32, seed=5)
    base = planted.model(toks)
    layer, head = planted.content_heads[0]

    def zero_head(z, hook):
        z[:, :, head] = 0
        return z

    changed = planted.model.run_with_hooks(toks, fwd_hooks=[(hooks.head_z(layer), zero_head)])
    assert (changed - base).abs().max() > 0.1
    layer, idx = planted.neurons["content1"]

    def zero_neurons(a, hook):
        a[..., list(idx)] = 0
        return a

    changed = planted.model.run_with_hooks(toks, fwd_hooks=[(hooks.mlp_post(layer), zero_neurons)])
    assert (changed - base).abs().max() > 0.1


def test_report_shows_what_the_plant_guarantees(planted_models):
    for variant in ("rope", "layer2", "sink1"):
        pm = planted_models(variant)
        toks = random_tokens(32, 48, pm.spec.d_vocab, seed=11)
        toks = toks[regular(pm, toks)]
        rep = sink_report(pm.model, toks)
        a, sp = pm.spec.circuit_layer, pm.spec.sink_pos
        assert rep.sink_position == sp
        if sp == 0:
            assert rep.norm_onset_layer == a + 1
            assert rep.norm_ratio_resid_min[a + 1] >= 10
            assert rep.head_onset_layer == a + 2
            for layer, head in pm.sink_heads:
                assert rep.alpha[layer][head] >= 0.8
            sink_dim = pm.layout.one("sink")
            assert {(l, d) for l, d, _, _ in rep.massive} == {(l, sink_dim) for l in range(a + 1, pm.spec.n_layers)}
            assert min(rep.direction_stability[a + 1:]) > 0.99


def test_ground_truth_circuits(planted_models):
    t = planted_models("rope").truth
    assert t.node_names == {"A0.H0@0", "M0@0", "M1@0", "A2.H0@0", "A3.H0@0"}  # the sink heads receive the keys
    assert {n.name for n in t.writers} == {"A0.H0@0", "M0@0", "M1@0"}
    assert t.edge_names == {"A0.H0@0->M0@0.mlp_in", "M0@0->M1@0.mlp_in", "M1@0->A2.H0@0.k", "M1@0->A3.H0@0.k"}
    assert {n.name for n in planted_models("learned").truth.writers} == {"PE@0", "M0@0", "M1@0"}
    assert {n.name for n in planted_models("layer2").truth.writers} == {"A2.H0@0", "M2@0", "M3@0"}
    assert {n.name for n in planted_models("sink1").truth.writers} == {"A0.H0@0", "M0@0", "A1.H1@1", "M1@1"}
    assert Node(Kind.HEAD, 0, 0, 0) not in planted_models("learned").truth.nodes
    for variant in ("learned", "layer2", "sink1", "bos"):  # every edge's ends are in the node list
        truth = planted_models(variant).truth
        assert {n for e in truth.edges for n in (e.src, e.dst)} <= set(truth.nodes), variant
        assert set(truth.nodes) - set(truth.writers) == {e.dst for e in truth.edges} - {e.src for e in truth.edges}


def test_same_seed_same_plant():
    a, b = build_planted(seed=3), build_planted(seed=3)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(n_layers=2), "n_layers >= circuit_layer \\+ 3"),
        (dict(sink_pos=2), "sink_pos must be 0 or 1"),
        (dict(pos="alibi"), "choose 'rope', 'nope' or 'learned'"),
        (dict(d_vocab=30), "multiple of 4"),
        (dict(theta=0.4), "theta must lie in"),
        (dict(n_heads=1), "n_heads must be >= 2"),
    ],
)
def test_plant_spec_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        PlantSpec(**kw)


def test_sink_heads_by_name_from_python(planted):
    """``metric="sink_heads"`` works from Python as on the command line: the planted model carries its heads."""
    toks = p0.probe_tokens(planted.model, 8, 16, seed=0, regular=True)
    by_name = p0.activation_patch(planted.model, toks, metric="sink_heads")
    given = p0.activation_patch(planted.model, toks, metric=p0.AttnToP0(heads=list(planted.sink_heads)))
    assert by_name.metric == given.metric and by_name.raw == given.raw
    with pytest.raises(p0.ConfigError, match="'sink_heads' needs a planted model"):
        p0.activation_patch(p0.ModelSpec(n_layers=2).build(), toks, metric="sink_heads")
