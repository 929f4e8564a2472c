"""p0circuit: find, causally prove and track the P0-sink circuit in causal language models.

The public surface: build or load a model (:class:`ModelSpec`, :func:`load_checkpoint`,
:func:`build_planted`, or any entry with :func:`load_model`), tokenize with an explicit BOS choice
(:func:`to_tokens`) or draw probes (:func:`probe_tokens`), ask the paper's questions in one call
(:func:`analyze`), measure the sink (:func:`sink_report`),
patch (:func:`activation_patch`, :func:`path_patch`, :func:`attribution_patch`, or :func:`discover`
for a :class:`Circuit` of :class:`Node` and :class:`Edge`).
"""

import importlib
from typing import TYPE_CHECKING

from p0circuit import _moved

# Names are imported on first use (PEP 562), so that ``import p0circuit.surfaces.cli`` and
# ``p0circuit --help`` answer at once instead of importing torch and TransformerLens first.
_WHERE = {
    **dict.fromkeys(['BadInputError', 'CheckpointError', 'ConfigError', 'MissingHookError', 'NonFiniteError', 'P0CircuitError'], 'p0circuit.core.errors'),
    **dict.fromkeys(['Analysis', 'AnalysisSettings', 'analyze'], 'p0circuit.studies.analysis'),
    **dict.fromkeys(['discover', 'interpret'], 'p0circuit.studies.discovery.discover'),
    **dict.fromkeys(['plot'], 'p0circuit.figures.plotting'),
    **dict.fromkeys(['CircuitFigure', 'circuit_figure'], 'p0circuit.figures.drawing'),
    **dict.fromkeys(['auroc', 'compare', 'prune', 'to_dot', 'to_networkx', 'to_svg'], 'p0circuit.figures.graphs'),
    **dict.fromkeys(['SinkReport', 'sink_report'], 'p0circuit.measures'),
    **dict.fromkeys(['AttnToP0', 'CORRUPTIONS', 'CacheMetric', 'Corruption', 'LogitMetric', 'METHODS', 'Method', 'NormRatio', 'PatchMetric', 'PatchOptions', 'PatchResult', 'PosMean', 'Resample', 'ResidDim', 'Shift', 'Swap', 'Zero', 'activation_patch', 'attribution_patch', 'candidate_edges', 'candidate_experts', 'candidate_neurons', 'candidate_nodes', 'check_attribution', 'expert_routing', 'faithfulness_curve', 'path_patch', 'takes_options'], 'p0circuit.patching'),
    **dict.fromkeys(['ModelSpec', 'load_checkpoint', 'load_pretrained', 'positional_kind'], 'p0circuit.models'),
    **dict.fromkeys(['export_gguf', 'load_gemma3', 'load_gguf', 'load_smollm2'], 'p0circuit.models.gguf'),
    **dict.fromkeys(['load_model'], 'p0circuit.models.resolve'),
    **dict.fromkeys(['PlantSpec', 'PlantedModel', 'build_planted', 'p0_like_positions', 'regular_prompts'], 'p0circuit.models.planted'),
    **dict.fromkeys(['bos_label', 'check_tokens', 'english_prompts', 'make_prompts', 'probe_tokens', 'set_bos', 'text_windows', 'to_tokens'], 'p0circuit.models.tokens'),
    **dict.fromkeys(['Circuit', 'Edge', 'Input', 'Kind', 'Node'], 'p0circuit.core.types'),
}

if TYPE_CHECKING:  # what static tools and IDEs see
    from p0circuit.core.errors import (
        BadInputError,
        CheckpointError,
        ConfigError,
        MissingHookError,
        NonFiniteError,
        P0CircuitError,
    )
    from p0circuit.studies.analysis import Analysis, AnalysisSettings, analyze
    from p0circuit.studies.discovery.discover import discover, interpret
    from p0circuit.figures.plotting import plot
    from p0circuit.figures.drawing import CircuitFigure, circuit_figure
    from p0circuit.figures.graphs import auroc, compare, prune, to_dot, to_networkx, to_svg
    from p0circuit.measures import SinkReport, sink_report
    from p0circuit.patching import (
        CORRUPTIONS,
        METHODS,
        AttnToP0,
        CacheMetric,
        Corruption,
        LogitMetric,
        Method,
        NormRatio,
        ResidDim,
        PatchMetric,
        PatchOptions,
        PatchResult,
        PosMean,
        Resample,
        Shift,
        Swap,
        Zero,
        activation_patch,
        attribution_patch,
        candidate_edges,
        candidate_experts,
        candidate_neurons,
        candidate_nodes,
        check_attribution,
        expert_routing,
        faithfulness_curve,
        path_patch,
        takes_options,
    )
    from p0circuit.models import ModelSpec, load_checkpoint, load_pretrained, positional_kind
    from p0circuit.models.gguf import export_gguf, load_gemma3, load_gguf, load_smollm2
    from p0circuit.models.resolve import load_model
    from p0circuit.models.planted import PlantedModel, PlantSpec, build_planted, p0_like_positions, regular_prompts
    from p0circuit.models.tokens import (bos_label, check_tokens, english_prompts, make_prompts, probe_tokens, set_bos,
                                  text_windows, to_tokens)
    from p0circuit.core.types import Circuit, Edge, Input, Kind, Node

__all__ = [
    "Analysis", "AnalysisSettings", "analyze", "CORRUPTIONS", "METHODS", "AttnToP0", "BadInputError", "CacheMetric", "CheckpointError", "Circuit", "CircuitFigure", "circuit_figure", "ConfigError",
    "Corruption", "Edge", "Input", "Kind", "LogitMetric", "Method", "MissingHookError", "ModelSpec", "Node",
    "NonFiniteError", "NormRatio", "ResidDim", "P0CircuitError", "PatchMetric", "PatchOptions", "PatchResult", "PlantSpec", "PlantedModel",
    "PosMean", "Resample", "Shift", "SinkReport", "Swap", "Zero", "activation_patch", "attribution_patch", "auroc",
    "build_planted", "candidate_edges", "candidate_experts", "candidate_neurons", "candidate_nodes", "check_attribution", "check_tokens", "compare", "discover",
    "expert_routing", "export_gguf", "faithfulness_curve", "interpret", "load_checkpoint", "load_gguf", "load_model", "load_pretrained",
    "load_gemma3", "load_smollm2", "p0_like_positions", "path_patch", "plot", "positional_kind", "probe_tokens", "prune", "regular_prompts",
    "sink_report", "takes_options", "text_windows", "bos_label", "english_prompts", "make_prompts", "set_bos", "to_dot", "to_networkx", "to_svg", "to_tokens",
]


def __getattr__(name: str) -> object:
    """Public names, imported on first use; removed names: a clear error that names the replacement."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    if name in _moved.NAMES:
        raise AttributeError(f"p0circuit.{name} was removed; use {_moved.NAMES[name]}")
    raise AttributeError(f"module 'p0circuit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
