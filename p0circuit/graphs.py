"""Circuit graphs: pruning, comparison with a ground truth, and export.

* :func:`prune` keeps nodes/edges by |effect| threshold or top-k.
* :func:`compare` gives precision and recall of a circuit's nodes and edges against a ground
  truth, and AUROC of the effect scores over every scored candidate (Mann-Whitney, ties halved).
* :func:`to_networkx`, :func:`to_dot` and :func:`to_svg` export a circuit (SVG needs Graphviz's
  ``dot`` program: ``apt-get install graphviz``).
"""

import math
import shutil
from typing import Iterable, Mapping, Optional, Sequence

import graphviz
import networkx as nx

from p0circuit.errors import BadInputError, ConfigError
from p0circuit.types import Circuit, Edge, Node


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


def prune(circuit: Circuit, threshold: Optional[float] = None, top_k: Optional[int] = None) -> Circuit:
    """Keep edges (edge-level circuits) or nodes (node-level) by |effect| >= threshold or the top k."""
    settings = {**circuit.settings, "pruned": {"threshold": threshold, "top_k": top_k}}
    if circuit.level == "edge":
        edges = tuple(Edge.parse(n) for n in _keep(circuit.edge_effects, threshold, top_k))
        nodes = tuple({e.src for e in edges} | {e.dst for e in edges})
        return Circuit(nodes, edges, circuit.node_effects, circuit.edge_effects, settings)
    nodes = tuple(Node.parse(n) for n in _keep(circuit.node_effects, threshold, top_k))
    return Circuit(nodes, (), circuit.node_effects, circuit.edge_effects, settings)


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (NaN if one class is empty)."""
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


def compare(circuit: Circuit, truth: Circuit) -> dict[str, float]:
    """Precision, recall and AUROC of ``circuit`` against ``truth``, for nodes and for edges.

    Node AUROC scores every candidate in ``circuit.node_effects`` by |effect|; edge AUROC uses
    ``circuit.edge_effects``. Truth items never scored count as missed (score -inf).
    """
    out: dict[str, float] = {}
    for level, found, true_set, effects in (
        ("node", circuit.node_names, truth.node_names, circuit.node_effects),
        ("edge", circuit.edge_names, truth.edge_names, circuit.edge_effects),
    ):
        p, r = _pr(found, true_set)
        out[f"{level}_precision"], out[f"{level}_recall"] = p, r
        eff = _finite(effects)
        names = sorted(set(eff) | set(true_set)) if eff else []
        scores = [abs(eff[n]) if n in eff else -math.inf for n in names]
        out[f"{level}_auroc"] = auroc(scores, [n in true_set for n in names])
    return out


def to_networkx(circuit: Circuit) -> "nx.DiGraph":
    """A DiGraph: node attributes kind/layer/head/pos/effect; edge attributes input/effect."""
    g = nx.DiGraph(**{k: v for k, v in circuit.settings.items() if isinstance(v, (str, int, float, bool))})
    for n in circuit.nodes:
        g.add_node(n.name, kind=n.kind.value, layer=n.layer, head=n.head, pos=str(n.pos),
                   effect=circuit.node_effects.get(n.name, math.nan))
    for e in circuit.edges:
        g.add_edge(e.src.name, e.dst.name, input=e.input.value, effect=circuit.edge_effects.get(e.name, math.nan))
    return g


def to_dot(circuit: Circuit, title: str = "") -> str:
    """Graphviz DOT source: one row per layer, edges labelled with the receiver input and effect."""
    dot = graphviz.Digraph("circuit", graph_attr={"rankdir": "BT", "label": title or _title(circuit)})
    for n in circuit.nodes:
        eff = circuit.node_effects.get(n.name)
        label = n.name if eff is None or math.isnan(eff) else f"{n.name}\n{eff:+.2f}"
        shape = "box" if n.kind.value in ("mlp", "embed", "pos_embed") else "ellipse"
        dot.node(n.name, label, shape=shape)
    for e in circuit.edges:
        eff = circuit.edge_effects.get(e.name)
        label = e.input.value if eff is None or math.isnan(eff) else f"{e.input.value} {eff:+.2f}"
        dot.edge(e.src.name, e.dst.name, label=label)
    return dot.source


def _title(circuit: Circuit) -> str:
    s = circuit.settings
    return " ".join(f"{k}={s[k]}" for k in ("method", "corruption", "metric") if k in s)


def to_svg(circuit: Circuit, title: str = "") -> str:
    """SVG text of :func:`to_dot` (needs Graphviz's ``dot`` program on PATH)."""
    if shutil.which("dot") is None:
        raise BadInputError("rendering SVG needs Graphviz's 'dot' program: install it (apt-get install graphviz)")
    return graphviz.Source(to_dot(circuit, title)).pipe(format="svg").decode("utf-8")
