"""Circuit graphs: pruning, comparison with a ground truth, and export.

* :func:`prune` keeps nodes/edges by |effect| threshold or top-k.
* :func:`compare` gives precision and recall of a circuit's nodes and edges against a ground
  truth, and AUROC of the effect scores over every scored candidate (Mann-Whitney, ties halved).
* :func:`to_networkx`, :func:`to_dot` and :func:`to_svg` export a circuit (SVG needs Graphviz's
  ``dot`` program: ``apt-get install graphviz``).
"""

import math
import numbers
import shutil
from typing import Iterable, Mapping, Optional, Sequence

import graphviz
import networkx as nx

from p0circuit.figures.drawing import empty_note, METRIC, MISSED, colour, edge_label, fill_colour, layout, node_label, width
from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.core.args import entry_point
from p0circuit.core.types import Circuit, Edge, Node


def _finite(effects: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in effects.items() if not math.isnan(v)}


def _keep(effects: Mapping[str, float], threshold: Optional[float], top_k: Optional[int]) -> list[str]:
    if (threshold is None) == (top_k is None):
        raise ConfigError("prune needs exactly one of threshold=... or top_k=...")
    eff = _finite(effects)
    if top_k is not None:
        if top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {top_k}")
        return sorted(eff, key=lambda k: -abs(eff[k]))[:top_k]
    return [k for k, v in eff.items() if abs(v) >= threshold]  # type: ignore[operator]


@entry_point
def prune(circuit: Circuit, threshold: Optional[float] = None, top_k: Optional[int] = None) -> Circuit:
    """Keep edges (edge-level circuits) or nodes (node-level) by |effect| >= threshold or the top k."""
    settings = {**circuit.settings, "pruned": {"threshold": threshold, "top_k": top_k}}
    if circuit.level == "edge":
        edges = tuple(Edge.parse(n) for n in _keep(circuit.edge_effects, threshold, top_k))
        nodes = tuple({e.src for e in edges} | {e.dst for e in edges})
        return Circuit(nodes, edges, circuit.node_effects, circuit.edge_effects, settings)
    nodes = tuple(Node.parse(n) for n in _keep(circuit.node_effects, threshold, top_k))
    return Circuit(nodes, (), circuit.node_effects, circuit.edge_effects, settings)


@entry_point
def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (NaN if one class is empty:
    the AUROC is then undefined, e.g. a circuit that is the whole candidate set)."""
    scores, labels = list(scores), list(labels)
    if len(scores) != len(labels):
        raise BadInputError(f"auroc: {len(scores)} scores but {len(labels)} labels; give one label per score")
    if any(isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s) for s in scores):
        raise BadInputError("auroc: scores must be finite numbers; drop or fix the NaN/inf/non-numeric ones first")
    if any(type(lab).__name__ not in ("bool", "bool_") for lab in labels):
        raise BadInputError("auroc: labels must be True/False (in the circuit or not)")
    pos = [s for s, l in zip(scores, labels) if l]
    neg = [s for s, l in zip(scores, labels) if not l]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _pr(found: Iterable[str], truth: Iterable[str]) -> tuple[float, float]:
    found, truth = set(found), set(truth)
    tp = len(found & truth)
    precision = tp / len(found) if found else (1.0 if not truth else 0.0)
    recall = tp / len(truth) if truth else 1.0
    return precision, recall


@entry_point
def compare(circuit: Circuit, truth: Circuit) -> dict[str, float]:
    """Precision, recall and AUROC of ``circuit`` against ``truth`` at the circuit's level.

    A node circuit is scored over nodes (``node_precision``, ``node_recall``, ``node_auroc``), an
    edge circuit (path patching, attribution over edges) over edges (``edge_*``): the nodes an edge
    circuit touches were not chosen one by one, so scoring them would mislead. Precision and recall
    are over the circuit's members (a node circuit against the truth's :attr:`~p0circuit.Circuit.writers`,
    the nodes whose output matters; receivers only read); AUROC ranks every scored candidate by |effect| (truth items
    never scored count as missed) and is left out when the circuit carries no effects, or when the
    candidates are all in the truth or all outside it (it is then undefined).
    """
    level = circuit.level
    found, true_set, effects = ((circuit.node_names, {n.name for n in truth.writers}, circuit.node_effects) if level == "node"
                                else (circuit.edge_names, truth.edge_names, circuit.edge_effects))
    if level == "edge" and not true_set:
        raise BadInputError("compare: the circuit is over edges but the truth has no edges; compare against a "
                            "truth circuit with edges (a planted model's truth has both)")
    p, r = _pr(found, true_set)
    out: dict[str, float] = {f"{level}_precision": p, f"{level}_recall": r}
    eff = _finite(effects)
    names = sorted(set(eff) | set(true_set)) if eff else []
    labels = [n in true_set for n in names]
    if any(labels) and not all(labels):
        out[f"{level}_auroc"] = auroc([abs(eff[n]) if n in eff else -1.0 for n in names], labels)
    return out


@entry_point
def to_networkx(circuit: Circuit) -> "nx.DiGraph":
    """A DiGraph: node attributes kind/layer/head/pos/effect; edge attributes input/effect."""
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
def to_dot(circuit: Circuit, title: str = "", truth: Optional[Circuit] = None) -> str:
    """Graphviz DOT source of :func:`p0circuit.figures.drawing.layout`: one rank per stage of the forward
    pass (embeddings at the bottom, the metric node at the top, a label per rank on the left), sign
    as colour, |effect| as pen width, the receiver's input as the edge label and arrowhead, and
    ``truth`` overlaid when given; every node and edge has a tooltip with its effect."""
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
def to_svg(circuit: Circuit, title: str = "", truth: Optional[Circuit] = None) -> str:
    """SVG text of :func:`to_dot` (needs Graphviz's ``dot`` program on PATH; without it,
    :func:`p0circuit.figures.drawing.to_svg` draws the same figure with matplotlib)."""
    if shutil.which("dot") is None:
        raise BadInputError("rendering SVG needs Graphviz's 'dot' program: install it (apt-get install graphviz)")
    return graphviz.Source(to_dot(circuit, title, truth)).pipe(format="svg").decode("utf-8")
