"""The planted model with a secondary sink (``PlantSpec.secondary_token``, ``planted:secondary``): one MLP
neuron of block ``s`` turns every position holding the token into a high-norm state, beside the P0 circuit,
which holds as before (see *A secondary sink* in p0circuit.models.planted.build).

Prompts are regular probes (only position 0 looks like a start) with the secondary token put where each test
says; its positions t >= 1 are the only sink states besides P0.
"""

import hashlib

import pytest
import torch

import p0circuit as p0
from p0circuit import ConfigError, PlantSpec, build_planted
from p0circuit.core import hooks
from p0circuit.core.defaults import NORM_THRESHOLD
from p0circuit.core.entries import VARIANTS, entry_layers
from p0circuit.measures.positions import position_ratios


FINGERPRINTS = {
    "rope": "ad8d8c04342e1bb0", "nope": "69d8ef665266def0", "learned": "602df6125617dbd1",
    "layer2": "896ef66824bf2238", "sink1": "10ca942b4187ee5a", "sink1_nope": "76983eda29797e06",
    "bos": "fcb3c174454071a5",
}
"""sha256 (first 16 hex digits) of every parameter's name and bytes, in state_dict order, of each variant as
built before the secondary sink existed (torch 2.13 CPU; the same with 1 and 2 threads)."""


def fingerprint(model):
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def secondary():
    return build_planted(**VARIANTS["secondary"])


def prompts(pm, n, length, seed, at=None):
    """Regular probes without the secondary token, then with it at ``at`` (an index, or None: one random
    position in 1..length-1 per prompt, never position 1 after the same token at 0)."""
    j2 = pm.spec.secondary_token
    toks = p0.probe_tokens(pm.model, n, length, seed=seed, regular=True)
    toks[toks == j2] = (j2 + 1) % pm.spec.d_vocab  # 26 is no neighbour's copy: the probes stay regular
    if at is None:
        where = torch.randint(1, length, (n,), generator=torch.Generator().manual_seed(seed))
    else:
        where = torch.full((n,), at)
    toks[torch.arange(n), where] = j2
    assert len(p0.regular_prompts(toks, pm.spec.theta)) == n
    return toks


def resid(pm, toks):
    _, cache = pm.model.run_with_cache(toks)
    return torch.stack([cache[hooks.resid_post(l)] for l in range(pm.spec.n_layers)]), cache


@pytest.mark.parametrize("variant", sorted(FINGERPRINTS))
def test_the_plants_without_a_secondary_sink_are_unchanged(planted_models, variant):
    """Every variant's weights are bit for bit those of the build before the secondary fields existed (and before
    ``sink_reads``), and its recorded settings lack them."""
    pm = planted_models(variant)
    assert fingerprint(pm.model) == FINGERPRINTS[variant], variant
    assert not {"secondary_token", "secondary_layer", "secondary_ratio", "sink_reads"} & set(pm.spec.to_dict())
    assert PlantSpec(**pm.spec.to_dict()) == pm.spec
    assert pm.secondary_truth(3) is None and pm.secondary_heads == () and "secondary" not in pm.neurons


def test_the_variant_entry(secondary):
    spec = secondary.spec
    assert entry_layers("planted:secondary") == spec.n_layers == 5
    assert spec.secondary_at == 2 and spec.secondary_token == 25 and spec.secondary_ratio == 8.0
    assert secondary.neurons["secondary"] == (2, (0,))
    assert secondary.secondary_heads == ((3, 1),) and secondary.sink_heads == ((2, 0), (3, 0), (4, 0))
    assert PlantSpec(**spec.to_dict()) == spec


def test_the_p0_circuit_is_unchanged(secondary):
    """The P0 truth is the plain plant's; its guarantees hold with the token anywhere, also at queries that sit on
    a secondary sink (their large RMS scale would shrink the sink heads' queries, had those not read k2)."""
    spec = secondary.spec
    assert secondary.truth.node_names == {"A0.H0@0", "M0@0", "M1@0", "A2.H0@0", "A3.H0@0", "A4.H0@0"}
    assert secondary.truth.edge_names == {"A0.H0@0->M0@0.mlp_in", "M0@0->M1@0.mlp_in", "M1@0->A2.H0@0.k",
                                          "M1@0->A3.H0@0.k", "M1@0->A4.H0@0.k"}
    for length in (3, 16, spec.n_ctx):
        toks = prompts(secondary, 16, length, seed=length)
        toks[:4, -1] = spec.secondary_token  # and a second one, at the end
        r, cache = resid(secondary, toks)
        norms = r[spec.circuit_layer + 1].norm(dim=-1)
        assert (norms[:, 0] / norms[:, 1:].mean(1) >= spec.norm_ratio).all(), length
        for layer, head in secondary.sink_heads:
            assert (cache[hooks.pattern(layer)][:, head, :, 0] >= 0.8).all(), (length, layer)


@pytest.mark.parametrize("length", [8, 16, 64])
def test_the_sink_report_shows_p0_and_the_token_and_nothing_else(secondary, length):
    """P0 is a sink state from the amplifier's block on, every position t >= 1 holding the token from block s on
    (at ``secondary_ratio`` times its prompt's median norm or more), and no other position at any block."""
    spec = secondary.spec
    a, s, j2 = spec.circuit_layer, spec.secondary_at, spec.secondary_token
    toks = prompts(secondary, 24, length, seed=length)
    rep = p0.sink_report(secondary.model, toks, bos=False)
    want = {(l, "P0") for l in range(a + 1, spec.n_layers)} | {(l, "other") for l in range(s, spec.n_layers)}
    assert {(x.layer, x.where) for x in rep.sink_positions} == want
    token_at = toks == j2
    token_at[:, 0] = False
    for x in rep.sink_positions:
        if x.where == "P0":
            assert x.share == 1.0 and x.ratio >= spec.norm_ratio
        else:  # the report leaves out a last position (nothing attends to it)
            assert set(x.positions) <= set(token_at[:, :-1].nonzero()[:, 1].tolist())
            assert x.share == pytest.approx(float(token_at[:, :-1].any(1).float().mean()))
    ratios = position_ratios(resid(secondary, toks)[0])  # (L, B, T)
    for layer in range(spec.n_layers):
        sinks = ratios[layer] >= NORM_THRESHOLD
        assert bool(sinks[:, 0].all()) == (layer >= a + 1), layer
        assert torch.equal(sinks[:, 1:], token_at[:, 1:] & (layer >= s)), layer
        if layer >= s:
            assert (ratios[layer][token_at] >= spec.secondary_ratio).all(), (layer, ratios[layer][token_at].min())


def test_the_secondary_head_attends_to_the_token(secondary):
    """Head A{s+1}.H1 puts >= 0.8 of the attention of every query after the token's position on it."""
    at = 6
    toks = prompts(secondary, 16, 24, seed=2, at=at)
    _, cache = secondary.model.run_with_cache(toks)
    layer, head = secondary.secondary_heads[0]
    assert (cache[hooks.pattern(layer)][:, head, at + 1:, at] >= 0.8).all()


def test_the_secondary_sink_is_keyed_on_the_token(secondary):
    """At position 0 the token leaves P0 the sink it is; moved, the sink moves with it; replaced in place, the
    position is ordinary again (ratio near 1) and P0's residual stream is the same to the bit."""
    spec = secondary.spec
    s, j2, n, length = spec.secondary_at, spec.secondary_token, 16, 20
    base = prompts(secondary, n, length, seed=5, at=5)
    moved = base.clone()
    moved[:, 5] = base[:, 4]  # a token of the prompt, so no new token comes in
    moved[:, 12] = j2
    gone = base.clone()
    gone[:, 5] = base[:, 4]
    first = gone.clone()
    first[:, 0] = j2  # no other position holds it: position 1 stays ordinary
    for toks in (moved, gone, first):
        assert len(p0.regular_prompts(toks, spec.theta)) == n and int((toks == j2).sum()) == (0 if toks is gone else n)
    r_base, r_moved, r_gone, r_first = (resid(secondary, t)[0] for t in (base, moved, gone, first))
    ratio = {k: position_ratios(r) for k, r in (("base", r_base), ("moved", r_moved), ("gone", r_gone),
                                                ("first", r_first))}
    for layer in range(s, spec.n_layers):
        assert (ratio["base"][layer, :, 5] >= spec.secondary_ratio).all()
        assert (ratio["moved"][layer, :, 12] >= spec.secondary_ratio).all()
        assert (ratio["moved"][layer, :, 5] < 1.25).all() and (ratio["gone"][layer, :, 5] < 1.25).all()
        assert (ratio["gone"][layer, :, 1:] < 1.25).all() and (ratio["gone"][layer, :, 1:] > 0.8).all()
        assert (ratio["first"][layer, :, 0] >= spec.norm_ratio).all() and (ratio["first"][layer, :, 1:] < 1.25).all()
    assert torch.equal(r_gone[:, :, 0], r_base[:, :, 0]) and torch.equal(r_moved[:, :, 0], r_base[:, :, 0])
    norms = r_gone[spec.circuit_layer + 1].norm(dim=-1)
    assert (norms[:, 0] / norms[:, 1:].mean(1) >= spec.norm_ratio).all()


def test_patching_finds_the_secondary_truth(secondary):
    """The token swapped in place, the norm ratio at its position after block s: E@at and M{s}@at carry the
    whole effect, every other candidate next to none, and the faithful circuit is exactly the truth's writers."""
    spec, at = secondary.spec, 5
    s = spec.secondary_at
    toks = prompts(secondary, 8, 12, seed=4, at=at)
    nodes = [n.name for n in p0.candidate_nodes(secondary.model, positions=(0, at), embed=True) if n.layer <= s]
    result = p0.activation_patch(secondary.model, toks, nodes=nodes, corruption=p0.Swap(position=at),
                                 metric=p0.NormRatio(s, pos=at))
    truth = secondary.secondary_truth(at)
    assert truth.node_names == {f"E@{at}", f"M{s}@{at}", f"R{s}@{at}", f"A{s + 1}.H1@{at}"}
    assert truth.edge_names == {f"E@{at}->M{s}@{at}.mlp_in", f"M{s}@{at}->R{s}@{at}.resid",
                                f"M{s}@{at}->A{s + 1}.H1@{at}.k"}
    writers = {n.name for n in truth.writers}
    assert writers == {f"E@{at}", f"M{s}@{at}"}
    effects = result.normalized
    assert all(effects[n] > 0.95 for n in writers), {n: effects[n] for n in writers}
    assert max(abs(v) for n, v in effects.items() if n not in writers) < 0.05
    found = p0.faithful_circuit(result).search
    assert set(found.nodes) == writers and found.faithful, (found.nodes, found.why)


@pytest.mark.parametrize("kw,msg", [
    (dict(secondary_token=32), "secondary_token must be a token id in 0..31"),
    (dict(secondary_token=True), "secondary_token=True \\(bool\\) is not int or None"),
    (dict(secondary_layer=2), "set secondary_token"),
    (dict(secondary_ratio=4.0), "set secondary_token"),
    (dict(secondary_token=5, secondary_layer=1), "must lie in circuit_layer \\+ 2 .. n_layers - 2 = 2..2"),
    (dict(secondary_token=5, secondary_layer=3), "secondary_layer must lie in"),
    (dict(secondary_token=5, circuit_layer=1), "needs n_layers >= circuit_layer \\+ 4"),
    (dict(secondary_token=5, secondary_ratio=0.5), "secondary_ratio must lie in \\[1, 1e6\\]"),
    (dict(secondary_token=0, key="bos"), "is the BOS token of key='bos'"),
])
def test_secondary_spec_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        PlantSpec(**kw)
