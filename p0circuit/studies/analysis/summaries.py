"""The records of ``analysis.json``'s per-setting summaries: the variations at the first P0 onset, the verdict and
its parts, what the analysis cost (timing, memory) and each sink position of a sink summary. Frozen dataclasses
whose fields are the JSON keys (:mod:`p0circuit.core.record`), read back typed. Imports no torch."""

from dataclasses import dataclass
from typing import Optional

from p0circuit.core.record import ABSENT, Maybe
from p0circuit.studies.analysis.passes import Normalization, NodeScreen
from p0circuit.studies.analysis.schema import AnalysisPart


@dataclass(frozen=True)
class SinkPosition(AnalysisPart):
    """One (block, position class) of a sink summary that is a sink state (its ``sink_positions``)."""

    layer: int
    """The block after which it is a sink state."""
    where: str
    """The position class (``P0``, ``first ','``, ``later ','``, ``other``, ...)."""
    share: float
    """Share of the prompts in which a position of the class is a sink state there."""
    ratio: float
    """Its mean position norm ratio there."""
    attention: float
    """The mean attention the block's heads give it."""
    max_head_attention: float
    """The largest mean attention one head gives it."""
    positions: list[int]
    """The indices it sat at."""
    tokens: list[tuple[str, int]]
    """Its commonest tokens, each with its count."""


@dataclass(frozen=True, kw_only=True)
class NodePassSummary(AnalysisPart):
    """A node pass in short (a variation's): its metric's change and its strongest nodes. Each key is absent where the
    pass did not run."""

    metric: Maybe[str] = ABSENT
    """The metric (the onset's norm ratio)."""
    clean: Maybe[float] = ABSENT
    """The metric on the clean prompts."""
    corrupted: Maybe[float] = ABSENT
    """The metric on the corrupted prompts."""
    signal: Maybe[bool] = ABSENT
    """Whether clean and corrupted differ enough to normalize effects."""
    normalization: Maybe[Normalization] = ABSENT
    """Whether the normalized effects carry."""
    nodes: Maybe[dict[str, float]] = ABSENT
    """The 8 strongest nodes, node -> normalized effect."""


@dataclass(frozen=True, kw_only=True)
class CorruptionVariation(NodePassSummary):
    """The first P0 onset's node pass under one corruption (a variation), or why it could not run."""

    message: Maybe[str] = ABSENT
    """Why there is no signal (empty with one)."""
    screen: Maybe[Optional[NodeScreen]] = ABSENT
    """How attribution screened the candidates (None: every one patched exactly)."""
    note: Maybe[str] = ABSENT
    """Where the corrupted run has the stronger sink: why its effects measure nothing the sink needs."""
    error: Maybe[str] = ABSENT
    """Why the corruption could not run here (then no other key)."""


@dataclass(frozen=True, kw_only=True)
class LengthVariation(NodePassSummary):
    """The sink report and the first P0 onset's node pass at another prompt length (its pass absent when the onset
    is past this length's blocks)."""

    sink_rate: Optional[float]
    """Share of heads whose attention to position 0 passes the sink line."""
    norm_stages: list[tuple[str, int, Optional[float]]]
    """Every ``["onset" | "erasure", block, ratio]`` of P0's norm ratio."""
    prompts: str
    """The prompts, in words."""
    corruption: Maybe[str] = ABSENT
    """The corruption patched with."""


@dataclass(frozen=True)
class Variations(AnalysisPart):
    """A BOS setting's variations at its first P0 onset: every corruption side by side, and other prompt lengths."""

    layer: int
    """The onset's block."""
    chosen_corruption: str
    """The corruption the analysis chose for this setting (its own pass is reused for it)."""
    corruption: dict[str, CorruptionVariation]
    """Corruption -> the onset's node pass under it."""
    length: dict[str, LengthVariation]
    """Prompt length (text tokens) -> the sink report and node pass there."""


@dataclass(frozen=True)
class Part(AnalysisPart):
    """One part of the paper's claim, judged for one BOS setting (:mod:`.verdict`)."""

    status: str
    """``holds``, ``partially supported``, ``fails`` or ``not applicable``."""
    evidence: str
    """The numbers it rests on, every threshold its label uses printed."""
    why: Maybe[str] = ABSENT
    """Why it is not applicable (its missing premise)."""
    found_at: Maybe[str] = ABSENT
    """Where the mechanism was found, when not as the paper says."""
    partly: Maybe[str] = ABSENT
    """Which half holds ((d) and (e))."""
    strongest_alpha0: Maybe[float] = ABSENT
    """(a) only: the strongest head's mean attention to position 0 from the onset on."""
    min_cos_prompts: Maybe[float] = ABSENT
    """(d) only: the lowest across-prompts cosine over the state's span."""
    min_cos_layers: Maybe[float] = ABSENT
    """(d) only: the lowest cosine with the onset's direction over the span."""


@dataclass(frozen=True)
class Parts(AnalysisPart):
    """Every part of the claim for one BOS setting, by key (:data:`.verdict.PARTS`)."""

    sink: Part
    """(a) position 0 becomes a sink, made by its position."""
    circuit: Part
    """(b) a circuit of layer-0 attention and the layer-0/1 MLPs builds it."""
    amplification: Part
    """(c) those MLPs' neurons write its massive dimension."""
    direction: Part
    """(d) it points along one direction, fixed across prompts and stable across layers."""
    reads: Part
    """(e) the later heads attend to the amplified norm."""


@dataclass(frozen=True)
class Verdict(AnalysisPart):
    """The paper's claim as measured (:func:`.verdict.verdict`)."""

    claim: str
    """Every part without BOS, in words (or why there is no run without BOS)."""
    parts: dict[str, Parts]
    """BOS setting -> its parts."""
    holds: Maybe[bool] = ABSENT
    """Whether every part holds without BOS (absent without that run)."""
    strongest_alpha0: Maybe[float] = ABSENT
    """Without BOS: the strongest head's mean attention to position 0 from the onset on."""
    with_bos_sink_rate: Maybe[Optional[float]] = ABSENT
    """The with-BOS setting's sink rate (when it ran)."""


@dataclass(frozen=True)
class Threads(AnalysisPart):
    """The thread policy at the end of an analysis (:func:`p0circuit.core.threads.status`)."""

    threads: Optional[int]
    """torch's thread count."""
    policy: str
    """Adaptive, or fixed and why."""
    others_cores: float
    """The cores other processes used at the last look."""
    dropped: int
    """How often p0circuit lowered the count."""
    cpus: Optional[int]
    """The machine's CPUs."""


@dataclass(frozen=True)
class Process(AnalysisPart):
    """The steps one process of an analysis ran (a resumed analysis has several)."""

    run: int
    """Which process (0: the first)."""
    steps: int
    """Steps it ran."""
    seconds: float
    """Their seconds."""
    unit_s: float
    """Its own unit forward (seconds)."""
    forwards: Optional[float]
    """Their counted work, in forwards of the batch (None: a step predates the count)."""
    timed_forwards: float
    """Their seconds over its unit forward."""
    slowdown: Optional[float]
    """Their seconds over what the counted work takes at its unit forward's speed."""


@dataclass(frozen=True)
class LeftOut(AnalysisPart):
    """A P0 onset past ``max_onsets`` that was not patched."""

    layer: int
    """Its block."""
    where: str
    """``P0``."""
    ratio: Optional[float]
    """Its norm ratio."""
    predicted_forwards: float
    """What the cost model predicts its steps would take, in forwards of the batch."""


@dataclass(frozen=True)
class Timing(AnalysisPart):
    """What an analysis cost (docs/records.md says each key at length)."""

    seconds: float
    """The steps' seconds (every process')."""
    this_call: float
    """The seconds of this call, from the progress bar's start."""
    forward_s: float
    """The unit forward: one forward of the batch, timed in this process before the steps."""
    import_s: float
    """Seconds this process spent importing p0circuit, torch and TransformerLens."""
    load_s: Optional[float]
    """Seconds loading the model (None: given a model object)."""
    threads: Threads
    """The thread policy."""
    forwards: Optional[float]
    """The steps' counted work, in forwards of the batch (None: a step predates the count)."""
    with_grad: Optional[float]
    """Of it, the work done with a graph recorded."""
    forwards_by_step: dict[str, Optional[float]]
    """Step key -> its counted work."""
    timed_forwards: float
    """This process' steps' seconds over its unit forward."""
    slowdown: Optional[float]
    """Those seconds over what the counted work takes at the unit forward's speed."""
    others_cores: float
    """The cores other processes used on average while the steps ran."""
    processes: list[Process]
    """Per process that ran steps, in order."""
    onsets_left_out: dict[str, list[LeftOut]]
    """BOS setting -> the P0 onsets past ``max_onsets`` not patched."""
    sinks_left_out: dict[str, list[str]]
    """BOS setting -> the sink classes away from position 0 that got no row, each with why."""
    steps: dict[str, float]
    """Step key -> its seconds."""
    predicted_forwards: dict[str, float]
    """Step key -> the cost model's forwards."""
    parts: dict[str, float]
    """Timed parts of this call's node steps (``.../nodes/pass``) -> seconds."""
    eta: list[tuple[float, float]]
    """The progress bar's log: (seconds since the start, estimated total seconds)."""
    report_s: Maybe[float] = ABSENT
    """Seconds making analysis.md and report.html (when written)."""


@dataclass(frozen=True)
class Memory(AnalysisPart):
    """An analysis' memory, in GiB (None where it cannot be read: not Linux, or a step from an older state)."""

    weights: Optional[float]
    """The model's parameters and buffers."""
    at_start: Optional[float]
    """Resident memory when the steps began."""
    process_peak: Optional[float]
    """The process' peak over its whole life."""
    steps: dict[str, Optional[float]]
    """Step key -> its peak resident memory."""

