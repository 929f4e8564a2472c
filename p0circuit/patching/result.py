"""Patching results: raw and normalized effects, the signal check, and views of them: a table,
a tensor shaped like the model, a :class:`~p0circuit.core.types.Circuit`."""

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import pandas as pd
import torch
from torch import Tensor

from p0circuit.core.defaults import CIRCUIT_THRESHOLD
from p0circuit.core.errors import BadInputError, NonFiniteError, non_finite_fix
from p0circuit.core.types import REST, Circuit, Edge, Kind, Node, effect_grid
from p0circuit.models.tokens import bos_id
from p0circuit.patching.corruptions import advice


@dataclass
class PatchResult:
    """Effects of patching each node or edge, raw and normalized.

    ``raw[name]`` is the metric of the patched run. ``normalized[name]`` is the share of the
    clean-to-corrupted change that patching this node/edge alone reproduces: in the ``noise``
    direction ``(clean - patched) / (clean - corrupted)``, in the ``denoise`` direction
    ``(patched - corrupted) / (clean - corrupted)``. When the clean and corrupted metrics are
    indistinguishable (``signal`` is False) the normalized values are NaN and ``message`` says why.
    """

    method: str
    """The registered method's name (``activation``, ``path``, ``attribution``, ...)."""
    level: str
    """What the effects are over: ``node`` (names like ``A0.H1@0``) or ``edge`` (``M0@0->M1@0.mlp_in``)."""
    corruption: str
    """Corruption name."""
    metric: str
    """Metric name."""
    direction: str
    """``noise`` (corrupted values into the clean run) or ``denoise`` (the reverse)."""
    clean_metric: float
    """Metric of the clean run."""
    corrupted_metric: float
    """Metric of the fully corrupted reference."""
    raw: dict[str, float]
    """Patched metric per node or edge name."""
    normalized: dict[str, float]
    """Normalized effect per node or edge name (NaN without signal)."""
    signal: bool
    """Whether clean and corrupted metrics differ enough to normalize."""
    message: str = ""
    """Why there is no signal, or notes."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Everything needed to reproduce the result (the setup's description among it: ``Setup.describe``)."""
    setup: Any = field(default=None, repr=False, compare=False)
    """The checked :class:`~p0circuit.patching.setup.Setup` it was computed on (model, tokens, BOS choice,
    corruption and metric with their parameters), which the circuit searches read; None for a result
    rebuilt from its saved numbers or unpickled (records keep only its description)."""

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (and deep-copied) without its setup, which holds the model: a copy carries the numbers and
        ``settings`` (the setup's description); a search on it takes ``setup=`` again."""
        return {**self.__dict__, "setup": None}

    @property
    def names(self) -> list[str]:
        """Node or edge names, in order."""
        return list(self.raw)

    def effect(self, name: str) -> float:
        """Normalized effect of one node or edge."""
        return self.normalized[name]

    def kept(self, threshold: float) -> list[str]:
        """Names whose |normalized effect| >= ``threshold`` (NaN effects never pass)."""
        return [n for n, v in self.normalized.items() if not math.isnan(v) and abs(v) >= threshold]

    def strengths(self) -> dict[str, float]:
        """|effect| of every name, for ranking a search that must corrupt all of them (a circuit's
        complement, a faithfulness curve). A name left unexamined (NaN with a signal, as ``triage`` leaves
        all but its top and sampled nodes) ranks below every measured nonzero one (the screen judged it weaker than
        its top), in the order of the screen's estimates when the result carries them
        (``settings["estimates"]``); it stays a candidate either way, so whatever keeps a circuit's
        complement corrupted corrupts it too. Empty without a signal."""
        if not self.signal:
            return {}
        measured = {n: abs(v) for n, v in self.normalized.items() if math.isfinite(v)}
        unexamined = [n for n in self.normalized if n not in measured]
        if not unexamined:
            return measured
        # below every measured one (the screen judged them weaker than its top), in the screen's order
        estimates = {n: abs(self.settings.get("estimates", {}).get(n, 0.0)) for n in unexamined}
        floor = min((v for v in measured.values() if v > 0), default=1.0)
        scale = 0.5 * floor / max(max(estimates.values()), 1e-30)
        return {n: measured[n] if n in measured else estimates[n] * scale for n in self.normalized}

    def parsed(self) -> list[Union[Node, Edge]]:
        """Every name as a :class:`Node` or :class:`Edge`, by the result's level."""
        parse = Edge.parse if self.level == "edge" else Node.parse
        return [parse(n) for n in self.names]

    def to_circuit(self, threshold: float = CIRCUIT_THRESHOLD, **settings: Any) -> Circuit:
        """Nodes/edges whose |normalized effect| >= threshold; effects of all candidates kept.
        ``settings`` are added to the circuit's settings (the record of how it was obtained)."""
        keep = self.kept(threshold)
        record = {**self.settings, "method": self.method, "level": self.level, "corruption": self.corruption,
                  "metric": self.metric, "direction": self.direction, "threshold": threshold,
                  "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                  "signal": self.signal, "message": self.message, **settings}
        if self.level == "edge":
            edges = tuple(Edge.parse(n) for n in keep)
            nodes = tuple({e.src for e in edges} | {e.dst for e in edges})
            return Circuit(nodes=nodes, edges=edges, edge_effects=dict(self.normalized), settings=record)
        return Circuit(nodes=tuple(Node.parse(n) for n in keep), node_effects=dict(self.normalized), settings=record)

    def to_frame(self) -> pd.DataFrame:
        """One row per node or edge, largest |normalized effect| first: ``raw`` (the metric with this
        patch applied), ``effect`` (how much the patch changed the metric: ``raw`` minus the run it was
        patched into, the clean one for ``noise``, the corrupted one for ``denoise``), ``normalized``
        (the share of the clean-to-corrupted change), and the node's (the edge's receiver's) kind,
        layer, head and position."""
        rows = []
        base = self.clean_metric if self.direction == "noise" else self.corrupted_metric
        for name, item in zip(self.names, self.parsed()):
            node = item.dst if isinstance(item, Edge) else item
            row: dict[str, Any] = {"name": name, "raw": self.raw[name], "effect": self.raw[name] - base,
                                   "normalized": self.normalized[name],
                                   "kind": node.kind.value, "layer": node.layer, "head": node.head, "pos": node.pos}
            if isinstance(item, Edge):
                row.update(sender=item.src.name, input=item.input.value)
            rows.append(row)
        frame = pd.DataFrame(rows)
        if len(frame):
            frame = frame.reindex(frame["normalized"].abs().sort_values(ascending=False, na_position="last").index)
        return frame.set_index("name")

    @property
    def positions(self) -> list[Union[int, str]]:
        """The position classes of the result's nodes, in order (named positions, then ``"rest"``)."""
        found = {(item.dst if isinstance(item, Edge) else item).pos for item in self.parsed()}
        return sorted((p for p in found if p != REST), key=int) + ([REST] if REST in found else [])

    def to_tensor(self, kind: str = "head", normalized: bool = True) -> Tensor:
        """Effects shaped like the model, as TransformerLens' patching functions return them:
        ``[layer, pos, head]`` for ``kind="head"``, ``[layer, pos]`` for ``kind="mlp"``; the position
        axis follows :attr:`positions`, and components that were not patched are NaN. Node results only."""
        if self.level != "node":
            raise BadInputError("to_tensor needs a node-level result; edge results have no [layer, pos, head] shape (use to_frame)")
        kinds = {"head": Kind.HEAD, "mlp": Kind.MLP}
        if kind not in kinds:
            raise BadInputError(f"kind must be 'head' or 'mlp', got {kind!r}")
        n_layers, n_heads = self.settings.get("n_layers"), self.settings.get("n_heads")
        if n_layers is None or n_heads is None:
            raise BadInputError("this result does not record the model's shape (n_layers, n_heads); use to_frame")
        values = self.normalized if normalized else self.raw
        return torch.tensor(effect_grid(self.parsed(), values, kinds[kind], n_layers, self.positions,
                                        n_heads if kind == "head" else 0), dtype=torch.float32)

    def __str__(self) -> str:
        head = (f"{self.method} patching ({self.level}s), corruption={self.corruption}, metric={self.metric}, "
                f"direction={self.direction}: clean={self.clean_metric:.4g} corrupted={self.corrupted_metric:.4g}")
        if not self.signal:
            return head + "\nNO SIGNAL: " + self.message
        rows = sorted(self.normalized.items(), key=lambda kv: -abs(kv[1]))
        return head + "\n" + "\n".join(f"  {n:32s} {v:+.4g}" for n, v in rows[:20])


def normalize(
    clean: float, corrupted: float, raw: dict[str, float], direction: str, min_signal: float, hint: str = "",
    unit: str = "",
) -> tuple[dict[str, float], bool, str]:
    """Normalized effects, whether there is signal, and a message when there is not (ending with
    ``hint``: which corruption fits instead, :func:`p0circuit.patching.corruptions.advice`). ``unit``
    (the metric's ``signal_unit``): empty, ``min_signal`` is a share of the metric's scale; else an
    absolute change in that unit."""
    gap = clean - corrupted
    scale = max(abs(clean), abs(corrupted), 1e-12)
    bound = min_signal if unit else min_signal * scale
    if abs(gap) < bound or gap == 0:
        judged = (f"less than min_signal={min_signal} {unit} (an absolute change: this metric is in {unit})" if unit
                  else f"less than the threshold {bound:.3g} (min_signal={min_signal} times the larger of the two in size)")
        msg = (
            f"clean ({clean:.6g}) and corrupted ({corrupted:.6g}) metrics differ by {abs(gap):.3g}, {judged}: this "
            "corruption does not change the metric, so no component can be credited" + (f" ({hint})" if hint else "")
        )
        return {k: math.nan for k in raw}, False, msg
    if direction == "noise":
        return {k: (clean - v) / gap for k, v in raw.items()}, True, ""
    return {k: (v - corrupted) / gap for k, v in raw.items()}, True, ""


def finite(value: float, setup: Any, where: str) -> float:
    """``value`` when it is a finite number, else the engine's :class:`NonFiniteError` naming ``where`` (which
    patch, search step or run gave it) and the fix: every number of a result or a search passes here."""
    if value is None or not math.isfinite(value):
        raise NonFiniteError(non_finite_fix(setup.model.cfg.dtype,
                                            f"the metric {setup.metric.name} is NaN or inf after {where} ({value})"))
    return value


def make_result(inputs: Any, clean_metric: float, base_metric: float, method: str, level: str,
                raw: dict[str, float], corrupted: float, candidates: Optional[Sequence[str]], min_signal: float,
                **settings: Any) -> PatchResult:
    """Normalize ``raw`` and wrap everything in a :class:`PatchResult` of ``level`` node or edge.

    ``candidates`` (default: the names in ``raw``) fixes the order; a candidate missing from
    ``raw`` was not run because it cannot reach the metric, and gets the base run's metric.
    ``min_signal``: the signal threshold (a screen that wants every estimate passes 0). ``inputs`` is the
    call's :class:`~p0circuit.patching.setup.Setup`; ``base_metric`` is the metric of the run the
    patches went into."""
    names = list(raw) if candidates is None else list(candidates)
    bad = [n for n, v in raw.items() if not math.isfinite(v)]
    if bad:
        finite(raw[bad[0]], inputs, f"patching {bad[0]} ({len(bad)} of {len(raw)} patches)")
    finite(corrupted, inputs, "the fully corrupted run")
    unreachable = [n for n in names if n not in raw]
    raw = {n: raw.get(n, base_metric) for n in names}
    settings = {**settings, "unreachable": len(unreachable)}
    bos = bos_id(inputs.model)
    at_p0 = bos is not None and bool((inputs.prep.clean_tokens[:, 0] == bos).all())
    norm, signal, msg = normalize(clean_metric, corrupted, raw, inputs.options.direction, min_signal,
                                  advice(inputs.prep.name, at_p0), inputs.metric.signal_unit)
    tokens = inputs.prep.clean_tokens
    described = {k: v for k, v in inputs.describe().items() if k not in ("corruption", "metric")}  # (fields of their own)
    return PatchResult(
        method=method, level=level, corruption=inputs.prep.name, metric=inputs.metric.name,
        direction=inputs.options.direction, clean_metric=clean_metric, corrupted_metric=corrupted, raw=raw,
        normalized=norm, signal=signal, message=msg,
        settings={**settings, **described, "n_prompts": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
                  "n_layers": int(inputs.model.cfg.n_layers), "n_heads": int(inputs.model.cfg.n_heads)},
        setup=inputs,
    )
