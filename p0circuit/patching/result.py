"""Patching results: raw and normalized effects, the signal check, conversion to a Circuit."""

import math
from dataclasses import dataclass, field
from typing import Any

from p0circuit.types import Circuit, Edge, Node


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
    """``activation``, ``path`` or ``attribution``."""
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
    """Everything needed to reproduce the result."""

    @property
    def names(self) -> list[str]:
        """Node or edge names, in order."""
        return list(self.raw)

    def effect(self, name: str) -> float:
        """Normalized effect of one node or edge."""
        return self.normalized[name]

    def to_circuit(self, threshold: float = 0.1) -> Circuit:
        """Nodes/edges whose |normalized effect| >= threshold; effects of all candidates kept."""
        keep = [n for n, v in self.normalized.items() if not math.isnan(v) and abs(v) >= threshold]
        settings = {**self.settings, "method": self.method, "corruption": self.corruption, "metric": self.metric,
                    "direction": self.direction, "threshold": threshold, "clean_metric": self.clean_metric,
                    "corrupted_metric": self.corrupted_metric, "signal": self.signal, "message": self.message}
        if self.method == "path":
            edges = tuple(Edge.parse(n) for n in keep)
            nodes = tuple({e.src for e in edges} | {e.dst for e in edges})
            return Circuit(nodes=nodes, edges=edges, edge_effects=dict(self.normalized), settings=settings)
        return Circuit(nodes=tuple(Node.parse(n) for n in keep), node_effects=dict(self.normalized), settings=settings)

    def __str__(self) -> str:
        head = (f"{self.method} patching, corruption={self.corruption}, metric={self.metric}, "
                f"direction={self.direction}: clean={self.clean_metric:.4g} corrupted={self.corrupted_metric:.4g}")
        if not self.signal:
            return head + "\nNO SIGNAL: " + self.message
        rows = sorted(self.normalized.items(), key=lambda kv: -abs(kv[1]))
        return head + "\n" + "\n".join(f"  {n:32s} {v:+.3f}" for n, v in rows[:20])



def normalize(
    clean: float, corrupted: float, raw: dict[str, float], direction: str, min_signal: float
) -> tuple[dict[str, float], bool, str]:
    """Normalized effects, whether there is signal, and a message when there is not."""
    gap = clean - corrupted
    scale = max(abs(clean), abs(corrupted), 1e-12)
    if abs(gap) < min_signal * scale or gap == 0:
        msg = (
            f"clean ({clean:.6g}) and corrupted ({corrupted:.6g}) metrics differ by {abs(gap):.3g}, less "
            f"than min_signal={min_signal} of their scale: this corruption does not change the metric, "
            "so no component can be credited (a position-only circuit is invisible to 'resample'; "
            "use 'shift' or 'pos_mean')"
        )
        return {k: math.nan for k in raw}, False, msg
    if direction == "noise":
        return {k: (clean - v) / gap for k, v in raw.items()}, True, ""
    return {k: (v - corrupted) / gap for k, v in raw.items()}, True, ""

