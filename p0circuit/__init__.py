"""p0circuit: find, causally prove and track the P0-sink circuit in causal language models.

The public surface: build or load a model (:class:`ModelSpec`, :func:`load_checkpoint`,
:func:`build_planted`, or any entry with :func:`load_model`), tokenize with an explicit BOS choice
(:func:`to_tokens`) or draw probes (:func:`probe_tokens`), ask the paper's questions in one call
(:func:`analyze`), measure the sink (:func:`sink_report`),
patch (:func:`activation_patch`, :func:`path_patch`, :func:`attribution_patch`, or :func:`discover`
for a :class:`Circuit` of :class:`Node` and :class:`Edge`).
"""

import importlib

from p0circuit import _moved
from p0circuit.core import clock as _clock
from p0circuit.core import threads as _threads
from p0circuit.core import versions as _versions
from p0circuit.core import hooks  # every TransformerLens hook name (p0.hooks.resid_post(2)); no imports of its own

# Names are imported on first use (PEP 562), so that ``import p0circuit.surfaces.cli`` and
# ``p0circuit --help`` answer at once instead of importing torch and TransformerLens first.
_WHERE = {
    **dict.fromkeys(['set_threads'], 'p0circuit.core.threads'),
    **dict.fromkeys(['Setup'], 'p0circuit.patching.setup'),
    **dict.fromkeys(['BadCallError', 'BadInputError', 'CheckpointError', 'ConfigError', 'MissingHookError', 'NonFiniteError', 'P0CircuitError'], 'p0circuit.core.errors'),
    **dict.fromkeys(['Analysis', 'AnalysisSettings', 'analyze'], 'p0circuit.studies.analysis'),
    **dict.fromkeys(['discover', 'interpret'], 'p0circuit.studies.discovery.discover'),
    **dict.fromkeys(['plot'], 'p0circuit.figures.plotting'),
    **dict.fromkeys(['CircuitFigure', 'circuit_figure'], 'p0circuit.figures.drawing'),
    **dict.fromkeys(['auroc', 'compare', 'prune'], 'p0circuit.core.circuits'),
    **dict.fromkeys(['to_dot', 'to_networkx', 'to_svg'], 'p0circuit.figures.graphs'),
    **dict.fromkeys(['SinkReport', 'sink_report'], 'p0circuit.measures'),
    **dict.fromkeys(['AttnToP0', 'CORRUPTIONS', 'CacheMetric', 'Copies', 'Corruption', 'LogitMetric', 'METHODS', 'Method', 'NormRatio', 'PatchMetric', 'PatchOptions', 'PatchResult', 'PosMean', 'Resample', 'PerPrompt', 'ResidDim', 'Shift', 'SinkRate', 'Swap', 'Zero', 'activation_patch', 'attribution_patch', 'candidate_edges', 'candidate_experts', 'candidate_neurons', 'candidate_nodes', 'check_attribution', 'expert_routing', 'faithful_circuit', 'faithful_edges', 'faithfulness_curve', 'path_patch', 'takes_options'], 'p0circuit.patching'),
    **dict.fromkeys(['ModelSpec', 'load_checkpoint', 'load_pretrained', 'positional_kind'], 'p0circuit.models'),
    **dict.fromkeys(['export_gguf', 'load_gemma3', 'load_gguf', 'load_qwen25', 'load_smollm2'], 'p0circuit.models.gguf'),
    **dict.fromkeys(['load_model'], 'p0circuit.models.resolve'),
    **dict.fromkeys(['PlantSpec', 'PlantedModel', 'build_planted', 'p0_like_positions', 'regular_prompts'], 'p0circuit.models.planted'),
    **dict.fromkeys(['bos_label', 'check_tokens', 'english_prompts', 'make_prompts', 'probe_tokens', 'set_bos', 'text_windows', 'to_tokens'], 'p0circuit.models.tokens'),
    **dict.fromkeys(['Circuit', 'Edge', 'Input', 'Kind', 'Node'], 'p0circuit.core.types'),
    **dict.fromkeys(['sink_reads'], 'p0circuit.studies.experiments.reads'),
    **dict.fromkeys(['diagonal_attention'], 'p0circuit.studies.experiments.detection'),
    **dict.fromkeys(['super_weights', 'weight_outliers'], 'p0circuit.studies.experiments.super_weights'),
    **dict.fromkeys(['first_token_map'], 'p0circuit.studies.experiments.first_tokens'),
    **dict.fromkeys(['keyed_on'], 'p0circuit.studies.experiments.keyed'),
    **dict.fromkeys(['special_tokens'], 'p0circuit.studies.experiments.special_tokens'),
}

_threads.note_import()  # a thread count set before this import (torch imported first) is the user's

_LIGHT = {"p0circuit.core.errors", "p0circuit.core.threads"}
"""Modules of public names that import no TransformerLens."""

__all__ = sorted(_WHERE)
"""The public names: the one list is ``_WHERE`` (name -> the module that defines it). Jupyter's and
IPython's completion read ``__dir__``, which lists them without importing anything."""


def __getattr__(name: str) -> object:
    """Public names, imported on first use; removed names: a clear error that names the replacement."""
    if name in _WHERE:
        if _WHERE[name] not in _LIGHT:  # before TransformerLens is imported: a 4.x install refused with the reason
            _versions.check_transformer_lens()
        with _clock.importing():  # the analysis' record says what the imports cost (core/clock.py)
            value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    if name in _moved.CLASSES:
        return _moved.old_class(name)
    if name in _moved.NAMES:
        raise AttributeError(f"p0circuit.{name} was removed; use {_moved.NAMES[name]}")
    raise AttributeError(f"module 'p0circuit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
