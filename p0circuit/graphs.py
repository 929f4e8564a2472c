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

from p0circuit.errors import BadInputError, ConfigError, entry_point
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


@entry_point
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


GRAPHVIZ_MISSING = ("Graphviz's 'dot' program is not installed: the circuits are written as JSON and DOT, without "
                    "SVG (apt-get install graphviz, or render the .dot files elsewhere)")
"""What the command line says, once, when it skips SVG."""


@entry_point
def to_svg(circuit: Circuit, title: str = "") -> str:
    """SVG text of :func:`to_dot` (needs Graphviz's ``dot`` program on PATH)."""
    if shutil.which("dot") is None:
        raise BadInputError("rendering SVG needs Graphviz's 'dot' program: install it (apt-get install graphviz)")
    return graphviz.Source(to_dot(circuit, title)).pipe(format="svg").decode("utf-8")
