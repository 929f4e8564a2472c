"""Sink states away from position 0: which the analysis studies, on which prompts, and what each is keyed on.

The sink report lists every position class that becomes a sink state (a delimiter's first or later
occurrence, a frequent token such as SmolLM2's ' the'). Each class it lists gets a row of its own, like an onset of P0: at its first layer, on
prompts in which it stands at one index ``at`` in every prompt (windows of the shipped passages,
:func:`~p0circuit.studies.experiments.keyed.aligned_prompts`, so that nodes at that index name the same
thing in every prompt), with the token at ``at`` replaced in place as the corruption, and the
position/token/context test (:func:`~p0circuit.studies.experiments.keyed.keyed_on`).
"""

import statistics
from typing import Any, Optional

from torch import Tensor

from p0circuit.core.errors import BadInputError, P0CircuitError
from p0circuit.measures.positions import MIN_SHARE
from p0circuit.patching.setup import Setup
from p0circuit.studies.analysis.records import SinkSummary
from p0circuit.studies.analysis.setting import Setting
from p0circuit.studies.analysis.summaries import SinkPosition
from p0circuit.studies.findings import Unmeasured
from p0circuit.studies.experiments.keyed import aligned_prompts, keyed_on, sink_rows, target_of

SINK_SHARE = MIN_SHARE
"""Share of the prompts in which a position class must be a sink state (at some layer) to get a row: every class
the sink report lists."""


def label(p: SinkPosition) -> str:
    """A sink position's class, with its commonest token for the catch-all class ``other``."""
    return f"other ({p.tokens[0][0]!r})" if p.where == "other" and p.tokens else p.where


def _ranked(summary: SinkSummary, s: Any) -> list[dict[str, Any]]:
    """Every sink class away from position 0 that the sink report lists, strongest first (mean ratio times share at
    its strongest layer): ``layer`` (its first), ``where`` (the class), ``target`` (what :func:`aligned_prompts` looks
    for; None for a class it cannot place, a later BOS token) and ``at`` (the median index it sat at; ``summary``: a
    BOS setting's sink summary, ``s``: the analysis' settings)."""
    classes: dict[str, list[SinkPosition]] = {}
    for p in summary.sink_positions:
        if not p.where.startswith("P0") and p.share >= SINK_SHARE:
            classes.setdefault(label(p), []).append(p)
    rows = []
    for where, found in classes.items():
        first = min(found, key=lambda p: p.layer)
        target = target_of(first.where, tuple(tuple(t) for t in first.tokens))
        at = min(max(int(statistics.median_low(first.positions)), 1), s.length + int(summary.bos) - 2)
        strength = max(p.ratio * p.share for p in found)
        rows.append((strength, {"layer": first.layer, "where": where, "target": target and list(target), "at": at}))
    rows.sort(key=lambda r: -r[0])
    return [r for _, r in rows]


def plan(summary: SinkSummary, s: Any) -> list[dict[str, Any]]:
    """The rows of the sink states away from position 0: the ``s.max_sinks`` strongest that can be placed."""
    return [r for r in _ranked(summary, s) if r["target"]][:s.max_sinks]


def left_out(summary: SinkSummary, s: Any) -> list[str]:
    """The sink classes away from position 0 that get no row, each with why."""
    kept = {r["where"] for r in plan(summary, s)}
    return [f"{r['where']} (layer {r['layer']}): " + (f"past max_sinks={s.max_sinks}" if r["target"] else
                                                      "a class the shipped passages cannot place")
            for r in _ranked(summary, s) if r["where"] not in kept]


DRAW = 4
"""Windows drawn per prompt wanted: the row keeps those in which its class is a sink state at its index."""


def prompts(setting: Setting, row: dict[str, Any]) -> tuple[Tensor, Tensor, str]:
    """The row's prompts: up to ``s.n_prompts`` windows with its class at index ``at`` (:func:`aligned_prompts`) in
    which it is a sink state there after the row's layer (:func:`sink_rows`), so that the circuit, its neurons and
    the position/token/context test are all measured on prompts that hold the state; the windows drawn in which it
    is *not* a sink state (the contexts of the keyed test's context edit); and what the prompts are, in words."""
    model, s, bos = setting.model, setting.s, setting.bos
    drawn = aligned_prompts(model, tuple(row["target"]), DRAW * s.n_prompts, s.length + int(bos), row["at"], bos=bos,
                            seed=s.seed)
    keep = sink_rows(model, drawn, row["at"], row["layer"], s.norm_threshold)
    if int(keep.sum()) < 2:
        raise BadInputError(f"{row['where']} is a sink state at index {row['at']} after block {row['layer']} in "
                            f"{int(keep.sum())} of {drawn.shape[0]} windows of the passages that put it there; at least "
                            "2 are needed")
    toks = drawn[keep][:s.n_prompts]
    return toks, drawn[~keep], _label(setting, row, toks, int(keep.sum()), int(drawn.shape[0]))


def _label(setting: Setting, row: dict[str, Any], toks: Tensor, held: int, drawn: int) -> str:
    """The row's prompts, in words."""
    model, bos = setting.model, setting.bos
    kind, value = row["target"]
    source = ("windows of the shipped English passages" if getattr(model, "tokenizer", None) is not None
              else "regular random-id prompts")
    what = {"token": f"the token {value!r}", "first": f"a first {value!r}", "later": f"a later {value!r}"}[kind]
    return (f"{toks.shape[0]} {source} x {toks.shape[1] - int(bos)} tokens with {what} at index {row['at']}"
            + (", a BOS token first" if bos else ", no BOS") + f" (of {drawn} such windows, the {held} in which it is a "
            "sink state there)")


NONE_WITHOUT = ("not measured: every prompt drawn with the state's token there holds the state, so there is no context "
                "without it to take (what the context does is then shown by that alone)")
"""The keyed test's context note when the passages hold no window without the state at its index."""


def keyed(setup: Setup, at: int, layer: int, s: Any, contexts: Optional[Tensor] = None) -> dict[str, Any]:
    """:func:`keyed_on`'s record for the state at ``at`` after ``layer`` on ``setup``'s prompts (its BOS choice;
    ``contexts``: prompts without the state, for its context edit), or why it could not run."""
    bos = bool(setup.bos)
    none_without = contexts is not None and contexts.shape[0] == 0  # every window drawn there holds the state
    try:
        found = keyed_on(setup.model, setup.tokens, at, layer, bos=bos, seed=s.seed, threshold=s.norm_threshold,
                         contexts=None if none_without else contexts)
        if none_without and found.context is None and at > int(bos):
            found = found.replace(context_note=NONE_WITHOUT)
        return found.to_dict()
    except P0CircuitError as err:
        return Unmeasured(error=str(err)).to_dict()
