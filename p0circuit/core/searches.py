"""The typed records of a circuit search: :class:`NodeSearch` (the faithful node circuit,
:func:`~p0circuit.patching.circuit_search.faithful_circuit`) and :class:`EdgeSearch` (its edges,
:func:`~p0circuit.patching.circuit_edges.faithful_edges`), attached to the :class:`~p0circuit.Circuit` a search returns
(``circuit.search``, ``circuit.edge_search``). Their fields are their JSON keys, defined here once: an analysis keeps
them per onset (``analysis.json``'s ``circuit``, :class:`p0circuit.studies.analysis.passes.NodeCircuit`, adds only its
seconds and edges). Imports no torch."""

from dataclasses import dataclass, field
from typing import Any, Optional

from p0circuit.core.errors import BadInputError
from p0circuit.core.record import Record


class _Counted(Record):
    """A search record whose ``size`` counts what it keeps (the field named by ``KEPT``)."""

    KEPT = "nodes"

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes``; a new list of what it keeps is counted again unless ``size`` is given too."""
        if self.KEPT in changes and "size" not in changes:
            changes["size"] = None
        return super().replace(**changes)


@dataclass(frozen=True)
class NodeSearch(_Counted):
    """The typed record of a node circuit search (:func:`~p0circuit.patching.circuit_search.faithful_circuit`), attached
    to the :class:`~p0circuit.Circuit` it returns as ``circuit.search``; ``to_dict`` is its JSON record."""

    nodes: list[str]
    """The circuit's nodes, strongest single effect first (a node a screen left unexamined: by its estimate)."""
    candidates: int
    """Candidates searched (those that can reach the metric)."""
    faithfulness: float
    """Share of the change kept with every other candidate corrupted on the clean run."""
    denoising: Optional[float]
    """Share of the change restored by setting the circuit clean in the corrupted run (None: an ablation)."""
    completeness: float
    """Share of the change removed by corrupting the circuit alone."""
    faithful: bool
    """Within ``max_size`` nodes and at ``target`` in every direction measured."""
    why: str = ""
    """What fell short, when not ``faithful``."""
    settings: dict[str, Any] = field(default_factory=dict)
    """target, tolerance, max_size, corruption, metric, the setup's description, clean and corrupted metric,
    evaluations (and of them ``reused``: answered by an earlier search of the same result)."""
    size: Optional[int] = None
    """The circuit's nodes, counted (``len(nodes)``; None when made: counted then)."""

    def __post_init__(self) -> None:
        _counted(self, self.KEPT)

    def to_circuit(self) -> Any:
        """The circuit this search kept as the one :class:`~p0circuit.Circuit`: its nodes (and the edges, where the
        record carries an edge search, as an analysis' ``circuit`` does) with the search's measures in its settings. It
        carries no candidate's effect (a search record keeps none): ``compare`` scores its precision and recall, but
        ``prune``, ``plot`` and AUROC need the effects: take the result's circuit, or an analysis' onset row
        (:meth:`~p0circuit.studies.analysis.records.OnsetRow.to_circuit`)."""
        from p0circuit.core.circuits import searched_circuit

        edges = getattr(self, "edge_circuit", None)
        return searched_circuit(self.to_dict(), edges.to_dict() if isinstance(edges, EdgeSearch) else None)


@dataclass(frozen=True)
class EdgeSearch(_Counted):
    """The typed record of an edge search (:func:`~p0circuit.patching.circuit_edges.faithful_edges`), attached to the
    :class:`~p0circuit.Circuit` it returns as ``circuit.edge_search``; ``to_dict`` is its JSON record."""

    KEPT = "edges"

    edges: list[str]
    """The kept edges, strongest single effect first."""
    candidates: int
    """Edges searched: between the node circuit's nodes, and from each into what the metric reads."""
    faithfulness: Optional[float]
    """Share of the change kept with the other candidate edges and every node outside the circuit corrupted
    (None: not searched)."""
    completeness: Optional[float]
    """Share of the change removed by corrupting the kept edges alone (None: not searched)."""
    faithful: bool
    """``faithfulness`` reaches ``target``."""
    effects: dict[str, Optional[float]] = field(default_factory=dict)
    """Every candidate edge's normalized effect alone (path patching; None: undefined)."""
    why: str = ""
    """What fell short, when not ``faithful`` (or why nothing was searched)."""
    searched: bool = True
    """Whether the pruning ran (not with no candidate, or more than ``max_candidates``)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """target, tolerance, ``held`` (edge or node name -> why it is held as it is, never corrupted as an
    edge), the node circuit's faithfulness in this forward, evaluations, how the search ran."""
    size: Optional[int] = None
    """The kept edges, counted (``len(edges)``; None when made: counted then)."""

    def __post_init__(self) -> None:
        _counted(self, self.KEPT)


def _counted(record: Any, name: str) -> None:
    """Count what a search record keeps into its ``size`` when made without one, and refuse one whose ``size`` is not
    that count (one fact, said twice in its JSON) or whose kept names are not a list of names."""
    items = getattr(record, name)
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        raise BadInputError(f"{type(record).__name__}: {name}={items!r:.40} must be a list of names")
    if record.size is None:
        object.__setattr__(record, "size", len(items))  # (frozen: counted once, when made)
    elif isinstance(record.size, bool) or not isinstance(record.size, int) or record.size != len(items):
        raise BadInputError(f"{type(record).__name__}: size={record.size!r:.20} but it keeps {len(items)} {name}; size "
                            f"is len({name}) (leave it out and it is counted)")
