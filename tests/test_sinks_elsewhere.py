"""Every sink state, on the plant with a secondary sink (``planted:secondary``): a P0 circuit keyed on position
and a middle-layer MLP that makes one token, wherever it stands, a high-norm state. The analysis must find
both, give each the circuit the plant writes (nodes and edges) and the keyed-on verdict it is built with."""

import pytest

import p0circuit as p0

pytestmark = pytest.mark.xdist_group("secondary")  # one worker builds and analyses the plant, once


@pytest.fixture(scope="module")
def secondary():
    return p0.analyze("planted:secondary", progress=False, bos=(False,), lengths=())


def _rows(result):
    rows = result["onsets"]["without_bos"]
    (p0_row,) = [o for o in rows if o["where"] == "P0"]
    (token_row,) = [o for o in rows if o["where"] != "P0"]
    return p0_row, token_row


def test_both_sinks_are_found_with_the_verdicts_they_are_built_with(secondary):
    result = secondary
    p0_row, token_row = _rows(result)
    assert p0_row["keyed_on"]["verdict"] == "position"
    assert token_row["where"] == "other ('#25')" and token_row["keyed_on"]["verdict"] == "token"
    k = token_row["keyed_on"]
    assert k["swapped"]["mean"] < 0.1 and k["follows"]["mean"] > 0.9 and k["stays"]["mean"] < 0.1
    # every window with token 25 at the index holds the state (it is keyed on the token): no context without it exists
    assert k["context"] is None and "every prompt drawn with the state's token there holds the state" in k["context_note"]
    parts = result["verdict"]["parts"]["without_bos"]  # the P0 circuit is the paper's in (a)-(d); its heads read the
    assert [p["status"] for p in parts.values()] == ["holds"] * 4 + ["fails"]  # direction (RMSNorm), not the norm


def test_each_circuit_is_the_plants_truth(secondary):
    from p0circuit.models.planted import build_planted
    from p0circuit.core.entries import VARIANTS

    result = secondary
    pm = build_planted(**VARIANTS["secondary"])
    p0_row, token_row = _rows(result)
    assert set(p0_row["circuit"]["nodes"]) == {n.name for n in pm.truth.writers} and p0_row["circuit"]["faithful"]
    at, layer = token_row["at"], token_row["layer"]
    truth = pm.secondary_truth(at)
    assert layer == pm.spec.secondary_at
    assert set(token_row["circuit"]["nodes"]) == {n.name for n in truth.writers}  # E@at, M2@at
    assert token_row["circuit"]["faithful"] and token_row["corruption"] == "swap"
    layer_n, neurons = pm.neurons["secondary"]
    top = max(token_row["neurons"], key=lambda n: abs(token_row["neurons"][n]))
    assert top == f"M{layer_n}.N{neurons[0]}@{at}" and token_row["neurons"][top] > 0.9  # the neuron that writes it
    assert "in which it is a sink state there" in token_row["prompt_set"]
    edges = set(token_row["circuit"]["edge_circuit"]["edges"])
    within = {e.name for e in truth.edges if e.dst.layer <= layer}  # what a metric read after block 2 can see
    assert edges == within, (edges, within)
