"""Where the P0 circuit sits in one model: the layers of the components that causally produce the
sink's norm, found by activation patching, or read off the norm profile where patching is not
affordable.

:func:`locate` measures the norm ratio of the sink position ``k`` (0 for a P0 sink, 1 for the
transition stage's sink at position 1) at the layer where it first passes the norm threshold (the
end of the amplification), patches every head and MLP output at positions ``0..k`` and at the rest
with a position-only corruption (``shift`` by default), and keeps the layers of the nodes whose
normalized effect reaches ``threshold``. The patching costs about ``2 * n_layers * (n_heads + 1)``
suffix forwards of the prompts; :func:`affordable` bounds the node count (default 400, about a
12-layer, 12-head model per checkpoint on a CPU in a minute or two).
"""

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from p0circuit.core.defaults import LOCATE_THRESHOLD, NORM_THRESHOLD
from p0circuit.core import hooks
from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError
from p0circuit.measures import SinkReport, norm_ratio, sink_report
from p0circuit.patching import NormRatio, activation_patch, candidate_nodes
from p0circuit.patching.setup import Setup
from p0circuit.models.tokens import check_tokens
from p0circuit.core.types import Node

MAX_NODES = 400
"""Default node budget of :func:`affordable`."""


@dataclass(frozen=True)
class Location:
    """The layers that hold the identification/amplification circuit, and how they were found."""

    layers: tuple[int, ...]
    """Layers with a component of the circuit (patching), or the norm onset layer (norm profile)."""
    by: str
    """``patching``, ``norm profile``, or ``none`` (no sink to locate)."""
    nodes: tuple[str, ...] = ()
    """Nodes kept by patching (may include ``PE@0`` for learned positions)."""
    metric: str = ""
    """The patching metric."""
    effects: dict[str, float] = field(default_factory=dict)
    """Normalized effect of every candidate node (patching only)."""
    note: str = ""
    """Why nothing was located, when nothing was."""

    def label(self) -> str:
        """``"0-1"``-style text for tables: the layer range, or an empty string."""
        if not self.layers:
            return ""
        lo, hi = min(self.layers), max(self.layers)
        return str(lo) if lo == hi else f"{lo}-{hi}"


def affordable(model: Any, max_nodes: int = MAX_NODES) -> bool:
    """Whether patching every head and MLP at P0 and the rest stays within ``max_nodes`` candidates."""
    return 2 * model.cfg.n_layers * (model.cfg.n_heads + 1) <= max_nodes


def from_norm_profile(report: SinkReport) -> Location:
    """The norm onset layer as the end of the amplification (no causal claim)."""
    if report.norm_onset_layer is None:
        return Location((), "none", note="no layer reaches the norm threshold")
    return Location((report.norm_onset_layer,), "norm profile")


def onset_at(model: Any, tokens: Any, k: int, norm_threshold: float) -> Optional[int]:
    """First layer whose residual norm ratio at position ``k`` reaches ``norm_threshold``, or None."""
    tokens = check_tokens(model, tokens, min_len=k + 1)
    names = [hooks.resid_post(layer) for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    for layer, name in enumerate(names):
        if float(norm_ratio(cache[name], pos=k).mean()) >= norm_threshold:
            return layer
    return None


@entry_point
def locate(setup: Any, *, report: Optional[SinkReport] = None, threshold: float = LOCATE_THRESHOLD,
           norm_threshold: float = NORM_THRESHOLD) -> Location:
    """Locate the circuit of the model's sink by activation patching (see the module docstring), on ``setup``'s
    model and prompts with its corruption and BOS choice (``p0circuit.Setup.of(model, tokens, corruption="shift",
    bos=False)``); the metric is the norm ratio at the onset found here, whatever the setup's.

    ``report`` (a :func:`sink_report` on the same tokens) is computed when not given. Without a
    sink (no layer reaches ``norm_threshold``) nothing is patched and ``by`` is ``none``.
    """
    if not isinstance(setup, Setup):
        raise BadInputError(f"locate takes a p0circuit.Setup (its model, prompts, corruption and BOS choice), got "
                            f"setup={type(setup).__name__}: call locate(p0circuit.Setup.of(model, tokens, corruption='shift', "
                            "bos=False))")
    model, tokens = setup.model, setup.tokens
    report = report if report is not None else sink_report(model, tokens, bos=setup.bos, norm_threshold=norm_threshold)
    k = report.sink_position
    onset = report.norm_onset_layer if k == 0 else onset_at(model, tokens, k, norm_threshold)
    if onset is None:
        return Location((), "none", note=f"no layer amplifies position {k} past the norm threshold {norm_threshold}")
    metric = NormRatio(onset, pos=k)
    nodes = candidate_nodes(model, positions=range(k + 1))
    result = activation_patch(setup=setup.measuring(metric), nodes=nodes)
    if not result.signal:
        return Location((), "patching", metric=metric.name, effects=result.normalized, note=result.message)
    kept = [name for name, v in result.normalized.items() if abs(v) >= threshold]
    layers = sorted({Node.parse(name).layer for name in kept} - {-1})  # embeddings are inputs, not layers
    return Location(tuple(layers), "patching", tuple(kept), metric.name, dict(result.normalized))
