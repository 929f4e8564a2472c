"""Position-aware patching: corruptions, metrics, and the activation, path and attribution methods.

Read :mod:`p0circuit.patching.corruptions` first: why ordinary resampling cannot see a circuit
whose only job is to know "this is position 0", and the corruptions that can. The rooms:

* ``corruptions``, ``metrics``: what is corrupted and what is measured (open: subclass to add);
* ``sites``, ``edges``: where a node or edge lives in a hooked model, and the candidates;
* ``experts``: a mixture-of-experts MLP's experts as nodes, and where its router sends P0;
* ``engine``: batched patched forwards (fast path) and the slow reference;
* ``order``: where each hook fires in the model's forward pass (what a patch can reach);
* ``options``, ``inputs``, ``hooking``: the shared options, a call's checked inputs, and the
  TransformerLens flags a method sets while it runs;
* ``job``, ``ops``: one call's cached runs, and the patch ops every method builds from them;
* ``methods/``, ``registry``: one file per method, registered in ``registry.METHODS``;
* ``result``, ``check``, ``faithfulness``, ``circuit_search``, ``circuit_edges``: reading, checking and testing
  what was found, and the faithful circuit, its nodes and then its edges (ACDC-style pruning).

Layer 4: the patching engine and its methods.

May import: p0circuit.core, p0circuit.models, p0circuit.measures.
"""

from p0circuit.patching.corruptions import (
    CORRUPTIONS, Copies, Corruption, PosMean, Resample, Shift, Swap, Zero, get_corruption,
)
from p0circuit.patching.edges import candidate_edges
from p0circuit.patching.metrics import (
    AttnToP0, CacheMetric, LogitMetric, NormRatio, PatchMetric, PerPrompt, ResidDim, RunView, SinkRate,
)
from p0circuit.patching.methods import activation_patch, attribution_patch, path_patch
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.registry import METHODS, Method, get_method, register
from p0circuit.patching.check import AttributionCheck, check_attribution
from p0circuit.patching.faithfulness import faithfulness_curve
from p0circuit.patching.circuit_search import NodeSearch, faithful_circuit
from p0circuit.patching.circuit_edges import EdgeSearch, faithful_edges
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_neurons, candidate_nodes
from p0circuit.patching.experts import candidate_experts, expert_routing

__all__ = [
    "CORRUPTIONS", "METHODS", "AttnToP0", "SinkRate", "AttributionCheck", "CacheMetric", "Corruption", "LogitMetric", "Method",
    "Copies", "NormRatio", "PatchMetric", "PerPrompt", "PatchOptions", "PatchResult", "PosMean", "Resample", "ResidDim", "RunView", "Shift", "Swap", "Zero", "activation_patch",
    "attribution_patch", "candidate_edges", "candidate_experts", "candidate_neurons", "candidate_nodes", "check_attribution", "EdgeSearch", "faithful_circuit", "faithful_edges", "faithfulness_curve", "NodeSearch",
    "expert_routing", "get_corruption", "get_method", "path_patch", "register", "takes_options",
]

