"""The records an analysis writes and reads back, with their schema version: the top level of
``analysis.json`` (:class:`AnalysisRecord`), one row of its ``onsets`` (:class:`OnsetRow`), and the
state file an interrupted analysis resumes from (:class:`StateFile`, its :class:`StateHeader`).

Each record is a frozen dataclass whose fields are the file's keys, spelled here once; ``to_dict()``
gives the JSON object and ``from_dict()`` reads one back, refusing a missing or unknown key by name.
Both files carry ``"schema": SCHEMA_VERSION``; a file of another version, or with none (written before
the records were versioned), is refused with what to do (docs/records.md: no migration, since the
steps of an older state were measured by older code). Imports no torch: the state is read before
the model is loaded (:func:`p0circuit.studies.analysis.settings.precheck`).
"""

import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

from p0circuit.core.errors import ConfigError
from p0circuit.core.io import clear_stale
from p0circuit.core.record import (  # noqa: F401 (re-exported)
    ABSENT, SCHEMA, Absent, Maybe, Mismatch, Record, check_schema, read_value,
)
from p0circuit.studies.analysis.schema import SCHEMA_VERSION, SETTINGS, TITLES, AnalysisPart  # noqa: F401 (re-exported)
from p0circuit.studies.analysis.passes import (
    CorruptionChoice, EdgePass, NeuronPass, NodeCircuit, NodeScreen, Normalization, Note,
)
from p0circuit.studies.analysis.summaries import Memory, SinkPosition, Timing, Variations, Verdict
from p0circuit.studies.findings import (
    Control, Detection, FirstTokens, KeyedOn, SinkCircuit, SinkReads, SpecialToken, Spread, SuperWeights, Sweep,
    Unmeasured, Weight,
)


@dataclass(frozen=True)
class StateHeader(AnalysisPart):
    """What an analysis directory's state was measured on: a resumed analysis must match it exactly."""

    model: str
    """The model's label (its entry, e.g. ``planted:rope``, or its name)."""
    settings: dict[str, Any]
    """The :class:`~p0circuit.studies.analysis.settings.AnalysisSettings` as JSON."""
    prompt_source: str
    """What the prompts are, in words (``8 passages of natural English``)."""
    prompts: dict[str, str]
    """BOS setting (``without_bos``, ``with_bos``) -> a short hash of its prompt tokens."""


UNIT = "forward of the batch"
"""The state's record of the cost unit: one forward of the prompt batch, timed when the analysis started (a step whose
value is null)."""


@dataclass(frozen=True)
class Step(AnalysisPart):
    """One finished step of the state file (``steps[key]``): its value and what it cost."""

    value: Any
    """What the step measured (its kind's record, :func:`step_value`; null for the unit forward)."""
    seconds: float
    """Its wall time."""
    forwards: Maybe[Optional[float]] = ABSENT
    """Its work, in forwards of the batch (:class:`~p0circuit.patching.work.Count`)."""
    with_grad: Maybe[Optional[float]] = ABSENT
    """Of that work, the part done with a graph recorded."""
    peak: Maybe[Optional[int]] = ABSENT
    """The process' peak resident memory during it (bytes; null where unread)."""
    run: Maybe[int] = ABSENT
    """Which process ran it (0: the first; each resume counts on; absent: the first)."""
    unit_s: Maybe[float] = ABSENT
    """That process' own unit forward (seconds): what its steps' time is counted against."""


@dataclass(frozen=True)
class StateFile(AnalysisPart):
    """``analysis.state.json``: the finished steps of one analysis directory, saved after each."""

    header: StateHeader
    """What the steps were measured on."""
    steps: dict[str, dict[str, Any]]
    """Step key (``without_bos/P0@L2/nodes``) -> ``{"value", "seconds", "peak"}``; the unit forward's key keeps
    its ``seconds`` only."""
    schema: int = SCHEMA_VERSION
    """The records' version (:data:`SCHEMA_VERSION`)."""

    FIX: ClassVar[str] = ("pass --fresh (fresh=True in Python) to recompute the analysis in this directory, or write to another "
                          "directory")

    def _check(self, path: str) -> None:
        """Each step read as a :class:`Step` and its value as its kind's record (:func:`step_value`), by key path:
        a damaged value, a step without one or a unit forward of no time is refused before the model loads."""
        for key, step in self.steps.items():
            where = f"{path}.steps[{key!r}]"
            read_value(step, Step, where)
            kind = step_value(key, where)
            if isinstance(kind, _Part):
                _read_part(step["value"], kind, f"{where}.value")
            else:
                value = read_value(step["value"], kind, f"{where}.value")
                tag = key.split("/", 1)[0]
                if isinstance(value, SinkSummary) and tag in SETTINGS.values() and value.bos != (tag == SETTINGS[True]):
                    raise Mismatch(f"{where}.value.bos", f"{tag == SETTINGS[True]} (the setting {tag!r})", value.bos)
            if not step["seconds"] >= 0 or (key == UNIT and not step["seconds"] > 0):
                raise Mismatch(f"{where}.seconds", "a number of seconds > 0" if key == UNIT else "a number of seconds >= 0",
                               step["seconds"], f"{step['seconds']!r}" + (" (the unit forward every step's cost is "
                                                                          "counted in takes some time)" if key == UNIT else ""))

    @classmethod
    def read(cls, path: Path) -> "StateFile":
        """The state file at ``path``, or a clear error for a damaged one or one of another schema version. Temporary
        files of a save cut short beside it (``analysis.state.json.<pid>.tmp``) are removed first."""
        clear_stale(path)
        try:
            data = json.loads(path.read_text())
        except ValueError:
            raise ConfigError(f"{path} is not valid JSON (a damaged state file); delete it, or pass --fresh (fresh=True in Python) "
                              "to start over") from None
        return cls.from_dict(data, f"the state file {path}")


@dataclass(frozen=True)
class OnsetRow(AnalysisPart):
    """One row of ``analysis.json``'s ``onsets[setting]``: what builds the sink at one onset. A row whose
    onset could not be measured has ``skipped`` and none of the measured keys; the nested values are the
    passes' records (:mod:`.passes`) and the studies' (:mod:`p0circuit.studies.findings`)."""

    layer: int
    """The onset's block (the metric reads the residual stream after it)."""
    where: str
    """Whose norm rises: ``P0``, or a sink class away from it (``first ','``, ``other (' the')``), in words."""
    at: int
    """The sink state's index in every prompt (0: position 0)."""
    token: Optional[str]
    """The token whose state it is, for a class away from position 0: its delimiter (``','``, a first or a later
    occurrence) or its frequent token (``' the'``; ``'#25'`` in a model without a tokenizer); None at position 0, whose
    state is the position's, whatever token stands there."""
    prompt_set: str
    """The prompts patched, in words."""
    prompts: Maybe[int] = ABSENT
    """How many prompts were patched (a row away from position 0 only)."""
    keyed_on: Maybe[Union[KeyedOn, Unmeasured]] = ABSENT
    """What the state is keyed on: position, token or context, with the kept shares
    (:class:`~p0circuit.studies.findings.KeyedOn`), or why it was not measured."""
    skipped: Maybe[str] = ABSENT
    """Why the onset was not measured (then no measured key follows)."""
    corruption: Maybe[str] = ABSENT
    """The corruption patched with (``shift``, ``swap``)."""
    corruption_params: Maybe[dict[str, Any]] = ABSENT
    """Its parameters."""
    metric: Maybe[str] = ABSENT
    """The metric's name (the norm ratio at the onset)."""
    clean: Maybe[float] = ABSENT
    """The metric on the clean prompts."""
    corrupted: Maybe[float] = ABSENT
    """The metric on the corrupted prompts."""
    signal: Maybe[bool] = ABSENT
    """Whether clean and corrupted differ enough to normalize effects."""
    message: Maybe[Optional[str]] = ABSENT
    """Why there is no signal (empty, or ``None``, with a signal)."""
    candidates: Maybe[int] = ABSENT
    """Candidate nodes patched."""
    normalization: Maybe[Normalization] = ABSENT
    """Whether the normalized effects carry (``stable``), and the raw changes when they do not."""
    nodes: Maybe[dict[str, float]] = ABSENT
    """Node -> normalized effect, those at the threshold or above, strongest first."""
    effects: Maybe[dict[str, float]] = ABSENT
    """Node -> normalized effect, every candidate patched."""
    screen: Maybe[Optional[NodeScreen]] = ABSENT
    """How attribution screened the candidates (``None``: every one patched exactly)."""
    seconds: Maybe[float] = ABSENT
    """The node pass' seconds."""
    corruption_choice: Maybe[Optional[CorruptionChoice]] = ABSENT
    """Why this corruption (with BOS: ``swap`` or ``shift``, whichever removes more); None without a choice."""
    faithfulness: Maybe[dict[str, float]] = ABSENT
    """k -> share of the change kept with only the top k single nodes clean (a screen)."""
    circuit: Maybe[Union[NodeCircuit, Note]] = ABSENT
    """The faithful circuit (nodes, faithfulness, denoising, completeness, ``edge_circuit``), or a ``note``."""
    circuit_targets: Maybe[dict[str, NodeCircuit]] = ABSENT
    """The first P0 onset: its faithful circuit searched at each faithfulness target of the sensitivity table
    (target -> nodes, size, measures; without edges)."""
    edges: Maybe[dict[str, float]] = ABSENT
    """Edge -> normalized effect (path patching between the kept nodes)."""
    neurons: Maybe[dict[str, float]] = ABSENT
    """Neuron -> normalized effect on the onset's massive dimension at P0."""
    edge_pass: Maybe[EdgePass] = ABSENT
    """The edge pass' metric, signal and candidates (only when nodes were kept)."""
    neuron_pass: Maybe[Union[NeuronPass, Note]] = ABSENT
    """The neuron pass' metric, screen and faithfulness, or a ``note`` saying why none ran."""
    reads: Maybe[Union[SinkReads, Unmeasured]] = ABSENT
    """A P0 onset: what the later heads read of the state (its norm, its direction), from edits of it after the
    onset (:class:`~p0circuit.studies.findings.SinkReads`)."""
    detection: Maybe[Union[Detection, Unmeasured]] = ABSENT
    """A P0 onset: how close the other positions come to P0's state with self-only attention in blocks 0..k
    (:class:`~p0circuit.studies.findings.Detection`)."""
    sink_circuit: Maybe[Union[SinkCircuit, Unmeasured]] = ABSENT
    """A P0 onset: the circuit of the sink heads' attention to P0 after it, beside the norm circuit
    (:class:`~p0circuit.studies.findings.SinkCircuit`)."""
    super_weights: Maybe[Union[SuperWeights, Unmeasured]] = ABSENT
    """A P0 onset: the weights through which its neurons write the massive dimension, zeroed
    (:class:`~p0circuit.studies.findings.SuperWeights`)."""

    def to_circuit(self, **settings: Any) -> Any:
        """The onset's faithful circuit as the one :class:`~p0circuit.Circuit`: its nodes and the edges its edge search
        kept, every candidate's effect (``effects``: what ``prune``, ``compare``'s AUROC and ``plot`` read), its
        corruption and metric, and ``settings``; so a row takes part wherever a circuit does:
        ``p0.compare(result.onsets["without_bos"][0], pm.truth)``. A row without a faithful circuit is refused with why."""
        from p0circuit.core.circuits import searched_circuit
        from p0circuit.core.errors import BadInputError

        c = self.circuit
        if not isinstance(c, NodeCircuit):
            raise BadInputError(f"the onset row at block {self.layer} ({self.where}) has no faithful circuit: "
                                + (c.note if isinstance(c, Note) else self.skipped or "its node pass did not run"))
        ec = c.edge_circuit
        return searched_circuit(c.to_dict(), ec.to_dict() if ec else {}, self.effects or {}, corruption=self.corruption,
                                metric=self.metric, **settings)


@dataclass(frozen=True)
class Sensitivity(AnalysisPart):
    """How one BOS setting's verdict depends on its thresholds (:mod:`p0circuit.studies.analysis.sensitivity`)."""

    sweeps: list[Sweep]
    """Each threshold swept, with the labels it gives."""
    rows: list[OnsetRow]
    """The blocks below the first P0 onset that another onset line makes the onset, each patched as an onset there."""


@dataclass(frozen=True)
class AnalysisRecord(AnalysisPart):
    """``analysis.json``: what :func:`~p0circuit.studies.analysis.run.analyze` measured, for one model."""

    model: str
    """The model's label (its entry, e.g. ``real:smollm2``, or its name)."""
    settings: dict[str, Any]
    """The :class:`~p0circuit.studies.analysis.settings.AnalysisSettings` as JSON."""
    prompt_source: str
    """What the prompts are, in words."""
    n_layers: int
    """The model's blocks."""
    n_heads: int
    """Attention heads per block."""
    sinks: dict[str, Union["SinkSummary", "Skipped"]]
    """BOS setting -> its sink summary (``sink_rate``, ``norm_stages``, ``massive_dims``, ``sink_positions``, ...),
    or why it was skipped."""
    onsets: dict[str, list[OnsetRow]]
    """BOS setting -> its onsets, in layer order."""
    variations: dict[str, Variations]
    """BOS setting -> every corruption side by side at the first P0 onset, and other prompt lengths."""
    verdict: Verdict
    """The paper's claim, as measured (``claim``, ``holds``, ``parts`` per BOS setting)."""
    timing: Timing
    """Each step's seconds, the unit forward, forwards measured and predicted, the threads, the ETA log."""
    memory: Memory
    """The model's size, resident memory at the start, each step's peak and the process' peak (GiB)."""
    bos_token: Optional[str]
    """The token the with-BOS setting prepends at position 0, in words (``"BOS '<|endoftext|>' (id 0)"``; None
    when that setting did not run)."""
    truth: Maybe[dict[str, list[str]]] = ABSENT
    """A planted model's ground truth (``nodes``, ``edges``); absent for any other model."""
    first_tokens: dict[str, Union[FirstTokens, Unmeasured]] = field(default_factory=dict)
    """Block of a P0 onset -> every vocabulary token's P0 state there (:class:`~p0circuit.studies.findings.FirstTokens`)."""
    weights: Union[list[Weight], Unmeasured, None] = None
    """The model's super-weight candidates: every block's ``W_out`` entries far from its mean
    (:func:`~p0circuit.studies.experiments.super_weights.weight_outliers`), or why there are none to read."""
    sensitivity: dict[str, Sensitivity] = field(default_factory=dict)
    """BOS setting -> how its verdict depends on each threshold."""
    spread: dict[str, Union[Spread, Unmeasured]] = field(default_factory=dict)
    """BOS setting -> the first P0 onset's headline numbers over ``spread_prompts`` prompts, with intervals."""
    controls: dict[str, list[Control]] = field(default_factory=dict)
    """BOS setting -> the first P0 onset's controls (two negative, one positive)."""
    special_tokens: dict[str, Union[list[SpecialToken], Unmeasured]] = field(default_factory=dict)
    """BOS setting -> the model's start, end-of-text and chat tokens put in the middle of its prompts."""
    variant: Maybe[str] = ABSENT
    """What a model read from a GGUF file is: the release it came from, its quantization, dequantized to float32
    (:func:`p0circuit.models.gguf.variant`); absent for any other model."""
    schema: int = SCHEMA_VERSION
    """The records' version (:data:`SCHEMA_VERSION`)."""

    FIX: ClassVar[str] = ("run `p0circuit analyze` again with the same --out (analyze(model, out=...)): it rewrites "
                          "analysis.json from the finished steps of its state file, computing none again; only if that "
                          "state is refused too, pass --fresh (fresh=True) to start over")

    def _check(self, path: str) -> None:
        for tag, summary in self.sinks.items():  # the setting's key and its summary's BOS choice: one fact, said twice
            if isinstance(summary, SinkSummary) and tag in SETTINGS.values() and summary.bos != (tag == SETTINGS[True]):
                raise Mismatch(f"{path}.sinks[{tag!r}].bos", f"{tag == SETTINGS[True]} (the setting {tag!r})", summary.bos)

    @classmethod
    def read(cls, path: Path) -> "AnalysisRecord":
        """The ``analysis.json`` at ``path``, its schema version and keys checked (:meth:`from_dict`)."""
        try:
            data = json.loads(path.read_text())
        except ValueError:
            raise ConfigError(f"{path} is not valid JSON; {cls.FIX}") from None
        return cls.from_dict(data, str(path))


def as_record(data: Any, what: str = "the analysis") -> "AnalysisRecord":
    """The record of an analysis' content (``analysis.json``'s dict: its schema version and keys checked), or
    the record itself."""
    return data if isinstance(data, AnalysisRecord) else AnalysisRecord.from_dict(data, what)


@dataclass(frozen=True)
class MassiveDim(AnalysisPart):
    """One massive dimension of the residual stream at P0 (a sink summary's ``massive_dims``)."""

    dim: int
    """The dimension."""
    first_layer: int
    """The first block after which it is massive at P0."""
    last_layer: int
    """The last."""
    peak_value: float
    """Its largest mean value at P0."""
    peak_ratio: float
    """That value over the typical scale of the residual stream."""
    peak_layer: int
    """Where it peaks."""


@dataclass(frozen=True)
class SinkSummary(AnalysisPart):
    """One BOS setting's sink report as the analysis keeps it (``analysis.json``'s ``sinks[setting]``, the ``sinks``
    step's value in the state; :func:`p0circuit.studies.analysis.steps.sinks`)."""

    bos: bool
    """Whether position 0 of the prompts holds the start token (the setting ``with_bos``)."""
    sink_rate: Optional[float]
    """Share of heads whose attention to position 0 passes the sink line."""
    norm_stages: list[tuple[str, int, Optional[float]]]
    """Every ``["onset" | "erasure", block, ratio]`` of P0's norm ratio."""
    massive_dims: list[MassiveDim]
    """The massive dimensions at P0, strongest first (at most 8)."""
    sink_positions: list[SinkPosition]
    """Every (block, position class) that is a sink state."""
    norm_ratio: list[Optional[float]]
    """P0's norm ratio after each block."""
    alpha: list[list[Optional[float]]]
    """alpha_0 per block and head."""
    sink_rate_per_layer: list[Optional[float]]
    """The sink rate of each block's heads."""
    direction_stability: Optional[list[Optional[float]]]
    """Per block, h_0's mean pairwise cosine across prompts."""
    direction_to_onset: Optional[list[Optional[float]]]
    """Per block, the cosine of h_0's mean direction with its direction at the norm onset."""
    direction_stability_ordinary: Optional[list[Optional[float]]]
    """The baseline of ``direction_stability`` at ordinary positions."""
    direction_stability_unmassive: Optional[list[Optional[float]]]
    """``direction_stability`` with the massive dimensions set to 0."""
    n_prompts: int
    """Prompts measured."""
    seq_len: int
    """Their length."""


@dataclass(frozen=True)
class Skipped(AnalysisPart):
    """A BOS setting that was not measured (``sinks[setting]``)."""

    skipped: str
    """Why."""


NODE_STEP = ("corruption", "corruption_params", "metric", "clean", "corrupted", "signal", "message", "candidates",
             "normalization", "nodes", "effects", "screen", "seconds", "corruption_choice", "faithfulness", "circuit")
"""The keys an onset's node step always writes (an :class:`OnsetRow`'s, with their types there)."""


def _hint(cls: type, name: str, item: bool = False) -> Any:
    """The type of ``cls``'s field ``name`` without :class:`Absent` (``item``: of its dict's values)."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not Absent] if typing.get_origin(hint) is Union else [hint]
    hint = Union[tuple(args)] if len(args) > 1 else args[0]
    return typing.get_args(hint)[1] if item else hint


@dataclass(frozen=True)
class _Part:
    """A step value that is part of an :class:`OnsetRow` (``keys``: those it must hold, typed as the row's fields of
    their names; ``own``: the rest is the step's own record, of any keys, else every key is a row's)."""

    keys: tuple[str, ...]
    own: bool = False


def _read_part(value: Any, part: _Part, path: str) -> None:
    """``value`` checked as ``part``: its keys present, each typed as the onset row's field of its name."""
    if not isinstance(value, dict):
        raise Mismatch(path, dict, value)
    missing = [k for k in part.keys if k not in value]
    if missing:
        raise Mismatch(path, f"an object with the key(s) {list(part.keys)}", value, f"one without {missing}")
    row = OnsetRow.keys()
    for k, v in value.items():
        if k in (part.keys if part.own else row):  # the rest of an own part is its pass' record (any JSON)
            read_value(v, _hint(OnsetRow, k), f"{path}[{k!r}]")
        elif not part.own:
            raise Mismatch(path, f"an object of an onset row's keys ({', '.join(part.keys)}, ...)", value,
                           f"one with the key {k!r}")


def step_value(key: str, where: str) -> Any:
    """The type of the value of the state's step ``key`` (its kind: the part of the key after the last ``/``, or the
    whole key), as the records of ``analysis.json`` type it; an unknown kind is refused (``where``: the step)."""
    kind = key.rsplit("/", 1)[-1]
    kind = re.sub(r"@L\d+$|\d+$", "", kind)
    top = "/" not in key
    kinds: dict[str, Any] = {
        UNIT: type(None),
        "sinks": SinkSummary,
        "first_tokens": _hint(AnalysisRecord, "first_tokens", item=True),
        "keyed": _hint(OnsetRow, "keyed_on"),
        "nodes": _Part(NODE_STEP),
        "edges": _Part(("edges",), own=True),
        "neurons": _Part(("neurons",), own=True),
        "reads": _hint(OnsetRow, "reads"),
        "detection": _hint(OnsetRow, "detection"),
        "sink": _hint(OnsetRow, "sink_circuit"),
        "corruptions": dict[str, dict[str, Any]],
        "length": dict[str, Any],
        "spread": _hint(AnalysisRecord, "spread", item=True),
        "special": _hint(AnalysisRecord, "special_tokens", item=True),
    }
    if kind == "weights":  # the model's super-weight candidates (a key of its own), or an onset's zeroed weights
        return _hint(AnalysisRecord, "weights") if top else _hint(OnsetRow, "super_weights")
    if kind not in kinds:
        raise Mismatch(where, "the key of a step this p0circuit takes (its last part one of "
                       f"{sorted(set(kinds) - {UNIT} | {'weights'})})", key, f"{key!r}")
    return kinds[kind]
