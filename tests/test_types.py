import pytest

from p0circuit import BadInputError, Circuit, Edge, Input, Kind, Node


def test_node_names_round_trip():
    nodes = [
        Node(Kind.HEAD, 0, 1, 0), Node(Kind.MLP, 3, pos="rest"), Node(Kind.EMBED, pos=0),
        Node(Kind.POS_EMBED, pos=1), Node(Kind.RESID, 2, pos=0),
    ]
    names = [n.name for n in nodes]
    assert names == ["A0.H1@0", "M3@rest", "E@0", "PE@1", "R2@0"]
    assert [Node.parse(s) for s in names] == nodes


def test_edge_names_round_trip():
    e = Edge(Node(Kind.MLP, 1, pos=0), Node(Kind.HEAD, 2, 0, 0), Input.K)
    assert e.name == "M1@0->A2.H0@0.k"
    assert Edge.parse(e.name) == e


@pytest.mark.parametrize("bad", ["X1@0", "A0@0", "M1", "A0.H1@-1", "M@0", "E1@0"])
def test_bad_node_names_say_what_is_expected(bad):
    with pytest.raises(BadInputError, match="expected e.g."):
        Node.parse(bad)


def test_invalid_nodes_and_edges():
    with pytest.raises(BadInputError, match="head index is required"):
        Node(Kind.HEAD, 0)
    with pytest.raises(BadInputError, match="non-negative int or 'rest'"):
        Node(Kind.MLP, 0, pos=-1)
    with pytest.raises(BadInputError, match="only heads and key/value heads have a k input"):
        Edge(Node(Kind.MLP, 0), Node(Kind.MLP, 1), Input.K)


def test_circuit_json_round_trip():
    a, m = Node(Kind.HEAD, 0, 0, 0), Node(Kind.MLP, 0, pos=0)
    c = Circuit(nodes=(m, a, m), edges=(Edge(a, m, Input.MLP),), node_effects={a.name: 0.9},
                settings={"method": "test"})
    assert len(c.nodes) == 2  # deduplicated and sorted
    c2 = Circuit.from_json(c.to_json())
    assert c2 == c
    assert c2.node_names == {"A0.H0@0", "M0@0"}


def test_circuit_prints_effects_with_enough_digits():
    a, m = Node(Kind.HEAD, 0, 1, 0), Node(Kind.MLP, 1, pos=0)
    c = Circuit((a, m), node_effects={a.name: 0.09962, m.name: -0.41071},
                settings={"method": "activation", "metric": "norm_ratio@L2", "threshold": 0.1})
    text = str(c)
    assert "A0.H1@0  +0.09962" in text and "M1@0  -0.4107" in text  # +0.100 would hide the miss of 0.1
    assert "method=activation" in text and "threshold=0.1" in text
