import math

import networkx as nx
import numpy as np
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


# ---- every circuit the package returns: scored, pruned and drawn as its own .to_circuit() ------------------------

RETURNED = ("Circuit", "PatchResult", "faithful_circuit", "faithful_edges")
"""The circuits the package returns: the one type (a result's ``.to_circuit()``, and what the two searches return,
their search records attached), and a result itself (its ``.to_circuit()``)."""


@pytest.fixture(scope="module")
def returned(planted):
    """The planted truth, and each circuit the package returns, from one activation-patching run."""
    tokens = p0.probe_tokens(planted.model, 8, 16, seed=0, regular=True)
    result = p0.activation_patch(planted.model, tokens, corruption="shift", metric="norm_ratio:1")
    found = p0.faithful_circuit(result)
    return planted.truth, {"Circuit": result.to_circuit(), "PatchResult": result, "faithful_circuit": found,
                           "faithful_edges": p0.faithful_edges(found)}


def _graph(g: nx.DiGraph) -> str:
    """A graph's attributes as text (a NaN effect equals itself here)."""
    return repr((g.graph, list(g.nodes(data=True)), list(g.edges(data=True))))


def _heatmaps(fig) -> list:
    return [(ax.get_title(), ax.images[0].get_array().filled(np.nan)) for ax in fig.axes if ax.images]


@pytest.mark.parametrize("kind", RETURNED)
def test_every_circuit_the_package_returns_is_taken_as_its_to_circuit(returned, kind):
    """compare, prune and the figures give for each circuit the package returns what they give for its
    ``.to_circuit()``, taken by hand (as ``circuit`` and as ``truth``)."""
    from p0circuit.figures.drawing import layout

    truth, made = returned
    given = made[kind]
    # a search's Circuit is taken as the same circuit without its search records (read back from its JSON)
    by_hand = Circuit.from_json(given.to_json()) if isinstance(given, Circuit) else given.to_circuit()
    if kind.startswith("faithful"):
        assert given.search is not None and (given.edge_search is not None) == (kind == "faithful_edges")
        assert by_hand.search is None and by_hand == given  # the records are no part of the circuit's equality
    assert p0.compare(given, truth) == p0.compare(by_hand, truth)
    assert p0.compare(made["Circuit"], given) == p0.compare(made["Circuit"], by_hand)  # as the truth
    for how in ({"top_k": 2}, {"threshold": 0.1}):
        assert p0.prune(given, **how).to_json() == p0.prune(by_hand, **how).to_json()
    assert p0.to_dot(given, "t", given) == p0.to_dot(by_hand, "t", by_hand)
    assert _graph(p0.to_networkx(given)) == _graph(p0.to_networkx(by_hand))
    assert layout(given, truth) == layout(by_hand, truth)
    figure = p0.circuit_figure(given, given)
    assert figure.circuit.to_json() == by_hand.to_json() == figure.truth.to_json()
    if kind != "PatchResult":  # a patching result is plotted as it is (every candidate), as before
        for (title, grid), (title_by_hand, grid_by_hand) in zip(_heatmaps(p0.plot(given)), _heatmaps(p0.plot(by_hand)),
                                                                strict=True):
            assert title == title_by_hand
            np.testing.assert_array_equal(grid, grid_by_hand)


@pytest.mark.parametrize("bad", [[], {}, None, "circuit"], ids=["a list", "a dict", "None", "a string"])
def test_what_is_no_circuit_is_refused_naming_the_argument(returned, bad):
    truth, _ = returned
    calls = [("compare", "circuit", lambda: p0.compare(bad, truth)), ("compare", "truth", lambda: p0.compare(truth, bad)),
             ("prune", "circuit", lambda: p0.prune(bad, top_k=1)), ("to_dot", "circuit", lambda: p0.to_dot(bad)),
             ("to_networkx", "circuit", lambda: p0.to_networkx(bad)), ("to_svg", "circuit", lambda: p0.to_svg(bad)),
             ("circuit_figure", "circuit", lambda: p0.circuit_figure(bad)), ("plot", "result", lambda: p0.plot(bad))]
    if bad is not None:  # no truth is a valid truth
        calls += [("to_dot", "truth", lambda: p0.to_dot(truth, truth=bad)),
                  ("circuit_figure", "truth", lambda: p0.circuit_figure(truth, bad))]
    for where, name, call in calls:
        with pytest.raises(p0.BadInputError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{where}: {name}="), message
        assert "PatchResult" in message and ".to_circuit()" in message and "faithful_circuit" in message, message


def test_a_to_circuit_that_gives_no_circuit_is_refused(returned):
    """The one conversion (:func:`p0circuit.core.types.as_circuit`) holds what ``.to_circuit()`` gives, and a class
    (it has the method, but is no circuit) is refused, not called."""
    truth, _ = returned

    class Odd:
        def to_circuit(self):
            return "not a circuit"

    with pytest.raises(p0.BadInputError, match=r"compare: circuit is an object \(Odd\) whose \.to_circuit\(\) returned str"):
        p0.compare(Odd(), truth)
    with pytest.raises(p0.BadInputError, match=r"prune: circuit is the class PatchResult, not a circuit"):
        p0.prune(p0.PatchResult, top_k=1)
