"""The records of one onset row's passes (:class:`~.records.OnsetRow`): how its node pass normalized and screened,
why its corruption, its faithful circuit and that circuit's edges, its edge pass and its neuron pass. Each is a
frozen dataclass whose fields are the JSON keys (:mod:`p0circuit.core.record`), read back typed. Imports no torch."""

from dataclasses import dataclass, field
from typing import Optional, Union

from p0circuit.core.record import ABSENT, Maybe
from p0circuit.core.searches import EdgeSearch, NodeSearch
from p0circuit.studies.analysis.schema import AnalysisPart


@dataclass(frozen=True)
class Note(AnalysisPart):
    """A pass that did not run, and why (``{"note": ...}``)."""

    note: str
    """Why (no signal, an attention-only model, the node circuit not faithful, ...)."""


@dataclass(frozen=True)
class Normalization(AnalysisPart):
    """Whether a pass' normalized effects can be read as shares of the clean-to-corrupted change
    (:func:`p0circuit.studies.analysis.steps.normalization`)."""

    signal_share: float
    """|clean - corrupted| over the metric's size (the larger of the two)."""
    largest_effect: float
    """The largest |normalized effect| of one component."""
    stable: bool
    """Whether the normalized effects carry (the change is large enough, no component moves it three times over)."""
    why: str
    """Why not, when not (empty when they carry)."""
    raw_changes: dict[str, float]
    """The largest changes of the metric itself, component -> change (they hold either way)."""


@dataclass(frozen=True)
class NodeScreen(AnalysisPart):
    """How attribution patching screened a node pass' candidates before exact patching (a pass with more candidates
    than ``exact_nodes``)."""

    how: str
    """What ran, in words (the estimates, the exact top, the included and sampled nodes, the unexamined)."""
    exact_top: int
    """The strongest estimates patched exactly."""
    included: int
    """Nodes another pass found, patched exactly outside the top."""
    sampled: int
    """Others drawn at random and patched exactly (the check of what the ranking missed)."""
    unexamined: int
    """Candidates with no exact effect (the circuit search still ranks them by their estimate)."""
    sample_max_abs_effect: Optional[float]
    """The largest |exact effect| in the random sample (None: no sample, or not finite)."""
    sample_notable: int
    """Sampled nodes whose exact effect is notable (what the ranking would have missed)."""


@dataclass(frozen=True)
class CorruptionChoice(AnalysisPart):
    """Why a with-BOS onset was patched with its corruption: of ``swap`` and ``shift``, the one that lowers the metric
    most."""

    drops: dict[str, float]
    """Corruption -> its drop of the metric (clean minus corrupted)."""
    chosen: str
    """The corruption chosen."""
    why: str
    """Why, in words."""


@dataclass(frozen=True)
class EdgeCircuit(EdgeSearch, AnalysisPart):
    """The faithful node circuit's edges: an :class:`~p0circuit.core.searches.EdgeSearch` (its keys there), with the
    search's seconds."""

    seconds: Maybe[float] = ABSENT
    """The search's seconds."""


@dataclass(frozen=True)
class NodeCircuit(NodeSearch, AnalysisPart):
    """An onset's faithful node circuit: a :class:`~p0circuit.core.searches.NodeSearch` (its keys there), with the
    search's seconds and its edges (a row's ``circuit``; a ``circuit_targets`` entry has neither)."""

    seconds: Maybe[float] = ABSENT
    """The search's seconds (a row's circuit only)."""
    edge_circuit: Maybe[Union[EdgeCircuit, Note]] = ABSENT
    """Its edges, or why they were not searched (a row's circuit only)."""


@dataclass(frozen=True)
class EdgePass(AnalysisPart):
    """An onset's edge pass beside its ``edges``: where the edges come from and whether they carry a signal."""

    candidates: int
    """Candidate edges patched."""
    of: str
    """Which edges, in words (the faithful circuit's, or, as a screen, those between the strongest single nodes)."""
    signal: Maybe[bool] = ABSENT
    """Whether the path patching had a signal (absent where no edge was patched)."""
    seconds: Maybe[float] = ABSENT
    """The pass' seconds (a screen's only; the faithful circuit's edges are timed with it)."""
    note: Maybe[str] = ABSENT
    """Why no edge was patched."""


@dataclass(frozen=True)
class NeuronPass(AnalysisPart):
    """An onset's neuron pass beside its ``neurons``: integrated gradients over the MLPs' neurons, then exact
    patching of the strongest (:func:`p0circuit.studies.analysis.steps.neurons`)."""

    metric: str
    """The metric: the massive dimension's value at the state (``resid_dim@L2[123]``)."""
    mlps: list[int]
    """The MLP blocks whose neurons were candidates."""
    candidates: int
    """Neurons estimated."""
    confirmed: int
    """Neurons patched exactly."""
    clean: float
    """The metric on the clean prompts."""
    corrupted: float
    """The metric on the corrupted prompts."""
    signal: bool
    """Whether they differ enough to normalize effects."""
    message: str
    """Why there is no signal (empty with one)."""
    faithfulness_within_confirmed: dict[str, float]
    """k -> share of the change kept with the top k confirmed neurons clean."""
    screen: str
    """How the candidates were screened, in words."""
    seconds: dict[str, float] = field(default_factory=dict)
    """``screen`` and ``confirm`` seconds."""
