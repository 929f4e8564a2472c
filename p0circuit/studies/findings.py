"""The typed records of what each study finds: the JSON objects ``analysis.json`` nests in its rows, read back
with their types (:class:`~p0circuit.core.record.Record`: a missing or unknown key, a value of the wrong type or a
non-finite number refused by its key path). One home, imported by the studies that make them and by the analysis'
records; imports no torch, so that an analysis directory is read and checked before any model is loaded.
"""

from dataclasses import dataclass
from typing import Any, Optional, Union

from p0circuit.core.record import Record


@dataclass(frozen=True)
class Unmeasured(Record):
    """A study that could not run on this onset, and why (in the place of its record)."""

    error: str
    """Why, with what would let it run."""


# Keyed on what (:mod:`p0circuit.studies.experiments.keyed`)
@dataclass(frozen=True)
class Kept(Record):
    """One edit's kept shares over the prompts that hold the state."""

    mean: float
    """Mean of the per-prompt kept shares."""
    min: float
    """The lowest prompt's."""
    prompts_kept: float
    """Share of the prompts whose own share reaches the keep line."""
    n: int
    """Prompts the edit was measured on (those holding the state where the edit changed something)."""
    interval: list[float]
    """The 95% bootstrap interval of ``mean`` over those prompts (:func:`p0circuit.measures.spread.interval`)."""


@dataclass(frozen=True)
class KeyedOn(Record):
    """What :func:`keyed_on` measured."""

    at: int
    """The state's index in the prompts."""
    layer: int
    """The block whose output is read."""
    prompts: int
    """Prompts in which position ``at`` is a sink state (those measured)."""
    of: int
    """Prompts given."""
    clean: float
    """Mean position norm ratio of the state at ``at`` in those prompts."""
    clean_min: float
    """The lowest of those prompts' ratios."""
    swapped: Kept
    """Kept with the token at ``at`` replaced in place."""
    follows: Kept
    """Kept at the token's new index after :data:`MOVE` tokens were put in front."""
    stays: Kept
    """Kept at the old index after that move (another token there)."""
    context: Optional[Kept]
    """Kept with every position before ``at`` from a prompt without the state (None: not measured, see
    ``context_note``)."""
    context_note: str
    """Where the contexts came from, or why the context edit was not measured."""
    copies: Optional[Kept]
    """Kept at the token's new index after :data:`MOVE` copies of it were put in front (position 0 only)."""
    keep: float
    """The keep line of the verdict."""
    verdict: str
    """One of :data:`VERDICTS`."""
    means: str
    """What *position* means here: ``no other token before it`` (the copies keep the state), ``the absolute
    position`` (they lose it), or empty (not measured)."""
    reading: str
    """The verdict in words for this state (with BOS at position 0: whether it follows BOS when moved)."""
    evidence: str
    """The numbers, in words."""


# What the sink reads (:mod:`p0circuit.studies.experiments.reads`)
@dataclass(frozen=True)
class Edit(Record):
    """One edit's effect (the clean run's, unedited, has ``kept`` 1)."""

    attention: Optional[float]
    """Mean alpha_0 of the window's sink heads (mean over prompts; None: the window holds no sink head)."""
    kept: Optional[float]
    """Share of the window's sink heads' excess attention to P0 over uniform that is kept (None: no sink head)."""
    kept_min: Optional[float]
    """The lowest share of one prompt (prompts with too little clean excess left out; None: none left)."""
    prompts_kept: Optional[float]
    """Share of those prompts whose own share is at least the keep line."""
    later_kept: Optional[float]
    """The same share over the sink heads of every block after the onset, the window's block left out where it is
    :attr:`SinkReads.scale_blind` (None: none there)."""
    per_block: list[float]
    """Mean alpha_0 over every head of each block after the onset."""
    sink_rate: float
    """Sink_0^eps over the blocks after the onset (share of their heads with alpha_0 > eps)."""
    loss: float
    """Next-token loss (mean cross-entropy, nats) on the prompts."""


@dataclass(frozen=True)
class SinkReads(Record):
    """What :func:`sink_reads` measured."""

    layer: int
    """The onset: the block after which the P0 state is edited."""
    window: list[int]
    """The blocks whose sink heads are read first."""
    sink_heads: list[str]
    """The window's sink heads (``A3.H0``: alpha_0 > eps in the clean run)."""
    later_heads: int
    """Sink heads in every block after the onset (the window's block left out where it is scale-blind)."""
    uniform: float
    """alpha_0 of uniform causal attention on these prompts (the floor of the kept shares)."""
    dims: list[int]
    """The massive dimensions ``massive_removed`` removes (none: that edit is left out)."""
    eps: float
    """alpha_0 above which a head sinks to P0."""
    keep: float
    """The keep line the answers use."""
    clean: Edit
    """The unedited run."""
    edits: dict[str, Edit]
    """Each edit of :data:`EDITS` that applies, by name."""
    reads: str
    """What the window's sink heads read: one of :data:`READS`, or ``not applicable (why)``."""
    reads_later: str
    """The same over every later block."""
    control: bool
    """The positive control (``random_direction``) lost the attention, as it must for the answer to mean anything."""
    evidence: str
    """The numbers, in words."""
    scale_blind: bool = False
    """The window is the block right after the onset and its attention reads the state through a normalization, which
    ignores its scale: there ``rescaled`` keeps the attention by arithmetic and ``direction_replaced`` and
    ``state_replaced`` point the same way, so only the later blocks' shares can tell the norm from the direction."""


# Detection by undiluted attention (:mod:`p0circuit.studies.experiments.detection`)
@dataclass(frozen=True)
class Detection(Record):
    """What :func:`diagonal_attention` measured."""

    layer: int
    """The onset: the block whose output is compared."""
    upto: list[int]
    """Each ``k``: self-only attention in blocks ``0..k``."""
    norm_share: list[float]
    """Per ``k``, the other positions' norm over the clean P0 state's, mean over positions and prompts."""
    norm_share_min: list[float]
    """Per ``k``, the lowest prompt's mean over its positions."""
    cosine: list[float]
    """Per ``k``, the other positions' cosine with the clean P0 state, mean over positions and prompts."""
    clean_norm_share: float
    """The same share with the attention as it is (how ordinary the other positions are)."""
    clean_cosine: float
    """The same cosine with the attention as it is."""
    first: Optional[int]
    """The smallest ``k`` at which the other positions reach ``keep`` of P0's norm and ``cos`` of its direction (None:
    no ``k`` up to the onset)."""
    keep: float
    """The line on the norm share."""
    cos: float
    """The line on the cosine."""
    evidence: str
    """The numbers, in words."""


# Super weights (:mod:`p0circuit.studies.experiments.super_weights`)
@dataclass(frozen=True)
class Weight(Record):
    """One entry of a block's MLP down projection."""

    block: int
    """The block."""
    neuron: int
    """Its row: the neuron that writes through it."""
    dim: int
    """Its column: the residual dimension it writes."""
    value: float
    """The weight."""
    rank: int
    """Its rank by magnitude among the matrix's entries (1: the largest)."""
    z: float
    """Standard deviations from the mean of the matrix's entries."""
    massive: bool
    """Whether ``dim`` is a massive dimension at P0 (the ones passed in)."""


@dataclass(frozen=True)
class Zeroed(Record):
    """What zeroing weights did."""

    weights: list[str]
    """The weights zeroed (``M2.W_out[90, 507]``)."""
    norm_ratio: float
    """The P0 norm ratio after the onset."""
    attention: Optional[float]
    """Mean alpha_0 over every head of the blocks after the onset (None: no block after it)."""
    sink_rate: Optional[float]
    """Sink_0^eps over the blocks after the onset (None: no block after it)."""
    loss: float
    """Next-token loss (nats)."""


@dataclass(frozen=True)
class SuperWeights(Record):
    """What :func:`super_weights` measured."""

    layer: int
    """The onset whose norm ratio is read."""
    weights: list[Weight]
    """The entries of the neurons' rows in the massive dimensions' columns."""
    clean: Zeroed
    """The model as it is."""
    zeroed: list[Zeroed]
    """Each weight zeroed alone, then the strongest (up to :data:`TOGETHER`) together."""
    evidence: str
    """The numbers, in words."""


# Every first token (:mod:`p0circuit.studies.experiments.first_tokens`)
@dataclass(frozen=True)
class TokenPoint(Record):
    """One first token's P0 state."""

    id: int
    """The token id."""
    text: str
    """Its text."""
    ratio: float
    """Its P0 state's norm over the reference prompts' ordinary positions' mean norm."""
    cosine: float
    """Its cosine with the reference prompts' mean P0 direction."""
    below: float
    """Share of the vocabulary whose ratio is lower."""


@dataclass(frozen=True)
class FirstTokens(Record):
    """What :func:`first_token_map` measured."""

    layer: int
    """The block after which the P0 state is read."""
    vocab: int
    """Tokens measured (the whole vocabulary, or a sample of it)."""
    of: int
    """The vocabulary's size."""
    reference: str
    """What the ratio's denominator and the direction come from."""
    threshold: float
    """The onset line on the ratio (a norm ratio, not the alpha_0 sink line)."""
    cos: float
    """The line on the cosine."""
    quantiles: dict[str, float]
    """Quantile (``"0.01"``) -> the ratio there."""
    cos_quantiles: dict[str, float]
    """Quantile -> the cosine there."""
    sinks: float
    """Share of first tokens whose state reaches the onset line."""
    sinks_interval: Optional[list[float]]
    """Where the vocabulary was sampled: the 95% Wilson interval of the share over the randomly drawn tokens only (the
    special tokens and the prompts' first tokens, always measured, are in ``sinks`` but not in it; the evidence gives
    the drawn tokens' own share beside it); None: every token measured."""
    aligned: float
    """Share of first tokens whose state's cosine reaches the line."""
    not_sinks: int
    """First tokens whose state stays below the sink line."""
    lowest: list[TokenPoint]
    """The tokens with the lowest ratios (at most :data:`NAMED`)."""
    special: list[TokenPoint]
    """The tokenizer's special tokens."""
    prompts: list[TokenPoint]
    """The reference prompts' own first tokens (each once)."""
    evidence: str
    """The numbers, in words."""


# The sink's own circuit (:mod:`p0circuit.studies.analysis.sink_circuit`)
@dataclass(frozen=True)
class SinkRates(Record):
    """Sink_0^eps of the sink heads' blocks in three runs."""

    clean: float
    """The clean run."""
    corrupted: float
    """The corrupted run."""
    circuit: Optional[float]
    """The clean run with every candidate outside the circuit corrupted (None: no circuit)."""


@dataclass(frozen=True)
class SinkCircuit(Record):
    """What :func:`sink_circuit` found."""

    heads: list[str]
    """The sink heads whose attention to P0 is the metric (``A3.H0``)."""
    blocks: list[int]
    """Their blocks."""
    node_pass: dict[str, Any]
    """The node pass (:func:`.steps.nodes`): the metric, clean and corrupted values, signal, effects."""
    circuit: dict[str, Any]
    """The faithful circuit with its edges (:func:`.steps.circuit`), or a ``note``."""
    sink_rate: SinkRates
    """Sink_0^eps of ``blocks`` with and without the circuit."""
    shared: list[str]
    """Nodes in both this circuit and the norm circuit of the onset."""
    only_sink: list[str]
    """Nodes in this circuit only."""
    only_norm: list[str]
    """Nodes in the norm circuit only."""
    into_keys: dict[str, float]
    """Each edge from the circuit's nodes at P0 into a sink head's key (its key/value head's under grouped-query
    attention), path patched alone: those at the threshold or above, with their normalized effect."""
    into_candidates: int
    """How many such edges were patched."""
    evidence: str
    """What it found, in words."""


# Spread over prompts (:mod:`p0circuit.studies.analysis.spread`)
@dataclass(frozen=True)
class Interval(Record):
    """A mean over prompts with its spread."""

    mean: float
    """The value over all the prompts (a mean, or a ratio of means)."""
    low: float
    """The 95% bootstrap interval's lower end."""
    high: float
    """Its upper end."""
    min: float
    """The lowest single prompt's value."""
    n: int
    """Prompts."""


@dataclass(frozen=True)
class LengthRow(Record):
    """The P0 norm ratio at one prompt length."""

    length: int
    """Tokens per prompt (a BOS token adds one)."""
    onset: Optional[int]
    """The first block where the mean ratio reaches the line (None: none)."""
    erasure: Optional[int]
    """The first block after it where the ratio falls back below the line (None: it never does)."""
    at_onset: Optional[float]
    """The ratio at the analysis' onset block (None: the model has fewer blocks)."""
    peak: float
    """The largest mean ratio over the blocks."""
    peak_block: int
    """Where it is."""


@dataclass(frozen=True)
class Spread(Record):
    """The headline numbers of one onset over many prompts, with intervals and per-prompt minima."""

    layer: int
    """The onset."""
    prompts: str
    """The prompts, in words."""
    resamples: int
    """Bootstrap resamples of each interval."""
    ratio: Interval
    """The P0 norm ratio after the onset, per prompt."""
    reaches: float
    """Share of the prompts whose own ratio reaches the onset line."""
    lowest: str
    """The prompt with the lowest ratio, by its first tokens."""
    keyed: Union[KeyedOn, Unmeasured]
    """The keyed-on test on these prompts (its record, or why it did not run)."""
    faithfulness: Optional[Interval]
    """The onset's faithful circuit, found on the analysis' prompts, evaluated on these: the share of the change it
    keeps (a ratio of means; ``min`` the lowest prompt's own share); None without a circuit."""
    neuron: Optional[Interval]
    """The strongest neuron's share of the massive dimension's change on these prompts; None without one."""
    neuron_name: str
    """That neuron (empty without one)."""
    direction: Interval
    """h_0's mean pairwise cosine across these prompts (``min``: the prompt least like the others, its mean cosine)."""
    direction_ordinary: float
    """The same for ordinary positions (the baseline)."""
    lengths: list[LengthRow]
    """The ratio's dependence on prompt length."""
    evidence: str
    """The numbers, in words."""


# How the verdict depends on its thresholds (:mod:`p0circuit.studies.analysis.sensitivity`)
@dataclass(frozen=True)
class Sweep(Record):
    """The verdict's labels as one threshold moves over a stated range, the others as the analysis used them."""

    threshold: str
    """The threshold's name (``onset line``)."""
    meaning: str
    """What it decides, in words."""
    used: float
    """The value the verdict used."""
    values: list[float]
    """The values swept."""
    parts: dict[str, list[str]]
    """Part key (``circuit``) -> its label at each value."""
    flips: list[str]
    """Where a part's answer changes, in words (``(b) holds at 3, partially supported at 4``)."""


# Controls that can fail (:func:`p0circuit.studies.analysis.run._controls`)
@dataclass(frozen=True)
class Control(Record):
    """One control of an onset: what it does, what the mechanism predicts, what was measured, and what a pass and a
    failure would mean."""

    name: str
    """``resample``, ``copies`` (corruptions) or ``random direction`` (an edit of the P0 state)."""
    kind: str
    """``negative`` (the mechanism predicts no change) or ``positive`` (the metric must move)."""
    does: str
    """What it does, in words."""
    expects: str
    """What the mechanism as measured predicts."""
    observed: str
    """What was measured."""
    passed: Optional[bool]
    """Whether it came out as predicted (None: not measured)."""
    meaning: str
    """What this outcome means."""


# Special tokens mid-prompt (:mod:`p0circuit.studies.experiments.special_tokens`)
@dataclass(frozen=True)
class SpecialToken(Record):
    """One special token put in the middle of every prompt."""

    id: int
    """Its id."""
    text: str
    """Its text."""
    at: int
    """The index it was put at."""
    first_block: Optional[int]
    """The first block after which its position norm ratio reaches the onset line (None: never)."""
    peak: float
    """Its largest mean position norm ratio over the blocks."""
    peak_block: int
    """Where."""
    attention: float
    """The mean attention the queries after it give it in the block after its peak (every head; the last block's own
    when the peak is the last block)."""
    max_head_attention: float
    """The strongest head's."""
    called: str
    """``sink``, ``massive-norm state`` (large, but no head attends to it above eps) or ``ordinary``."""
