"""Which candidates a discovery patches, within its budgets: the nodes that can reach the metric (refused
past the node budget, with how to narrow them) and the candidate edges (from a node pass's nodes past the
edge budget). Discovery (:mod:`p0circuit.studies.discovery.session`) asks here and never reads the
engine's reachability or the sites itself."""

from typing import Any, Callable, Optional, Sequence

from p0circuit.core.errors import ConfigError
from p0circuit.core.types import Edge, Node
from p0circuit.patching.edges import among, candidate_edges
from p0circuit.patching.engine import reaches, stop_layer
from p0circuit.patching.metrics import PatchMetric
from p0circuit.patching.sites import candidate_nodes, site_of


def live_nodes(model: Any, metric: PatchMetric, nodes: Optional[Sequence[Node]], node_budget: int) -> list[Node]:
    """The candidate nodes (``nodes``, else every one) that can reach ``metric``; more than ``node_budget``
    is refused before any forward, saying how to narrow them (exact patching costs a suffix forward each)."""
    candidates = list(nodes) if nodes is not None else candidate_nodes(model)
    live = [n for n in candidates if reaches(model, site_of(n, model).hook, metric)]
    if len(live) > node_budget:
        raise ConfigError(
            f"{len(live)} candidate nodes can reach metric {metric.name!r}, more than the node budget of {node_budget}: "
            "narrow them (--layers, --nodes), read the metric at an earlier layer, screen with method 'triage', "
            "or raise the budget (--node-budget)"
        )
    return live


def edges_within(model: Any, metric: PatchMetric, nodes: Optional[Sequence[Node]], edge_budget: int,
                 node_pass: Callable[[], Any]) -> tuple[list[Edge], str]:
    """The candidate edges of an edge-level method and how they were chosen: every edge from a candidate node
    into a receiver that can reach ``metric`` (receivers among ``nodes`` when given); past ``edge_budget``,
    the edges from the nodes ``node_pass()`` keeps (a node-level circuit: an activation pass)."""
    senders = list(nodes) if nodes is not None else candidate_nodes(model)
    stop = stop_layer(model, metric)

    def within(edges: list[Edge]) -> list[Edge]:
        return edges if nodes is None else among(model, edges, list(nodes))

    edges = within(candidate_edges(model, senders, receiver_layers=stop, metric=metric))
    if len(edges) <= edge_budget:
        return edges, f"{len(edges)} candidate edges"
    kept = node_pass()
    # a receiver need not matter as a node: the sink heads' outputs do not change their own attention
    edges = within(candidate_edges(model, sorted(kept.nodes), receiver_layers=stop, metric=metric))
    return edges, (f"{len(edges)} edges from the {len(kept.nodes)} nodes of an activation pass (the full set would "
                   f"exceed the edge budget of {edge_budget})")
