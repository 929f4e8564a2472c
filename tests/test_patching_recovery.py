"""Discovery recovers the planted circuit exactly (RoPE and NoPE plants), and the controls behave.

The metric is the mean attention to P0 of the planted sink heads (what the plant guarantees);
the default plant's norm-ratio metric is checked too.
"""

import pytest

import p0circuit as p0
from p0circuit.patching.check import differences
from p0circuit import Kind

from conftest import random_tokens


def regular_tokens(pm, n=16, length=32, seed=0):
    toks = random_tokens(n, length, pm.spec.d_vocab, seed)
    return toks[p0.p0_like_positions(toks)[:, 1:].sum(1) == 0]


def sink_metric(pm):
    return p0.AttnToP0(heads=list(pm.sink_heads))


@pytest.mark.parametrize("variant", ["rope", "nope"])
@pytest.mark.parametrize("corruption", ["shift", "pos_mean"])
def test_activation_patching_recovers_nodes(planted_models, variant, corruption):
    pm = planted_models(variant)
    circuit = p0.discover(pm.model, regular_tokens(pm), method="activation", corruption=corruption, metric=sink_metric(pm))
    assert circuit.node_names == {n.name for n in pm.truth.writers}
    scores = p0.compare(circuit, pm.truth)
    assert scores["node_auroc"] == 1.0 and scores["node_precision"] == 1.0 and scores["node_recall"] == 1.0
    assert "attention under the causal mask (A0.H0@0)" in circuit.settings["interpretation"]


@pytest.mark.parametrize("corruption", ["shift", "pos_mean"])
def test_activation_patching_with_norm_metric(planted, corruption):
    circuit = p0.discover(planted.model, regular_tokens(planted), method="activation", corruption=corruption, metric=p0.NormRatio(1))
    assert circuit.node_names == {n.name for n in planted.truth.writers}


def test_activation_patching_at_other_layers(planted_models):
    pm = planted_models("layer2")
    circuit = p0.discover(pm.model, regular_tokens(pm), method="activation", corruption="shift", metric=sink_metric(pm))
    assert circuit.node_names == {"A2.H0@0", "M2@0", "M3@0"} == {n.name for n in pm.truth.writers}


@pytest.mark.parametrize("variant", ["rope", "nope"])
@pytest.mark.parametrize("corruption", ["shift", "pos_mean"])
def test_path_patching_recovers_edges(planted_models, variant, corruption):
    pm = planted_models(variant)
    circuit = p0.discover(pm.model, regular_tokens(pm), method="path", corruption=corruption, metric=sink_metric(pm))
    assert circuit.edge_names == pm.truth.edge_names
    assert p0.compare(circuit, pm.truth)["edge_auroc"] == 1.0
    assert len(circuit.edge_effects) > 200  # scored over every candidate edge


@pytest.mark.parametrize("variant", ["rope", "nope", "learned"])
@pytest.mark.parametrize("corruption", ["shift", "pos_mean"])
def test_attribution_patching_ranks_nodes(planted_models, variant, corruption):
    pm = planted_models(variant)
    circuit = p0.discover(pm.model, regular_tokens(pm), method="attribution", corruption=corruption, metric=sink_metric(pm))
    assert p0.compare(circuit, pm.truth)["node_auroc"] >= 0.95


@pytest.mark.parametrize("variant", ["rope", "nope"])
@pytest.mark.parametrize("method", ["activation", "path"])
def test_resample_is_reported_as_no_signal(planted_models, variant, method):
    """Negative control: other prompts keep every position, so the position-only circuit is invisible (measured:
    the control can show a signal, ``test_resample_shows_a_signal_where_the_state_depends_on_the_prompts``)."""
    pm = planted_models(variant)
    circuit = p0.discover(pm.model, regular_tokens(pm), method=method, corruption="resample", metric=sink_metric(pm))
    assert circuit.nodes == () and circuit.settings["signal"] is False
    assert circuit.settings["interpretation"].startswith("no signal")
    message = circuit.settings["message"]
    assert "the same in both runs of 'resample'" in message and "try 'shift'" in message
    assert "try 'resample'" not in message and "or 'resample'" not in message
    result = p0.activation_patch(pm.model, regular_tokens(pm), corruption="resample", metric=sink_metric(pm))
    assert all(v != v for v in result.normalized.values())  # NaN, not normalized noise
    assert "NO SIGNAL" in str(result)


def test_resample_shows_a_signal_where_the_state_depends_on_the_prompts(planted_models):
    """The control can fail: the BOS-keyed plant makes a sink wherever its key token stands; with the token at
    position 3 of every prompt, other prompts lack it, so the sink is gone in the corrupted run and the plant's
    writers at that position carry the change. (Rolling the batch, the old default, kept every mean metric equal:
    no signal by construction.)"""
    pm = planted_models("bos")
    toks = regular_tokens(pm)
    toks[toks == pm.spec.bos_id] = pm.spec.bos_id + 5  # the key token at position 3 only
    toks[:, 3] = pm.spec.bos_id
    metric = p0.NormRatio(pm.spec.circuit_layer + 1, pos=3)
    nodes = p0.candidate_nodes(pm.model, positions=(3,), embed=True)
    result = p0.activation_patch(pm.model, toks, nodes=nodes, corruption="resample", metric=metric)
    assert result.signal and result.corrupted_metric < 0.3 * result.clean_metric
    strongest = sorted(result.normalized, key=lambda n: -abs(result.normalized[n]))[:3]
    assert set(strongest) == {n.at(3).name for n in pm.truth.writers}  # E, M0 and M1 at position 3
    rolled = p0.activation_patch(pm.model, toks, nodes=nodes, corruption=p0.Resample(tokens=toks.roll(1, 0)),
                                 metric=metric)
    assert rolled.clean_metric == pytest.approx(rolled.corrupted_metric, rel=1e-6) and not rolled.signal  # a permutation


@pytest.mark.parametrize("corruption", ["shift", "pos_mean"])
def test_learned_positions_yield_a_different_circuit(planted_models, corruption):
    pm = planted_models("learned")
    circuit = p0.discover(pm.model, regular_tokens(pm), method="activation", corruption=corruption, metric=sink_metric(pm))
    assert circuit.node_names == {"PE@0", "M0@0", "M1@0"} == {n.name for n in pm.truth.writers}
    assert not any(n.kind == Kind.HEAD for n in circuit.nodes)
    assert "position embedding (PE@0); no attention head is needed" in circuit.settings["interpretation"]
    path = p0.discover(pm.model, regular_tokens(pm), method="path", corruption=corruption, metric=sink_metric(pm))
    assert path.edge_names == pm.truth.edge_names


def test_token_embedding_under_pos_mean_is_trivially_necessary(planted):
    """Documented: with include_embed, E@0 is credited under pos_mean (mean embedding looks diluted) but not under shift."""
    nodes = p0.patching.candidate_nodes(planted.model, embed=True)
    toks = regular_tokens(planted)
    pos_mean = p0.activation_patch(planted.model, toks, nodes=nodes, corruption="pos_mean", metric=sink_metric(planted))
    shift = p0.activation_patch(planted.model, toks, nodes=nodes, corruption="shift", metric=sink_metric(planted))
    assert pos_mean.effect("E@0") > 0.9 and abs(shift.effect("E@0")) < 1e-6


def test_attribution_disagreements_are_reported(planted):
    toks = regular_tokens(planted)
    exact = p0.activation_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(1))
    approx = p0.attribution_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(1))
    flagged = differences(approx, exact, tol=0.2)
    # the linearization overshoots the threshold effects of the planted circuit: flagged, not hidden
    assert set(flagged) >= {"A0.H0@0", "M0@0"}
    assert all(abs(a - e) > 0.2 for a, e in flagged.values())


@pytest.mark.parametrize("variant", ["rope", "nope", "learned"])
def test_triage_finds_what_full_activation_patching_finds(planted_models, variant):
    """Attribution over all nodes, exact patching of the top 3 and a sample of 5 others: the circuit
    equals full exact patching's (recall 1 on the plant); unexamined nodes are NaN, never guessed."""
    pm = planted_models(variant)
    toks = regular_tokens(pm)
    full = p0.discover(pm.model, toks, method="activation", corruption="shift", metric=sink_metric(pm))
    triage = p0.discover(pm.model, toks, method="triage", corruption="shift", metric=sink_metric(pm))
    result = p0.patching.methods.triage.triage_patch(pm.model, toks, corruption="shift", metric=sink_metric(pm),
                                                     top=3, sample=5)
    small = result.to_circuit(0.1)
    assert triage.node_names == full.node_names == {n.name for n in pm.truth.writers}
    assert small.node_names == full.node_names
    report = result.settings["triage"]
    assert report["exact_top"] == 3 and report["sampled"] == 5 and report["sample_notable"] == 0
    unexamined = [n for n, v in result.normalized.items() if v != v]
    assert len(unexamined) == report["unexamined"] > 0
    for name in small.node_names:
        assert result.normalized[name] == pytest.approx(full.node_effects[name], abs=1e-5)


def test_interpretation_says_what_raises_and_lowers_the_metric():
    """A hand-made result: A0.H0 raises the metric, M1 lowers it (negative effect, clean > corrupted)."""
    from p0circuit.studies.discovery.discover import interpret
    from p0circuit.patching import PatchResult

    res = PatchResult("activation", "node", "shift", "norm_ratio@L2", "noise", clean_metric=10.0, corrupted_metric=2.0,
                      raw={"A0.H0@0": 3.0, "M0@0": 4.0, "M1@0": 13.0, "A1.H1@0": 9.99},
                      normalized={"A0.H0@0": 0.875, "M0@0": 0.75, "M1@0": -0.375, "A1.H1@0": 0.00125}, signal=True)
    line = interpret(res, 0.1)
    assert "identified by attention under the causal mask (A0.H0@0)" in line
    assert "raising norm_ratio@L2: A0.H0@0 +0.875, M0@0 +0.75" in line and "lowering it: M1@0 -0.375" in line
    flipped = PatchResult("activation", "node", "shift", "m", "noise", clean_metric=2.0, corrupted_metric=10.0,
                          raw=res.raw, normalized=res.normalized, signal=True)
    assert "lowering it: A0.H0@0 +0.875, M0@0 +0.75" in interpret(flipped, 0.1)
