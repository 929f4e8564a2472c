"""Circuit graphs: export. (Pruning and scoring against a ground truth live beside the circuit type, in
:mod:`p0circuit.core.circuits`, and need no plotting library.)

* :func:`to_networkx`, :func:`to_dot` and :func:`to_svg` export a circuit (SVG needs Graphviz's
  ``dot`` program: ``apt-get install graphviz``).
"""

import math
import shutil
from typing import Optional

import graphviz
import networkx as nx

from p0circuit.figures.drawing import empty_note, METRIC, MISSED, colour, edge_label, fill_colour, layout, node_label, width
from p0circuit.core.circuits import auroc, compare, prune  # noqa: F401  (their former home: still importable here)
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.core.types import AnyCircuit, as_circuit


@entry_point
def to_networkx(circuit: AnyCircuit) -> "nx.DiGraph":
    """A DiGraph: node attributes kind/layer/head/pos/effect; edge attributes input/effect (``circuit``: any circuit
    the package returns, drawn as its ``.to_circuit()``)."""
    circuit = as_circuit(circuit, "to_networkx")
    g = nx.DiGraph(**{k: v for k, v in circuit.settings.items() if isinstance(v, (str, int, float, bool))})
    for n in circuit.nodes:
        g.add_node(n.name, kind=n.kind.value, layer=n.layer, head=n.head, pos=str(n.pos),
                   effect=circuit.node_effects.get(n.name, math.nan))
    for e in circuit.edges:
        g.add_edge(e.src.name, e.dst.name, input=e.input.value, effect=circuit.edge_effects.get(e.name, math.nan))
    return g


ARROWHEAD = {"q": "normal", "k": "diamond", "v": "dot", "mlp": "vee", "resid": "normal", "": "normal"}
"""Graphviz arrowheads by the receiver's input, beside the edge's label."""


@entry_point
def to_dot(circuit: AnyCircuit, title: str = "", truth: Optional[AnyCircuit] = None) -> str:
    """Graphviz DOT source of :func:`p0circuit.figures.drawing.layout`: one rank per stage of the forward
    pass (embeddings at the bottom, the metric node at the top, a label per rank on the left), sign
    as colour, |effect| as pen width, the receiver's input as the edge label and arrowhead, and
    ``truth`` overlaid when given; every node and edge has a tooltip with its effect. Either may be any circuit the
    package returns, drawn as its ``.to_circuit()``."""
    circuit = as_circuit(circuit, "to_dot")
    lay = layout(circuit, truth, title)
    dot = graphviz.Digraph("circuit", graph_attr={"rankdir": "BT", "newrank": "true", "label": lay.title,
                                                  "labelloc": "t", "fontsize": "11", "nodesep": "0.3"},
                           node_attr={"fontsize": "10", "style": "rounded,filled", "shape": "box"})
    rows: dict[float, list] = {}
    for p in lay.nodes:
        rows.setdefault(p.y, []).append(p)
    for i, (y, label) in enumerate(lay.ranks):
        with dot.subgraph(name=f"rank{i}") as sub:
            sub.attr(rank="same")
            sub.node(f"rank_{i}", label, shape="plaintext", style="", fontcolor="#666666")
            for p in rows.get(y, []):
                missed = p.status in ("missed", "untested")
                tip = p.name + ("" if p.effect is None else f": effect {p.effect:+.3f}") + f" ({p.status})"
                sub.node(p.name, node_label(p).replace("\n", "\\n"), tooltip=tip, id=f"node:{p.name}",
                         fillcolor="#f0f0f0" if missed else "#fff7e0" if p.name == METRIC else fill_colour(p.effect, lay.bound),
                         color=MISSED if missed else "#222222", fontcolor=MISSED if missed else "#111111",
                         penwidth="2.4" if p.status == "match" else "1",
                         style={"extra": "rounded,filled,dotted", "missed": "rounded,filled,dashed",
                                "untested": "rounded,filled,dotted"}.get(p.status,
                                                                                                      "rounded,filled"))
        if i:
            dot.edge(f"rank_{i - 1}", f"rank_{i}", style="invis")
    for link in lay.links:
        missed = link.status in ("missed", "untested")
        tip = link.name + ("" if link.effect is None else f": effect {link.effect:+.3f}")
        dot.edge(link.src, link.dst, label=edge_label(link), tooltip=tip, id=f"edge:{link.name}",
                 color=MISSED if missed else colour(link.effect), penwidth=f"{width(link.effect, lay.bound):.2f}",
                 arrowhead=ARROWHEAD[link.input], fontsize="9",
                 style="dotted" if link.status == "untested" else "dashed" if missed or link.effect is None else "solid")
    if not circuit.nodes and not circuit.edges:
        dot.attr(label=f"{lay.title}\\n{empty_note(circuit)}")
    return dot.source


GRAPHVIZ_MISSING = ("Graphviz's 'dot' program is not installed: the circuit SVGs are drawn by matplotlib instead of "
                    "Graphviz (apt-get install graphviz for its layout, or render the .dot files elsewhere)")
"""What the command line says, once, when it skips SVG."""


@entry_point
def to_svg(circuit: AnyCircuit, title: str = "", truth: Optional[AnyCircuit] = None) -> str:
    """SVG text of :func:`to_dot` (needs Graphviz's ``dot`` program on PATH; without it,
    :func:`p0circuit.figures.drawing.to_svg` draws the same figure with matplotlib)."""
    if shutil.which("dot") is None:
        raise BadInputError("rendering SVG needs Graphviz's 'dot' program: install it (apt-get install graphviz)")
    return graphviz.Source(to_dot(circuit, title, truth)).pipe(format="svg").decode("utf-8")
