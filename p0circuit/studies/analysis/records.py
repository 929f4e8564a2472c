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
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar, Union

from p0circuit.core.errors import ConfigError

SCHEMA_VERSION = 2
"""The version of ``analysis.json`` and ``analysis.state.json`` this p0circuit writes, and the only one it reads.
Bump it when a key of a record (or of a step's value in the state) is added, removed, renamed or changes
meaning (docs/contributing.md)."""
SCHEMA = "schema"
"""The key of the version in both files."""


class Absent:
    """A key that a record's dict leaves out (``None`` is a value, and JSON holds it): the default of a
    field that some rows have and others lack (a skipped onset has no ``nodes``)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __copy__(self) -> "Absent":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "Absent":
        return self


ABSENT = Absent()
"""The one :class:`Absent`."""
T = TypeVar("T")
Maybe = Union[T, Absent]
"""A field that some rows lack (its key left out of ``to_dict()``)."""


def check_schema(data: Any, source: str, fix: str) -> None:
    """Refuse a file (``data``, read from ``source``) whose schema version is not :data:`SCHEMA_VERSION`,
    saying which it is, which this p0circuit reads, and ``fix``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source} holds a JSON {type(data).__name__}, not an object: not a p0circuit analysis "
                          f"record; {fix}")
    found = data.get(SCHEMA)
    if found == SCHEMA_VERSION and not isinstance(found, bool):
        return
    if found is None:
        said = "has no schema version (it was written by a p0circuit from before the records were versioned)"
    elif isinstance(found, int) and not isinstance(found, bool) and found > SCHEMA_VERSION:
        said = f"has schema version {found} (written by a newer p0circuit; upgrade p0circuit to read it as it is)"
    else:
        said = f"has schema version {found!r}"
    raise ConfigError(f"{source} {said}; this p0circuit reads schema version {SCHEMA_VERSION} only: {fix}")


class _Record:
    """``to_dict``/``from_dict`` for a frozen dataclass whose fields are a JSON object's keys."""

    NESTED: ClassVar[dict[str, type]] = {}
    """Fields that hold another record (read back with its ``from_dict``)."""
    FIX: ClassVar[str] = ""
    """What to do about a file of another schema version (records with a ``schema`` field)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field (``schema`` first), a nested record as its dict, an absent one left out."""
        out: dict[str, Any] = {}
        names = [f.name for f in fields(self)]
        for name in ([SCHEMA] if SCHEMA in names else []) + [n for n in names if n != SCHEMA]:
            value = getattr(self, name)
            if isinstance(value, Absent):
                continue
            out[name] = value.to_dict() if isinstance(value, _Record) else value
        return out

    @classmethod
    def from_dict(cls, data: Any, what: Optional[str] = None) -> Any:
        """The record of a JSON object (``what``: the object, in words, for the errors): its schema version
        checked first where it has one, then a missing or unknown key refused by name."""
        what = what or cls.__name__
        known = [f.name for f in fields(cls)]
        if SCHEMA in known:
            check_schema(data, what, cls.FIX)
        if not isinstance(data, dict):
            raise ConfigError(f"{what} must be a JSON object, got {type(data).__name__}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"{what} lacks the key(s) {missing}; a record's keys are its fields in "
                              f"p0circuit/studies/analysis/records.py ({cls.__name__}; docs/records.md)")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"{what} has the unknown key(s) {unknown}; a record's keys are its fields in "
                              f"p0circuit/studies/analysis/records.py ({cls.__name__}: {known}); a new key is added "
                              "there, with SCHEMA_VERSION bumped (docs/contributing.md)")
        record = cls(**{k: (cls.NESTED[k].from_dict(v, f"{what}, its {k!r}") if k in cls.NESTED else v)
                        for k, v in data.items()})
        record._check(what)
        return record

    def _check(self, what: str) -> None:
        """What a record checks beyond its keys (nothing by default)."""


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

    NESTED: ClassVar[dict[str, type]] = {"header": StateHeader}
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
    keyed_on: Maybe[dict[str, Any]] = ABSENT
    """What the state is keyed on: position, token or context, with the kept shares
    (:class:`~p0circuit.studies.experiments.keyed.KeyedOn`), or an ``error``."""
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
    edges: Maybe[dict[str, float]] = ABSENT
    """Edge -> normalized effect (path patching between the kept nodes)."""
    neurons: Maybe[dict[str, float]] = ABSENT
    """Neuron -> normalized effect on the onset's massive dimension at P0."""
    into_sinks: Maybe[dict[str, Any]] = ABSENT
    """Edges into the next blocks' sink heads' keys and values."""
    edge_pass: Maybe[dict[str, Any]] = ABSENT
    """The edge pass' metric, signal and candidates (only when nodes were kept)."""
    neuron_pass: Maybe[dict[str, Any]] = ABSENT
    """The neuron pass' metric, screen and faithfulness, or a ``note`` saying why none ran."""


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
    variant: Maybe[str] = ABSENT
    """What a model read from a GGUF file is: the release it came from, its quantization, dequantized to float32
    (:func:`p0circuit.models.gguf.variant`); absent for any other model."""
    schema: int = SCHEMA_VERSION
    """The records' version (:data:`SCHEMA_VERSION`)."""

    FIX: ClassVar[str] = "re-run `p0circuit analyze` with --fresh (fresh=True) to rewrite it with this p0circuit"

    def _check(self, what: str) -> None:
        for tag, rows in self.onsets.items():  # each row read as an OnsetRow: a missing or unknown key refused
            for i, row in enumerate(rows):
                OnsetRow.from_dict(row, f"{what}, its onsets[{tag!r}][{i}]")

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
