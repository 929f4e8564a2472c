"""Sink and norm metrics: per-head attention to a position, Sink_k^eps, norm ratios, direction
stability, massive activations, onset layers, and the one-call :func:`sink_report`.

Layer 3: what a model does at position 0, measured from one forward.

May import: p0circuit.core, p0circuit.models.
"""

from p0circuit.measures.attention import (
    argmax_sink_position,
    attention_to_position,
    sink_rate,
    sink_rate_per_layer,
)
from p0circuit.measures.norms import direction_stability, first_layer_at_least, massive_activations, norm_ratio
from p0circuit.measures.sink_report import SinkReport, check_finite, report_from_cache, sink_report

__all__ = [
    "SinkReport",
    "argmax_sink_position",
    "attention_to_position",
    "check_finite",
    "direction_stability",
    "first_layer_at_least",
    "massive_activations",
    "norm_ratio",
    "report_from_cache",
    "sink_rate",
    "sink_rate_per_layer",
    "sink_report",
]
