"""Position-aware patching: corruptions, metrics, and the activation, path and attribution methods.

Read :mod:`p0circuit.patching.corruptions` first: why ordinary resampling cannot see a circuit
whose only job is to know "this is position 0", and the corruptions that can.
"""

from p0circuit.patching.activation import activation_patch
from p0circuit.patching.attribution import attribution_patch
from p0circuit.patching.corruptions import CORRUPTIONS, PosMean, Resample, Shift, Zero, get_corruption
from p0circuit.patching.edges import candidate_edges
from p0circuit.patching.metrics import AttnToP0, CacheMetric, LogitMetric, NormRatio, PatchMetric, RunView
from p0circuit.patching.numerics import AttributionCheck, check_attribution
from p0circuit.patching.path import path_patch
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_nodes

__all__ = [
    "CORRUPTIONS", "AttnToP0", "AttributionCheck", "check_attribution", "CacheMetric", "LogitMetric", "NormRatio", "PatchMetric", "PatchResult",
    "PosMean", "Resample", "RunView", "Shift", "Zero", "activation_patch", "attribution_patch",
    "candidate_edges", "candidate_nodes", "get_corruption", "path_patch",
]
