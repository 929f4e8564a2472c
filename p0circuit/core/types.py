"""The nouns of p0circuit: nodes, edges and circuits.

A *node* is one component of a hooked transformer at one class of positions (position 0, some
other single position, or "rest", all other positions together): the P0-sink circuit is
position-specific, so the same head at position 0 and elsewhere are different nodes.
An *edge* is a sender node writing into one input of a receiver node (a head's query, key or value
input, an MLP's input, or the residual stream). A *circuit* is a set of nodes and edges with the
effect sizes and settings that produced it. Names are derived from fields, never stored twice.
"""

import enum
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Union

from p0circuit.core.io import strict
from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.core.record import SCHEMA, Record
from p0circuit.core.args import check_value, entry_point

Pos = Union[int, str]
"""A position class: a non-negative index, or ``"rest"`` (all positions not named otherwise)."""

REST = "rest"
NODE_HINT = "expected e.g. 'A0.H1@0', 'M1@rest', 'M1.N507@0', 'M1.E3@0', 'A2.KV1@0', 'E@0', 'PE@0' or 'R2@0'"
"""What a node's name looks like (every refusal of one says it)."""


def one_spelling(given: str, parsed: Any, what: str) -> Any:
    """``parsed`` (a :class:`Node` or :class:`Edge` read from ``given``) when ``given`` is the one spelling
    p0circuit writes (its ``name``), else an error naming both. Python's ``int`` also reads ``'+0'``, ``' 1'``,
    ``'01'`` and non-ASCII digits (``'\\u0663'``): read by it alone a name has many spellings, and two of them
    would be two keys of one node in a circuit's effects."""
    if given == parsed.name:
        return parsed
    shown = given.encode("ascii", "backslashreplace").decode()
    raise BadInputError(f"{what} name {shown!r} is not spelled as p0circuit writes names (ASCII digits, no sign, space "
                        f"or leading zero): write {parsed.name!r}")


class Kind(str, enum.Enum):
    """Which component a node is."""

    EMBED = "embed"
    """The token embedding."""
    POS_EMBED = "pos_embed"
    """The learned position embedding (only models with ``pos="learned"``)."""
    HEAD = "head"
    """One attention head's output (after W_O)."""
    MLP = "mlp"
    """One block's MLP output."""
    RESID = "resid"
    """The residual stream leaving a block (``resid_post``)."""
    KV_HEAD = "kv_head"
    """A key/value head of grouped-query attention, shared by a group of query heads: only a
    receiver of key and value edges (``A2.KV1@0.k``), since its keys and values are computed once
    for the whole group."""
    NEURON = "neuron"
    """One MLP neuron: its activation after the nonlinearity (``M1.N507@0``); it writes its
    activation times its row of ``W_out`` into the residual stream."""
    EXPERT = "expert"
    """One expert of a mixture-of-experts MLP (``M1.E3@0``): its routed, weighted contribution
    to the MLP output (zero at a position the router does not send to it)."""


class Input(str, enum.Enum):
    """Which input of a receiver node an edge writes into."""

    Q = "q"
    """A head's query input."""
    K = "k"
    """A head's key input."""
    V = "v"
    """A head's value input."""
    MLP = "mlp_in"
    """An MLP's input."""
    RESID = "resid"
    """The residual stream itself (read by everything downstream)."""


_SHORT = {Kind.EMBED: "E", Kind.POS_EMBED: "PE", Kind.HEAD: "A", Kind.MLP: "M", Kind.RESID: "R", Kind.KV_HEAD: "A",
          Kind.NEURON: "M", Kind.EXPERT: "M"}
_FROM_SHORT = {"E": Kind.EMBED, "PE": Kind.POS_EMBED, "M": Kind.MLP, "R": Kind.RESID}


def _check_pos(pos: Pos) -> None:
    if isinstance(pos, bool) or not (
        (isinstance(pos, int) and pos >= 0) or pos == REST
    ):
        raise BadInputError(
            f"node position must be a non-negative int or {REST!r}, got {pos!r}"
        )


@entry_point
@dataclass(frozen=True)
class Node:
    """One component at one position class."""

    kind: Kind
    """The component kind."""
    layer: int = -1
    """Block index; -1 for embeddings."""
    head: int = -1
    """Head index for ``Kind.HEAD``; -1 otherwise."""
    pos: Pos = 0
    """Position class: an index or ``"rest"``."""
    neuron: int = -1
    """Index inside the MLP: the neuron of ``Kind.NEURON``, the expert of ``Kind.EXPERT``; -1 otherwise."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        _check_pos(self.pos)
        for name in ("layer", "head", "neuron"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInputError(f"Node.{name} must be an int, got {value!r}")
        if self.kind in (Kind.EMBED, Kind.POS_EMBED):
            if self.layer != -1 or self.head != -1:
                raise BadInputError(f"{self.kind.value} nodes take no layer or head")
        elif self.layer < 0:
            raise BadInputError(f"{self.kind.value} nodes need a layer >= 0, got {self.layer}")
        if (self.kind in (Kind.HEAD, Kind.KV_HEAD)) != (self.head >= 0):
            raise BadInputError(
                "a head index is required for head and kv_head nodes and forbidden for other kinds; "
                f"got kind={self.kind.value}, head={self.head}"
            )
        if (self.kind in (Kind.NEURON, Kind.EXPERT)) != (self.neuron >= 0):
            raise BadInputError(
                "a neuron (or expert) index is required for neuron and expert nodes and forbidden for other kinds; "
                f"got kind={self.kind.value}, neuron={self.neuron}"
            )

    def sort_key(self) -> tuple:
        """Forward order: layer, then heads before MLPs, then position (indices before "rest")."""
        kind_rank = list(Kind).index(self.kind)
        pos_key = (0, self.pos) if isinstance(self.pos, int) else (1, 0)
        return (self.layer, kind_rank, self.head, self.neuron, pos_key)

    def __lt__(self, other: "Node") -> bool:
        return self.sort_key() < other.sort_key()

    @property
    def component(self) -> str:
        """Name without the position, e.g. ``A0.H1``, ``M1``, ``E``."""
        short = _SHORT[self.kind]
        if self.kind in (Kind.EMBED, Kind.POS_EMBED):
            return short
        if self.kind == Kind.HEAD:
            return f"A{self.layer}.H{self.head}"
        if self.kind == Kind.KV_HEAD:
            return f"A{self.layer}.KV{self.head}"
        if self.kind == Kind.NEURON:
            return f"M{self.layer}.N{self.neuron}"
        if self.kind == Kind.EXPERT:
            return f"M{self.layer}.E{self.neuron}"
        return f"{short}{self.layer}"

    @property
    def name(self) -> str:
        """Full name, e.g. ``A0.H1@0`` or ``M2@rest``."""
        return f"{self.component}@{self.pos}"

    def at(self, pos: Pos) -> "Node":
        """The same component at another position class."""
        return Node(self.kind, self.layer, self.head, pos, self.neuron)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> "Node":
        """Inverse of :attr:`name`; raises a clear error for malformed names. A name has one spelling, the one
        :attr:`name` writes (ASCII digits, no sign, space or leading zero): ``'A+0.H0@0'``, ``'M 1@0'``,
        ``'A01.H0@0'`` or a name with non-ASCII digits is refused, naming the spelling meant.

        Example::

            >>> from p0circuit import Node
            >>> node = Node.parse("A2.H0@0")          # block 2's head 0 at position 0
            >>> node.layer, node.head, node.pos, node.name
            (2, 0, 0, 'A2.H0@0')
        """
        if not isinstance(name, str):
            raise BadInputError(f"a node is a Node or its name, got {name!r:.60} ({type(name).__name__}); {NODE_HINT}")
        return one_spelling(name, cls._read(name), "node")

    @classmethod
    def _read(cls, name: str) -> "Node":
        """The node a name reads as (any spelling Python's ``int`` takes); :meth:`parse` holds it to one spelling."""
        hint = NODE_HINT
        try:
            comp, pos_s = name.split("@")
            pos: Pos = int(pos_s) if pos_s.isdigit() else pos_s
            if comp in ("E", "PE"):
                return cls(_FROM_SHORT[comp], pos=pos)
            if comp.startswith("A") and ".KV" in comp:
                layer_s, head_s = comp[1:].split(".KV")
                return cls(Kind.KV_HEAD, int(layer_s), int(head_s), pos)
            if comp.startswith("A"):
                layer_s, head_s = comp[1:].split(".H")
                return cls(Kind.HEAD, int(layer_s), int(head_s), pos)
            if comp.startswith("M") and ".E" in comp:
                layer_s, expert_s = comp[1:].split(".E")
                return cls(Kind.EXPERT, int(layer_s), pos=pos, neuron=int(expert_s))
            if comp.startswith("M") and ".N" in comp:
                layer_s, neuron_s = comp[1:].split(".N")
                return cls(Kind.NEURON, int(layer_s), pos=pos, neuron=int(neuron_s))
            if comp[0] in ("M", "R"):
                return cls(_FROM_SHORT[comp[0]], int(comp[1:]), pos=pos)
        except (ValueError, KeyError, IndexError):
            pass
        raise BadInputError(f"unknown node name {name!r}; {hint}")


@entry_point
@dataclass(frozen=True, order=True)
class Edge:
    """A sender node writing into one input of a receiver node."""

    src: Node
    """The sender."""
    dst: Node
    """The receiver."""
    input: Input = Input.RESID
    """Which input of the receiver is fed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", Input(self.input))
        if self.input == Input.Q and self.dst.kind != Kind.HEAD:
            raise BadInputError(f"only query heads have a q input, not {self.dst}")
        if self.input in (Input.K, Input.V) and self.dst.kind not in (Kind.HEAD, Kind.KV_HEAD):
            raise BadInputError(f"only heads and key/value heads have a {self.input.value} input, not {self.dst}")
        if self.dst.kind == Kind.KV_HEAD and self.input not in (Input.K, Input.V):
            raise BadInputError(f"a key/value head ({self.dst}) only has k and v inputs, not {self.input.value}")
        if self.src.kind == Kind.KV_HEAD:
            raise BadInputError(f"a key/value head ({self.src}) writes nothing to the residual stream: it cannot send an edge")
        if self.input == Input.MLP and self.dst.kind != Kind.MLP:
            raise BadInputError(f"only MLPs have an mlp_in input, not {self.dst}")
        if (self.input == Input.RESID) != (self.dst.kind == Kind.RESID):
            raise BadInputError(f"a residual-stream node (R2@0) is fed only through its resid input, and only it has one: "
                                f"{self.dst}.{self.input.value} is not an input")

    @property
    def name(self) -> str:
        """E.g. ``M1@0->A2.H0@rest.k``."""
        return f"{self.src.name}->{self.dst.name}.{self.input.value}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> "Edge":
        """Inverse of :attr:`name`.

        Example::

            >>> from p0circuit import Edge
            >>> edge = Edge.parse("M0@0->M1@0.mlp_in")  # block 0's MLP into block 1's MLP input
            >>> edge.src.name, edge.dst.name, edge.input.value
            ('M0@0', 'M1@0', 'mlp_in')
        """
        if not isinstance(name, str):
            raise BadInputError(f"an edge is an Edge or its name, got {name!r:.60} ({type(name).__name__}); "
                                "expected e.g. 'M1@0->A2.H0@rest.k'")
        try:
            src, rest = name.split("->")
            dst, inp = rest.rsplit(".", 1)
            edge = cls(Node.parse(src), Node.parse(dst), Input(inp))
        except BadInputError as e:
            raise BadInputError(f"edge name {name!r}: {e}") from None
        except ValueError:
            raise BadInputError(
                f"unknown edge name {name!r}; expected e.g. 'M1@0->A2.H0@rest.k'"
            ) from None
        return one_spelling(name, edge, "edge")


@typing.no_type_check  # validates its own fields in __post_init__, with messages that name the fix
@dataclass(frozen=True)
class Circuit:
    """Nodes and edges, with effect sizes and the settings that produced them: the one circuit type. The circuit
    searches return it with their typed records attached (``search``, ``edge_search``: faithfulness, denoising,
    completeness, whether it is faithful and why not) and the result they searched (``result``); ``print`` shows the
    records' measures."""

    nodes: tuple[Node, ...]
    """The circuit's nodes, sorted; every edge's sender and receiver are among them (added when not given)."""
    edges: tuple[Edge, ...] = ()
    """The circuit's edges, sorted."""
    node_effects: Mapping[str, float] = field(default_factory=dict)
    """Effect size per node name (may cover candidate nodes outside the circuit)."""
    edge_effects: Mapping[str, float] = field(default_factory=dict)
    """Effect size per edge name (may cover candidate edges outside the circuit)."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """How it was obtained: method, corruption, metric, threshold, model, ... (JSON-able)."""
    search: Any = field(default=None, compare=False, repr=False)
    """A searched circuit's node search (:class:`~p0circuit.patching.circuit_search.NodeSearch`: faithfulness,
    denoising, completeness, faithful, why, candidates, evaluations, its nodes strongest first); None otherwise. Not
    in :meth:`to_dict` (its numbers are in ``settings``; ``search.to_dict()`` is its own record)."""
    edge_search: Any = field(default=None, compare=False, repr=False)
    """Its edge search (:class:`~p0circuit.patching.circuit_edges.EdgeSearch`), when
    :func:`~p0circuit.faithful_edges` made it; None otherwise."""
    result: Any = field(default=None, compare=False, repr=False)
    """The patching result a search found it on (its setup with it), or None."""

    def __post_init__(self) -> None:
        for name, cls in (("nodes", Node), ("edges", Edge)):
            items = getattr(self, name)
            if isinstance(items, (str, cls)) or not isinstance(items, (list, tuple, set, frozenset)):
                raise BadInputError(f"Circuit: {name} must be a list of {cls.__name__} objects, got {items!r:.60}; "
                                    f"parse names with {cls.__name__}.parse")
            wrong = [x for x in items if not isinstance(x, cls)]
            if wrong:
                raise BadInputError(f"Circuit: {name} holds {wrong[0]!r:.60}, not a {cls.__name__}; "
                                    f"parse names with {cls.__name__}.parse")
            object.__setattr__(self, name, tuple(sorted(set(items))))
        ends = {n for e in self.edges for n in (e.src, e.dst)}
        object.__setattr__(self, "nodes", tuple(sorted(set(self.nodes) | ends)))
        for name in ("node_effects", "edge_effects"):
            object.__setattr__(self, name, _effects(getattr(self, name), name))
        if not isinstance(self.settings, Mapping):
            raise BadInputError(f"Circuit: settings must be a dict, got {self.settings!r:.60}")
        # what a search attaches (the patching layer's types, above this one: checked by what they hold)
        for name, holds, kind in (("search", "nodes", list), ("edge_search", "edges", list),
                                  ("result", "normalized", dict)):
            value = getattr(self, name)
            if value is None:
                continue
            held = getattr(value, holds, None)
            if (isinstance(value, (type, Circuit)) or not isinstance(held, kind)
                    or not all(isinstance(x, str) for x in held)
                    or (name != "result" and not (callable(getattr(value, "to_dict", None))
                                                  and isinstance(getattr(value, "settings", None), dict)))):
                raise BadInputError(f"Circuit: {name}= is what a circuit search attaches (faithful_circuit, "
                                    f"faithful_edges), got {value!r:.60}; leave it out (None) for a circuit made by hand")

    @property
    def level(self) -> str:
        """``edge`` for a circuit found over edges, ``node`` over nodes: as recorded by the result
        that produced it (``settings["level"]``); a hand-built circuit with edge effects is ``edge``."""
        recorded = self.settings.get("level")
        if recorded in ("node", "edge"):
            return str(recorded)
        return "edge" if self.edge_effects else "node"

    @property
    def setup(self) -> Any:
        """The checked setup a search found it with (its result's), or None."""
        return None if self.result is None else self.result.setup

    def __getattr__(self, name: str) -> Any:
        """An attribute the searches' old records had (``faithfulness``, ``faithful``, ...): an AttributeError
        saying where it is now."""
        if name in _SEARCH_FIELDS:
            where = "edge_search" if name == "effects" else "search"
            raise AttributeError(f"'Circuit' object has no attribute {name!r}: faithful_circuit and faithful_edges "
                                 f"return the one Circuit, and a search's numbers are on circuit.{where}.{name}"
                                 + (" (or circuit.edge_search for the edges')" if where == "search" else ""))
        if name == "to_circuit":
            raise AttributeError("'Circuit' object has no attribute 'to_circuit': it is the Circuit already")
        raise AttributeError(f"'Circuit' object has no attribute {name!r}")

    @property
    def interpretation(self) -> str:
        """The one-line reading :func:`p0circuit.discover` records (empty for other circuits)."""
        return str(self.settings.get("interpretation", ""))

    @property
    def node_names(self) -> frozenset[str]:
        """Names of the circuit's nodes."""
        return frozenset(n.name for n in self.nodes)

    @property
    def writers(self) -> tuple[Node, ...]:
        """The nodes whose own output carries the circuit: those that send an edge (every node when
        there are no edges). A node that only receives (a sink head whose key an edge writes) acts
        through its input, so patching node outputs cannot find it; a node-level circuit is
        compared with these."""
        if not self.edges:
            return self.nodes
        senders = {e.src for e in self.edges}
        return tuple(n for n in self.nodes if n in senders)

    @property
    def edge_names(self) -> frozenset[str]:
        """Names of the circuit's edges."""
        return frozenset(e.name for e in self.edges)

    def to_dict(self) -> dict[str, Any]:
        """A dict for strict JSON (an undefined effect, NaN, is ``None``), its keys the fields of
        :class:`CircuitRecord` (``schema`` first); :meth:`from_dict` inverts it."""
        return CircuitRecord(nodes=[n.name for n in self.nodes], edges=[e.name for e in self.edges],
                             node_effects=strict(dict(self.node_effects)), edge_effects=strict(dict(self.edge_effects)),
                             settings=strict(dict(self.settings))).to_dict()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Circuit":
        """Inverse of :meth:`to_dict`: read as a :class:`CircuitRecord`, every key's type checked by its path (a
        wrong type, an unknown key, a non-finite number or another schema version refused, naming the key), then
        every name parsed."""
        if not isinstance(d, Mapping) or "nodes" not in d:
            raise BadInputError(f"a circuit must be a JSON object with a 'nodes' list (as Circuit.to_json writes), "
                                f"got {d!r:.60}")
        data = {SCHEMA: CIRCUIT_SCHEMA, **d}  # written before circuits carried a version: the same layout
        try:
            record = CircuitRecord.from_dict(data, "a circuit")
        except ConfigError as err:
            raise BadInputError(str(err)) from None
        effects = {key: {k: math.nan if v is None else v for k, v in getattr(record, key).items()}
                   for key in ("node_effects", "edge_effects")}
        return cls(nodes=tuple(Node.parse(x) for x in record.nodes), edges=tuple(Edge.parse(x) for x in record.edges),
                   settings=record.settings, **effects)

    def to_json(self, **kw: Any) -> str:
        """Strict JSON text (no NaN); ``Circuit.from_json`` round-trips it."""
        return json.dumps(self.to_dict(), allow_nan=False, **kw)

    @classmethod
    def from_json(cls, text: str) -> "Circuit":
        """Inverse of :meth:`to_json`; text that is not a circuit's JSON is a :class:`BadInputError`.

        Example::

            >>> import p0circuit as p0
            >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
            >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
            >>> circuit = p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1").to_circuit()
            >>> p0.Circuit.from_json(circuit.to_json()).node_names == circuit.node_names
            True
        """
        if not isinstance(text, (str, bytes)):
            raise BadInputError(f"Circuit.from_json takes JSON text, got {type(text).__name__}; to read a file use "
                                "Circuit.from_json(Path(path).read_text())")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BadInputError(f"Circuit.from_json: the text is not valid JSON ({err}); was the file cut short? Write it with "
                                "Circuit.to_json") from None
        return cls.from_dict(data)

    def __str__(self) -> str:
        s = self.settings
        how = ", ".join(f"{k}={s[k]}" for k in ("method", "corruption", "metric", "threshold") if k in s)
        lines = [f"Circuit: {len(self.nodes)} nodes, {len(self.edges)} edges" + (f" ({how})" if how else "")]
        for name, record in (("search", self.search), ("edge_search", self.edge_search)):
            if record is not None:  # what the search measured, and where its record is
                shares = ", ".join(f"{k} {getattr(record, k):.3f}" for k in ("faithfulness", "denoising", "completeness")
                                   if isinstance(getattr(record, k, None), float))
                lines.append(f"  {'faithful' if record.faithful else 'not faithful'}: {shares}"
                             + (f" ({record.why})" if record.why else "") + f" (circuit.{name})")
        effects = self.edge_effects if self.level == "edge" else self.node_effects
        if effects:
            lines.append("  normalized effect: share of the clean-to-corrupted change of the metric that this "
                         f"{self.level} alone carries")
        for n in self.nodes:
            lines.append(f"  node {n.name}" + (f"  {format_effect(self.node_effects[n.name])}"
                                                 if n.name in self.node_effects else ""))
        for e in self.edges:
            lines.append(f"  edge {e.name}" + (f"  {format_effect(self.edge_effects[e.name])}"
                                                 if e.name in self.edge_effects else ""))
        return "\n".join(lines)


_SEARCH_FIELDS = ("faithfulness", "denoising", "completeness", "faithful", "why", "candidates", "size", "effects",
                  "searched")
"""Fields of the searches' records that the old FaithfulCircuit / EdgeCircuit had on themselves."""


@typing.runtime_checkable
class CircuitLike(typing.Protocol):
    """What else the package returns that holds a circuit: a :class:`~p0circuit.PatchResult` (the patching methods),
    made the one :class:`Circuit` by its own ``.to_circuit()`` (read here by that method alone: the patching layer is
    above this one). The circuit searches (``faithful_circuit``, ``faithful_edges``) return a :class:`Circuit`
    itself."""

    def to_circuit(self) -> Circuit:
        """The one :class:`Circuit`."""


AnyCircuit = Union[Circuit, CircuitLike]
"""A parameter that takes every circuit the package returns (compare, prune, the figures); :func:`as_circuit`
makes it the one :class:`Circuit`."""


def as_circuit(value: Any, where: str, name: str = "circuit") -> Circuit:
    """``value`` as the one :class:`Circuit`: a Circuit as it is (what the searches return), a :class:`CircuitLike`
    (a PatchResult) by its own ``.to_circuit()``, with its defaults (a PatchResult's threshold). Anything
    else is a :class:`BadInputError` naming ``where`` (the function) and ``name`` (its argument) in the words of
    every entry point's check, which list what is accepted. The one place a circuit is converted."""
    if isinstance(value, Circuit):
        return value
    check_value(where, name, value, AnyCircuit)
    circuit = None if isinstance(value, type) else value.to_circuit()  # a class has the method, not a circuit
    if not isinstance(circuit, Circuit):
        got = (f"the class {value.__name__}" if isinstance(value, type)
               else f"an object ({type(value).__name__}) whose .to_circuit() returned {type(circuit).__name__}")
        raise BadInputError(f"{where}: {name} is {got}, not a circuit; pass a p0circuit.Circuit (what faithful_circuit "
                            "and faithful_edges return), or a PatchResult (its .to_circuit() gives the Circuit)")
    return circuit


CIRCUIT_SCHEMA = 1
"""The version of a circuit's JSON (``circuit_<method>.json``, a sweep cell's ``circuit``): :meth:`Circuit.to_dict`
writes it, :meth:`Circuit.from_dict` reads this one only (a file without one is of the same layout, written before
circuits carried a version). Bump it when a key is added, removed, renamed or changes meaning."""


@dataclass(frozen=True)
class CircuitRecord(Record):
    """A circuit as JSON (``circuit_<method>.json``): names, effects and settings, read back with their types."""

    nodes: list[str]
    """The circuit's node names (``A0.H1@0``), sorted."""
    edges: list[str] = field(default_factory=list)
    """Its edge names (``M1@0->A2.H0@0.k``), sorted."""
    node_effects: dict[str, Optional[float]] = field(default_factory=dict)
    """Node name -> normalized effect (null: undefined), candidates outside the circuit included."""
    edge_effects: dict[str, Optional[float]] = field(default_factory=dict)
    """Edge name -> normalized effect (null: undefined), candidates outside the circuit included."""
    settings: dict[str, Any] = field(default_factory=dict)
    """How it was found: method, corruption, metric, threshold, the setup's description, ..."""
    schema: int = CIRCUIT_SCHEMA
    """The layout's version (:data:`CIRCUIT_SCHEMA`)."""

    SCHEMA_VERSION: ClassVar[Optional[int]] = CIRCUIT_SCHEMA
    FIX: ClassVar[str] = "write circuits with Circuit.to_json (or to_dict) and read them with Circuit.from_json"


def _effects(effects: Any, what: str) -> dict[str, float]:
    """``effects`` as a dict of name -> float; anything else is an error naming the entry.
    NaN is kept (a method may report an undefined effect), strings and other types are not."""
    if not isinstance(effects, Mapping):
        raise BadInputError(f"Circuit: {what} must map names to numbers, got {effects!r:.60}")
    out = {}
    for key, value in effects.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInputError(f"Circuit: {what}[{key!r:.40}] = {value!r:.40} is not a number for a node or edge "
                                "name; effects map names (str) to numbers")
        out[key] = float(value)
    return out


def effect_grid(items: Any, values: Mapping[str, float], kind: Kind, n_layers: int, positions: list, n_heads: int = 0) -> Any:
    """Effects of the ``kind`` nodes among ``items`` as an array: ``[layer, pos, head]`` for heads,
    ``[layer, pos]`` for MLPs, the position axis in the order of ``positions``; NaN where a node was
    not patched (the layout of TransformerLens' patching functions)."""
    import numpy as np

    index = {p: i for i, p in enumerate(positions)}
    shape = (n_layers, len(positions), n_heads) if n_heads else (n_layers, len(positions))
    grid = np.full(shape, np.nan)
    for node in items:
        if node.kind == kind and node.name in values:
            grid[(node.layer, index[node.pos]) + ((node.head,) if n_heads else ())] = values[node.name]
    return grid


def format_effect(value: float) -> str:
    """An effect with four significant digits and its sign (``+0.09962``, ``-0.4107``): enough
    to see on which side of a threshold like 0.1 it falls."""
    return f"{value:+.4g}"


def parse_list(items: Any, cls: type, what: str, example: str) -> list:
    """``cls`` objects (:class:`Node` or :class:`Edge`) from objects or names, e.g. ``example``;
    a bare name instead of a list, an empty list and duplicates are errors naming the fix."""
    if isinstance(items, (str, cls)):
        raise BadInputError(f"{what} must be a list of {what} or names, got one: pass [{str(items)!r}]")
    if not isinstance(items, (list, tuple, set, frozenset)) and not hasattr(items, "__iter__"):
        raise BadInputError(f"{what} must be a list of {what} or names (e.g. [{example!r}]), got {items!r:.60}")
    out = [x if isinstance(x, cls) else cls.parse(x) for x in items]
    if not out:
        raise BadInputError(f"no candidate {what} given: pass at least one (e.g. {example!r})")
    if len(set(out)) != len(out):
        dup = sorted({x.name for x in out if out.count(x) > 1})
        raise BadInputError(f"duplicate {what} {dup}: list each once")
    return out


def parse_nodes(nodes: Any) -> list[Node]:
    """Nodes from Node objects or names like 'A0.H1@0'; duplicates and empties are errors."""
    return parse_list(nodes, Node, "nodes", "A0.H0@0")
