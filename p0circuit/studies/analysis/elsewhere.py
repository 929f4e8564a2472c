"""Sink states away from position 0: which the analysis studies, on which prompts, and what each is keyed on.

The sink report lists every position class that becomes a sink state (a delimiter's first or later
occurrence, a frequent token such as SmolLM2's ' the'). Each class it lists gets a row of its own, like an onset of P0: at its first layer, on
prompts in which it stands at one index ``at`` in every prompt (windows of the shipped passages,
:func:`~p0circuit.studies.experiments.keyed.aligned_prompts`, so that nodes at that index name the same
thing in every prompt), with the token at ``at`` replaced in place as the corruption, and the
position/token/context test (:func:`~p0circuit.studies.experiments.keyed.keyed_on`).
"""

import statistics
from typing import Any

from torch import Tensor

from p0circuit.core.errors import P0CircuitError
from p0circuit.studies.experiments.keyed import aligned_prompts, keyed_on, target_of

SINK_SHARE = 0.25
"""Share of the prompts in which a position class must be a sink state (at some layer) to get a row: every class
the sink report lists (:func:`~p0circuit.measures.positions.sink_positions`' own ``min_share``)."""


def label(p: dict[str, Any]) -> str:
    """A sink position's class, with its commonest token for the catch-all class ``other``."""
    tokens = p.get("tokens") or []
    return f"other ({tokens[0][0]!r})" if p["where"] == "other" and tokens else p["where"]


def plan(summary: dict[str, Any], s: Any, bos: bool) -> list[dict[str, Any]]:
    """The rows of the sink states away from position 0 (at most ``s.max_sinks``, strongest first: mean ratio
    times share at their strongest layer): ``layer`` (the first layer at :data:`SINK_SHARE`), ``where`` (the
    class), ``target`` (what :func:`aligned_prompts` looks for) and ``at`` (the median index it sat at)."""
    classes: dict[str, list[dict[str, Any]]] = {}
    for p in summary["sink_positions"]:
        if not p["where"].startswith("P0") and p["share"] >= SINK_SHARE:
            classes.setdefault(label(p), []).append(p)
    rows = []
    for where, found in classes.items():
        first = min(found, key=lambda p: p["layer"])
        target = target_of(first["where"], tuple(tuple(t) for t in first.get("tokens") or ()))
        if target is None:  # a later BOS token: not a class aligned_prompts can place
            continue
        at = int(statistics.median_low(first["positions"]))
        at = min(max(at, 1), s.length + int(bos) - 2)
        strength = max(p["ratio"] * p["share"] for p in found)
        rows.append((strength, {"layer": first["layer"], "where": where, "target": list(target), "at": at}))
    rows.sort(key=lambda r: -r[0])
    return [r for _, r in rows[:s.max_sinks]]


def prompts(model: Any, row: dict[str, Any], s: Any, bos: bool) -> Tensor:
    """The row's prompts: its class at index ``at`` in every one (:func:`aligned_prompts`)."""
    return aligned_prompts(model, tuple(row["target"]), s.n_prompts, s.length + int(bos), row["at"], bos=bos,
                           seed=s.seed)


def prompt_label(model: Any, row: dict[str, Any], toks: Tensor, bos: bool) -> str:
    """The row's prompts, in words."""
    kind, value = row["target"]
    source = ("windows of the shipped English passages" if getattr(model, "tokenizer", None) is not None
              else "regular random-id prompts")
    what = {"token": f"the token {value!r}", "first": f"a first {value!r}", "later": f"a later {value!r}"}[kind]
    return (f"{toks.shape[0]} {source} x {toks.shape[1] - int(bos)} tokens with {what} at index {row['at']}"
            + (", a BOS token first" if bos else ", no BOS"))


def keyed(model: Any, toks: Tensor, at: int, layer: int, bos: bool, s: Any) -> dict[str, Any]:
    """:func:`keyed_on`'s record for the state at ``at`` after ``layer``, or why it could not run."""
    try:
        return keyed_on(model, toks, at, layer, bos=bos, seed=s.seed, threshold=s.norm_threshold).to_dict()
    except P0CircuitError as err:
        return {"error": str(err)}
