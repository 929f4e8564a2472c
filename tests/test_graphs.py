import math

import networkx as nx
import pytest
import shutil

import p0circuit as p0
from p0circuit import Circuit, ConfigError, Edge, Node
from p0circuit import faithfulness_curve

from conftest import random_tokens


def test_auroc_by_hand():
    assert p0.auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert p0.auroc([0.1, 0.9], [True, False]) == 0.0
    assert p0.auroc([0.5, 0.5, 0.1], [True, False, False]) == pytest.approx(0.75)  # one tie, one win
    assert math.isnan(p0.auroc([0.1], [True]))


def test_compare_by_hand():
    truth = Circuit(nodes=(Node.parse("A0.H0@0"), Node.parse("M0@0")))
    found = Circuit(nodes=(Node.parse("A0.H0@0"), Node.parse("M2@0")),
                    node_effects={"A0.H0@0": 0.9, "M2@0": 0.5, "M0@0": 0.4, "M1@0": 0.1})
    s = p0.compare(found, truth)
    assert s["node_precision"] == 0.5 and s["node_recall"] == 0.5
    assert s["node_auroc"] == pytest.approx(3 / 4)  # truth scores 0.9, 0.4 vs 0.5, 0.1
    assert set(s) == {"node_precision", "node_recall", "node_auroc"}  # a node circuit is scored over nodes only


def test_prune_and_exports():
    e1 = Edge.parse("A0.H0@0->M0@0.mlp_in")
    e2 = Edge.parse("M0@0->M1@0.mlp_in")
    e3 = Edge.parse("M0@0->A1.H0@0.k")
    c = Circuit(nodes=(), edges=(e1, e2, e3), edge_effects={e1.name: 0.9, e2.name: 0.05, e3.name: -0.5,
                                                            "M1@0->A2.H0@0.q": 0.95}, settings={"method": "path"})
    assert p0.prune(c, threshold=0.4).edge_names == {e1.name, e3.name}  # never the candidate outside the circuit
    assert p0.prune(c, top_k=1).edge_names == {e1.name}
    assert p0.prune(c, top_k=5).edge_names == c.edge_names  # a circuit of 3 pruned to 5 stays 3: prune never grows
    with pytest.raises(ConfigError, match="exactly one of threshold"):
        p0.prune(c)
    pruned = p0.prune(c, threshold=0.4)
    g = p0.to_networkx(pruned)
    assert isinstance(g, nx.DiGraph) and g.has_edge("A0.H0@0", "M0@0") and g.edges["M0@0", "A1.H0@0"]["input"] == "k"
    dot = p0.to_dot(pruned)
    assert '"A0.H0@0" -> "M0@0"' in dot and "mlp +0.90" in dot
    assert Circuit.from_json(pruned.to_json()) == pruned


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (.ci/run installs it)")
def test_svg(planted):
    svg = p0.to_svg(planted.truth)
    assert svg.lstrip().startswith("<?xml") and "A0.H0@0" in svg and "<svg" in svg


def test_discovered_circuit_round_trips(planted):
    toks = random_tokens(8, 24, 32, seed=0)
    c = p0.discover(planted.model, toks, method="path", corruption="shift", metric=p0.AttnToP0(heads=list(planted.sink_heads)))
    again = Circuit.from_json(c.to_json())
    assert again.edge_names == c.edge_names and again.edge_effects == c.edge_effects
    assert again.settings["corruption"] == "shift"


def test_faithfulness_curve(planted):
    toks = random_tokens(8, 24, 32, seed=1)
    toks = toks[p0.p0_like_positions(toks)[:, 1:].sum(1) == 0]
    metric = p0.AttnToP0(heads=list(planted.sink_heads))
    result = p0.path_patch(planted.model, toks, corruption="pos_mean", metric=metric)
    curve = faithfulness_curve(result, fractions=(0.0, 0.01, 0.02, 1.0))
    (f0, k0, v0), (_, k1, v1), (_, k2, v2), (_, _, v3) = curve
    assert k0 == 0 and v0 == pytest.approx(0.0, abs=1e-3)     # everything corrupted
    assert k1 == 3 and 0.3 < v1 < 0.7  # three of four planted edges: one sink head keeps its key
    assert k2 >= 4 and v2 == pytest.approx(1.0, abs=1e-3)      # the planted edges are sufficient
    assert v3 == pytest.approx(1.0)
    with pytest.raises(p0.BadInputError, match="another setup"):
        faithfulness_curve(result, setup=p0.Setup.of(planted.model, toks, corruption="shift", metric=metric))


def test_only_candidates_are_drawn_as_missed_and_an_empty_circuit_says_why(planted):
    """A truth edge that was never a candidate (the plant's amplifier into a sink head's key, when the
    candidates end at the metric's block) is no miss: it is drawn grey dotted as never a candidate; a
    truth edge that was a candidate and not found is drawn as missed."""
    from p0circuit.figures.drawing import empty_note, layout
    from p0circuit.figures.graphs import to_dot

    truth = planted.truth
    into_keys = [e for e in truth.edges if e.input.value == "k"]
    inside = [e for e in truth.edges if e.input.value != "k"]
    assert into_keys and inside
    found, missed = inside[:1], inside[1:]
    scored = {e.name: 0.9 for e in found} | {e.name: 0.01 for e in missed}
    circuit = Circuit(nodes=tuple({n for e in found for n in (e.src, e.dst)}), edges=tuple(found), edge_effects=scored,
                      settings={"threshold": 0.1, "signal": True})
    status = {l.name: l.status for l in layout(circuit, truth).links}
    assert all(status[e.name] == "untested" for e in into_keys)
    assert all(status[e.name] == "missed" for e in missed) and all(status[e.name] == "match" for e in found)
    dot = to_dot(circuit, truth=truth)
    assert dot.count("style=dotted") >= len(into_keys)
    empty = Circuit(nodes=(), edges=(), edge_effects=scored, settings={"threshold": 0.1, "signal": True})
    assert empty_note(empty) == f"empty: none of the {len(scored)} candidates passed |effect| >= 0.1"
    assert "none of the" in to_dot(empty)
    quiet = Circuit(nodes=(), edges=(), settings={"signal": False, "message": "no change"})
    assert empty_note(quiet) == "empty: no signal (no change)"
