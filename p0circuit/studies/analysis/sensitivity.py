"""How much the verdict depends on its thresholds: each threshold swept over a stated range, the labels it gives.

Every part of the verdict (:mod:`.verdict`) is a line drawn through a measured number: the onset line on the P0
norm ratio (which block is *the* onset), the sink line on alpha_0, the keep line of the keyed-on test and of what
the sink reads, the cosine line of the direction, the faithfulness target and node budget of a faithful circuit,
and the effect line of the neurons. :func:`sweeps` moves one line at a time over the range in :data:`RANGES`,
keeps the others at the analysis' values, and judges the parts again from what the analysis measured: the
lines on stored numbers (alpha_0, the kept shares, the cosines, the neuron effects, a circuit's size) cost
nothing; another faithfulness target is searched again on the onset's result (in its node step); another onset
line moves the onset to another block, whose parts are judged from that block's own row (the analysis measures
the blocks below its onset for this, and any later onset it patched; a block it did not measure is said so).
A label that changes inside a range is a *flip*, said in words.
"""

from typing import Any, Callable, Optional

from p0circuit.core.defaults import ALPHA_LINE, CIRCUIT_THRESHOLD, DIRECTION_COS, KEEPS, NORM_THRESHOLD
from p0circuit.studies.analysis.verdict import PARTS, judge, label
from p0circuit.studies.experiments.keyed import reading_of, verdict_of
from p0circuit.studies.experiments.reads import reads_of
from p0circuit.studies.analysis.passes import NodeCircuit
from p0circuit.studies.analysis.records import OnsetRow, SinkSummary
from p0circuit.studies.findings import KeyedOn, SinkReads, Sweep

ONSET_LINES = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 16.0)
"""Onset lines on the P0 norm ratio."""
RANGES: dict[str, tuple[tuple[float, ...], str]] = {
    "onset line": (ONSET_LINES, "the P0 norm ratio at which a block is an onset (which block the parts are judged at)"),
    "sink line": ((0.3, 0.4, 0.5, 0.6, 0.7), "alpha_0 of the strongest head above which position 0 is a sink (a)"),
    "keep line": ((0.3, 0.4, 0.5, 0.6, 0.7), "the kept share at which an edit keeps the state (a) or its attention (e)"),
    "cosine line": ((0.8, 0.85, 0.9, 0.95, 0.99), "the cosine at which the direction is fixed (d)"),
    "faithfulness target": ((0.8, 0.9, 0.95), "the share of the change a faithful circuit keeps (b)"),
    "node budget": ((10.0, 15.0, 20.0, 30.0, 40.0), "the most nodes a faithful circuit may hold (b)"),
    "effect line": ((0.05, 0.1, 0.2, 0.3), "the share of the change a neuron carries to count (c)"),
}
"""Each threshold's range and what it decides."""
TARGETS = RANGES["faithfulness target"][0]
"""The faithfulness targets the onset's node step searches (:func:`target_circuits`)."""


def stages(ratios: list[float], line: float) -> list[list[Any]]:
    """The P0 norm stages (``[kind, block, ratio]``) of the per-block mean ratios at ``line``."""
    out, above = [], False
    for layer, r in enumerate(ratios):
        now = r is not None and r == r and r >= line
        if now != above:
            out.append(["onset" if now else "erasure", layer, r])
            above = now
    return out


def first_onsets(ratios: list[float]) -> dict[float, Optional[int]]:
    """Each onset line of :data:`ONSET_LINES` -> the block of its first onset (None: none)."""
    return {line: next((s[1] for s in stages(ratios, line) if s[0] == "onset"), None) for line in ONSET_LINES}


def _rekeyed(summary: SinkSummary, row: OnsetRow, keep: float) -> OnsetRow:
    """``row`` (of the BOS setting whose sink summary is ``summary``) with its keyed-on verdict and what the sink reads
    judged again at the keep line ``keep``."""
    k = row.keyed_on
    if isinstance(k, KeyedOn):
        mean = lambda e: None if e is None else e.mean  # noqa: E731
        called = verdict_of(mean(k.swapped), mean(k.follows), mean(k.stays), mean(k.context), keep)
        row = row.replace(keyed_on=k.replace(verdict=called, reading=reading_of(
            called, k.means, summary.bos and row.at == 0, mean(k.follows), keep)))
    r = row.reads
    if isinstance(r, SinkReads) and r.control:
        kept = lambda e, f: getattr(r.edits.get(e), f, None)  # noqa: E731
        row = row.replace(reads=r.replace(
            reads=reads_of(kept("rescaled", "kept"), kept("direction_replaced", "kept"), keep),
            reads_later=reads_of(kept("rescaled", "later_kept"), kept("direction_replaced", "later_kept"), keep)))
    return row


def _budgeted(row: OnsetRow, budget: int) -> OnsetRow:
    """``row`` with its faithful circuit judged again against a node budget of ``budget``."""
    c = row.circuit
    if not isinstance(c, NodeCircuit):
        return row
    st = c.settings
    target = st.get("target", 0.9)
    short = ([f"{c.size} nodes, more than the budget of {budget}"] if c.size > budget else []) + \
        ([f"faithfulness {c.faithfulness:.3f} < {target}"] if c.faithfulness < target else []) + \
        ([f"denoising {c.denoising:.3f} < {target}"] if st.get("require_denoising", True)
         and c.denoising is not None and c.denoising < target else [])
    return row.replace(circuit=c.replace(faithful=not short, why="; ".join(short), settings={**st, "max_size": budget}))


def _targeted(row: OnsetRow, target: float) -> Optional[OnsetRow]:
    """``row`` with the circuit its node step searched at faithfulness target ``target`` (None: not searched)."""
    found = (row.circuit_targets or {}).get(f"{target:g}")
    return None if found is None else row.replace(circuit=found)


def sweeps(summary: SinkSummary, first: Optional[OnsetRow], rows: dict[int, OnsetRow],
           settings: dict[str, Any]) -> list[Sweep]:
    """Every threshold of :data:`RANGES` swept for one BOS setting: ``summary`` its sink summary, ``first`` its first
    P0 onset's row (or None), ``rows`` every P0 row it measured by block (the onsets and the blocks below the first),
    ``settings`` the analysis' settings (as JSON)."""
    line = settings.get("norm_threshold", NORM_THRESHOLD)
    threshold = settings.get("threshold", CIRCUIT_THRESHOLD)
    base = dict(line=line, alpha_line=ALPHA_LINE, cos=DIRECTION_COS, threshold=threshold)

    def at(row: Optional[OnsetRow], **change: Any) -> dict[str, str]:
        parts = judge(change.pop("summary", summary), row, **{**base, **change})
        return {key: label(getattr(parts, key)) for key, _, _ in PARTS}

    out = []

    def sweep(name: str, used: float, judged: Callable[[float], dict[str, str]]) -> None:
        values, meaning = RANGES[name]
        labels = [judged(v) for v in values]
        parts = {key: [lab[key] for lab in labels] for key, _, _ in PARTS}
        out.append(Sweep(threshold=name, meaning=meaning, used=used, values=list(values),
                         parts={k: v for k, v in parts.items() if len(set(v)) > 1 or name in _AFFECTS.get(k, ())},
                         flips=_flips(values, parts)))

    ratios = summary.norm_ratio

    def onset_line(v: float) -> dict[str, str]:
        block = next((s[1] for s in stages(ratios, v) if s[0] == "onset"), None)
        moved = summary.replace(norm_stages=[tuple(s) for s in stages(ratios, v)])
        row = rows.get(block) if block is not None else None
        judged = at(row, summary=moved, line=v)
        if block is not None and row is None:
            for key in ("sink", "circuit", "amplification", "reads"):
                judged[key] = f"not measured (the onset moves to block {block}, which this analysis did not patch)"
        return judged

    sweep("onset line", line, onset_line)
    sweep("sink line", ALPHA_LINE, lambda v: at(first, alpha_line=v))
    sweep("keep line", KEEPS, lambda v: at(None if first is None else _rekeyed(summary, first, v)))
    sweep("cosine line", DIRECTION_COS, lambda v: at(first, cos=v))

    def target(v: float) -> dict[str, str]:
        row = None if first is None else _targeted(first, v)
        judged = at(row if row is not None else first)
        if first is not None and row is None and isinstance(first.circuit, NodeCircuit):
            judged["circuit"] = "not measured (this target was not searched)"
        return judged

    circuit = first.circuit if first is not None and isinstance(first.circuit, NodeCircuit) else None
    sweep("faithfulness target", float(circuit.settings.get("target", 0.9) if circuit else 0.9), target)
    budget = float(circuit.settings.get("max_size", 20) if circuit else 20)
    sweep("node budget", budget, lambda v: at(None if first is None else _budgeted(first, int(v))))
    sweep("effect line", threshold, lambda v: at(first, threshold=v))
    return out


_AFFECTS = {"sink": ("onset line", "sink line", "keep line"), "circuit": ("onset line", "faithfulness target",
            "node budget"), "amplification": ("onset line", "effect line"), "direction": ("onset line", "cosine line"),
            "reads": ("onset line", "keep line")}
"""The thresholds each part reads (its labels are listed for these even when they do not change)."""


def _flips(values: tuple[float, ...], parts: dict[str, list[str]]) -> list[str]:
    letters = {key: letter for key, letter, _ in PARTS}
    out = []
    for key, labels in parts.items():
        for (v0, a), (v1, b) in zip(zip(values, labels), zip(values[1:], labels[1:])):
            if a.split(" (")[0] != b.split(" (")[0]:
                out.append(f"({letters[key]}) {a.split(' (')[0]} at {v0:g}, {b.split(' (')[0]} at {v1:g}")
    return out
