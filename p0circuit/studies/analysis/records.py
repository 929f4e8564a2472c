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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

from p0circuit.core.errors import ConfigError
from p0circuit.core.record import ABSENT, SCHEMA, Absent, Maybe, Record, check_schema  # noqa: F401 (re-exported)
from p0circuit.studies.findings import (
    Control, Detection, FirstTokens, KeyedOn, SinkCircuit, SinkReads, SpecialToken, Spread, SuperWeights, Sweep,
    Unmeasured, Weight,
)

SCHEMA_VERSION = 3
"""The version of ``analysis.json`` and ``analysis.state.json`` this p0circuit writes, and the only one it reads.
Bump it when a key of a record (or of a step's value in the state) is added, removed, renamed or changes
meaning (docs/contributing.md)."""


class _Record(Record):
    """A record of this module: its keys are its fields in this file."""

    SCHEMA_VERSION: ClassVar[Optional[int]] = SCHEMA_VERSION

    @classmethod
    def _fix(cls) -> str:
        return cls.FIX or (f"a record's keys are its fields in p0circuit/studies/analysis/records.py ({cls.__name__}; "
                           "docs/records.md); a new key is added there, with SCHEMA_VERSION bumped (docs/contributing.md)")


@dataclass(frozen=True)
class StateHeader(_Record):
    """What an analysis directory's state was measured on: a resumed analysis must match it exactly."""

    model: str
    """The model's label (its entry, e.g. ``planted:rope``, or its name)."""
    settings: dict[str, Any]
    """The :class:`~p0circuit.studies.analysis.settings.AnalysisSettings` as JSON."""
    prompt_source: str
    """What the prompts are, in words (``8 passages of natural English``)."""
    prompts: dict[str, str]
    """BOS setting (``without_bos``, ``with_bos``) -> a short hash of its prompt tokens."""


@dataclass(frozen=True)
class StateFile(_Record):
    """``analysis.state.json``: the finished steps of one analysis directory, saved after each."""

    header: StateHeader
    """What the steps were measured on."""
    steps: dict[str, dict[str, Any]]
    """Step key (``without_bos/P0@L2/nodes``) -> ``{"value", "seconds", "peak"}``; the unit forward's key keeps
    its ``seconds`` only."""
    schema: int = SCHEMA_VERSION
    """The records' version (:data:`SCHEMA_VERSION`)."""

    FIX: ClassVar[str] = ("pass fresh=True (--fresh) to recompute the analysis in this directory, or write to another "
                          "directory")

    @classmethod
    def read(cls, path: Path) -> "StateFile":
        """The state file at ``path``, or a clear error for a damaged one or one of another schema version."""
        try:
            data = json.loads(path.read_text())
        except ValueError:
            raise ConfigError(f"{path} is not valid JSON (a damaged state file); delete it, or pass fresh=True (--fresh) "
                              "to start over") from None
        return cls.from_dict(data, f"the state file {path}")


@dataclass(frozen=True)
class OnsetRow(_Record):
    """One row of ``analysis.json``'s ``onsets[setting]``: what builds the sink at one onset. A row whose
    onset could not be measured has ``skipped`` and none of the measured keys; the nested values are the
    steps' dicts (:mod:`p0circuit.studies.analysis.steps`)."""

    layer: int
    """The onset's block (the metric reads the residual stream after it)."""
    where: str
    """Whose norm rises: ``P0``, or a sink class away from it (``first ','``, ``other (' the')``)."""
    prompt_set: str
    """The prompts patched, in words."""
    at: Maybe[int] = ABSENT
    """The sink state's index in every prompt (a row away from position 0 only)."""
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
    normalization: Maybe[Optional[dict[str, Any]]] = ABSENT
    """Whether the normalized effects carry (``stable``), and the raw changes when they do not."""
    nodes: Maybe[dict[str, float]] = ABSENT
    """Node -> normalized effect, those at the threshold or above, strongest first."""
    effects: Maybe[dict[str, float]] = ABSENT
    """Node -> normalized effect, every candidate patched."""
    screen: Maybe[Optional[dict[str, Any]]] = ABSENT
    """How attribution screened the candidates (``None``: every one patched exactly)."""
    seconds: Maybe[float] = ABSENT
    """The node pass' seconds."""
    corruption_choice: Maybe[dict[str, Any]] = ABSENT
    """Why this corruption (with BOS: ``swap`` or ``shift``, whichever removes more); ``{}`` without a choice."""
    faithfulness: Maybe[dict[str, float]] = ABSENT
    """k -> share of the change kept with only the top k single nodes clean (a screen)."""
    circuit: Maybe[dict[str, Any]] = ABSENT
    """The faithful circuit (nodes, faithfulness, denoising, completeness, ``edge_circuit``), or a ``note``."""
    circuit_targets: Maybe[dict[str, dict[str, Any]]] = ABSENT
    """The first P0 onset: its faithful circuit searched at each faithfulness target of the sensitivity table
    (target -> nodes, size, measures; without edges)."""
    edges: Maybe[dict[str, float]] = ABSENT
    """Edge -> normalized effect (path patching between the kept nodes)."""
    neurons: Maybe[dict[str, float]] = ABSENT
    """Neuron -> normalized effect on the onset's massive dimension at P0."""
    edge_pass: Maybe[dict[str, Any]] = ABSENT
    """The edge pass' metric, signal and candidates (only when nodes were kept)."""
    neuron_pass: Maybe[dict[str, Any]] = ABSENT
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


@dataclass(frozen=True)
class Sensitivity(_Record):
    """How one BOS setting's verdict depends on its thresholds (:mod:`p0circuit.studies.analysis.sensitivity`)."""

    sweeps: list[Sweep]
    """Each threshold swept, with the labels it gives."""
    rows: list[dict[str, Any]]
    """The blocks below the first P0 onset that another onset line makes the onset, each patched as an onset there
    (an :class:`OnsetRow`'s dict)."""

    def _check(self, path: str) -> None:
        for i, row in enumerate(self.rows):
            OnsetRow.from_dict(row, f"the sensitivity rows[{i}]")


@dataclass(frozen=True)
class AnalysisRecord(_Record):
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
    sinks: dict[str, dict[str, Any]]
    """BOS setting -> its sink summary (``sink_rate``, ``norm_stages``, ``massive_dims``, ``sink_positions``, ...),
    or ``{"skipped": why}``."""
    onsets: dict[str, list[dict[str, Any]]]
    """BOS setting -> its onsets, in layer order, each an :class:`OnsetRow`'s dict."""
    variations: dict[str, dict[str, Any]]
    """BOS setting -> every corruption side by side at the first P0 onset, and other prompt lengths."""
    verdict: dict[str, Any]
    """The paper's claim, as measured (``claim``, ``holds``, ``parts`` per BOS setting)."""
    timing: dict[str, Any]
    """Each step's seconds, the unit forward, forwards measured and predicted, the threads, the ETA log."""
    memory: dict[str, Any]
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

    FIX: ClassVar[str] = "re-run `p0circuit analyze` with --fresh (fresh=True) to rewrite it with this p0circuit"

    def _check(self, path: str) -> None:
        for tag, rows in self.onsets.items():  # each row read as an OnsetRow: a missing or unknown key refused
            for i, row in enumerate(rows):
                OnsetRow.from_dict(row, f"the analysis' onsets[{tag!r}][{i}]")

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
