"""A circuit's scoring, beside its type (:class:`~p0circuit.core.types.Circuit`): no plotting library needed.

* :func:`prune` keeps a circuit's nodes or edges by |effect| threshold or top-k (the one ``prune``; the
  circuit searches' ACDC-style pruning is :func:`p0circuit.patching.circuit_search.acdc_prune`).
* :func:`compare` gives precision and recall of a circuit's nodes and edges against a ground truth, and
  AUROC of the effect scores over every scored candidate (:func:`auroc`: Mann-Whitney, ties halved).
"""

import math
import numbers
from typing import Any, Iterable, Mapping, Optional, Sequence

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.core.types import AnyCircuit, Circuit, Edge, Node, as_circuit


SEARCH_MEASURES = ("faithful", "faithfulness", "denoising", "completeness", "edge_faithful", "edge_faithfulness",
                   "edge_completeness")
"""The settings a searched circuit carries from its search (:func:`searched_circuit`): true of that circuit only."""


def _finite(effects: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in effects.items() if not math.isnan(v)}


def _keep(effects: Mapping[str, float], members: frozenset[str], threshold: Optional[float],
          top_k: Optional[int]) -> list[str]:
    """Of the circuit's ``members`` (node or edge names), those kept by |effect| >= threshold or the top k: never a
    name outside them (the effects may cover every candidate patched), so a pruned circuit never grows."""
    if (threshold is None) == (top_k is None):
        raise ConfigError("prune needs exactly one of threshold=... or top_k=...")
    eff = {k: v for k, v in _finite(effects).items() if k in members}
    if top_k is not None:
        return sorted(eff, key=lambda k: -abs(eff[k]))[:top_k]
    return [k for k, v in eff.items() if abs(v) >= threshold]  # type: ignore[operator]


@entry_point
def prune(circuit: AnyCircuit, threshold: Optional[float] = None, top_k: Optional[int] = None) -> Circuit:
    """Keep the circuit's own edges (edge-level circuits) or nodes (node-level) by |effect| >= threshold or the top
    k. The result is a subset of ``circuit``: candidates outside it (their effects are kept in the circuit's
    effects) never join, and a member without an effect is dropped. ``circuit``: a :class:`Circuit`, or any circuit
    the package returns (a search's Circuit, or a PatchResult, pruned as its ``.to_circuit()``).

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> circuit = p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1").to_circuit()
        >>> sorted(p0.prune(circuit, top_k=2).node_names)
        ['A0.H0@0', 'M0@0']
    """
    circuit = as_circuit(circuit, "prune")
    # a search's measures describe the circuit it found, not a pruned part of it: they are not carried over
    settings = {**{k: v for k, v in circuit.settings.items() if k not in SEARCH_MEASURES},
                "pruned": {"threshold": threshold, "top_k": top_k}}
    if circuit.level == "edge":
        edges = tuple(Edge.parse(n) for n in _keep(circuit.edge_effects, circuit.edge_names, threshold, top_k))
        nodes = tuple({e.src for e in edges} | {e.dst for e in edges})
        return Circuit(nodes, edges, circuit.node_effects, circuit.edge_effects, settings)
    nodes = tuple(Node.parse(n) for n in _keep(circuit.node_effects, circuit.node_names, threshold, top_k))
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
def compare(circuit: AnyCircuit, truth: AnyCircuit) -> dict[str, float]:
    """Precision, recall and AUROC of ``circuit`` against ``truth`` at the circuit's level.

    A node circuit is scored over nodes (``node_precision``, ``node_recall``, ``node_auroc``), an
    edge circuit (path patching, attribution over edges) over edges (``edge_*``): the nodes an edge
    circuit touches were not chosen one by one, so scoring them would mislead. Precision and recall
    are over the circuit's members (a node circuit against the truth's :attr:`~p0circuit.Circuit.writers`,
    the nodes whose output matters; receivers only read); AUROC ranks every scored candidate by |effect| (truth items
    never scored count as missed) and is left out when the circuit carries no effects, or when the
    candidates are all in the truth or all outside it (it is then undefined). Either may be a :class:`Circuit` or any
    circuit the package returns (a search's Circuit, or a PatchResult, scored as its ``.to_circuit()``).

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> circuit = p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1").to_circuit()
        >>> p0.compare(circuit, pm.truth)
        {'node_precision': 1.0, 'node_recall': 1.0, 'node_auroc': 1.0}
    """
    circuit, truth = as_circuit(circuit, "compare"), as_circuit(truth, "compare", "truth")
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


def searched_circuit(found: Mapping[str, Any], edges: Optional[Mapping[str, Any]] = None,
                     node_effects: Mapping[str, float] = {}, *, search: Any = None, edge_search: Any = None,
                     result: Any = None, **settings: Any) -> Circuit:
    """The one :class:`Circuit` of a circuit search, from its records: ``found`` is a node circuit's
    (``faithful_circuit(...).search.to_dict()``, or the same dict in ``analysis.json``), ``edges`` its edge search's
    (``faithful_edges(...).edge_search.to_dict()``; edges held as they are, never corrupted, are drawn too). Its settings
    carry the search's numbers (faithfulness, denoising, completeness, faithful; the edges' faithfulness and
    completeness), its corruption and metric, the setup's description, and ``settings``; ``search``, ``edge_search``
    and ``result``: the typed records and the result, attached as they are (a search passes them; a record read
    back from a file has none)."""
    edges = edges or {}
    kept = list(edges.get("edges") or [])
    held = [n for n in ((edges.get("settings") or {}).get("held") or {}) if "->" in n]
    record = found.get("settings") or {}
    return Circuit(
        nodes=tuple(Node.parse(n) for n in found["nodes"]), edges=tuple(Edge.parse(n) for n in kept + held),
        node_effects=dict(node_effects), edge_effects=dict(edges.get("effects") or {}),
        settings={"method": "faithful circuit", "level": "edge" if kept else "node", "signal": True,
                  **{k: found.get(k) for k in SEARCH_MEASURES[:4]},
                  **{f"edge_{k}": edges.get(k) for k in ("faithful", "faithfulness", "completeness") if edges},
                  **{k: record[k] for k in ("corruption", "metric", "setup") if k in record}, **settings},
        search=search, edge_search=edge_search, result=result)
