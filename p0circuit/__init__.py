"""p0circuit: find, causally prove and track the P0-sink circuit in causal language models.

The public surface: build or load a model (:class:`ModelSpec`, :func:`load_checkpoint`,
:func:`build_planted`), tokenize with an explicit BOS choice (:func:`to_tokens`), and measure the
sink (:func:`sink_report`). Circuits are :class:`Circuit` objects of :class:`Node` and :class:`Edge`.
"""

from p0circuit.errors import (
    BadInputError,
    CheckpointError,
    ConfigError,
    MissingHookError,
    NonFiniteError,
    P0CircuitError,
)
from p0circuit.discover import METHODS, discover, disagreements, interpret
from p0circuit.graphs import auroc, compare, prune, to_dot, to_networkx, to_svg
from p0circuit.metrics import SinkReport, sink_report
from p0circuit.patching import (
    AttnToP0,
    CacheMetric,
    LogitMetric,
    NormRatio,
    PatchResult,
    activation_patch,
    attribution_patch,
    check_attribution,
    path_patch,
)
from p0circuit.models import ModelSpec, load_checkpoint, load_pretrained, positional_kind
from p0circuit.planted import PlantedModel, PlantSpec, build_planted, p0_like_positions, regular_prompts
from p0circuit.tokens import check_tokens, to_tokens
from p0circuit.types import Circuit, Edge, Input, Kind, Node

__all__ = [
    "METHODS", "AttnToP0", "CacheMetric", "LogitMetric", "NormRatio", "PatchResult", "activation_patch",
    "attribution_patch", "check_attribution", "auroc", "compare", "disagreements", "discover", "interpret", "path_patch", "prune",
    "to_dot", "to_networkx", "to_svg",
    "BadInputError", "CheckpointError", "Circuit", "ConfigError", "Edge", "Input", "Kind",
    "MissingHookError", "ModelSpec", "Node", "NonFiniteError", "P0CircuitError", "PlantSpec",
    "PlantedModel", "SinkReport", "build_planted", "check_tokens", "load_checkpoint",
    "load_pretrained", "p0_like_positions", "positional_kind", "regular_prompts", "sink_report", "to_tokens",
]
