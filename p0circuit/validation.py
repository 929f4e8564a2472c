"""Checks shared by the patching entry points, with messages that say what to do."""

from typing import Any, Sequence, Union

from transformer_lens import HookedTransformer

from p0circuit.errors import BadInputError
from p0circuit.types import Node


def check_model(model: Any) -> None:
    """Raise unless ``model`` is a ``HookedTransformer``."""
    if not isinstance(model, HookedTransformer):
        raise BadInputError(
            f"expected a transformer_lens HookedTransformer, got {type(model).__name__}; build one "
            "with p0circuit.ModelSpec, build_planted or load_checkpoint"
        )
    check_devices(model)


def check_devices(model: Any) -> None:
    """Raise when the model's weights are split over devices, have no data (``meta``), mix float
    dtypes, or sit elsewhere than ``model.cfg.device`` says (so hooks would build tensors on the
    wrong device)."""
    import torch

    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise BadInputError(
            f"the model's weights are on several devices {sorted(map(str, devices))}; move the whole model "
            "with model.to(device) (p0circuit runs a model on one device)"
        )
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) > 1:
        raise BadInputError(
            f"the model's weights mix dtypes {sorted(map(str, dtypes))}; convert the whole model with "
            "model.to(torch.float32)"
        )
    if not devices:
        return
    (device,) = devices
    if device.type == "meta":
        raise BadInputError("the model's weights are on the meta device (no data); load or build it on a real device")
    if torch.device(model.cfg.device).type != device.type:
        raise BadInputError(
            f"model.cfg.device is {model.cfg.device!r} but the weights are on {device}; move the model with "
            "HookedTransformer.to(device), which updates both"
        )


def check_metric(metric: Any, model: Any) -> None:
    """Raise unless ``metric`` is a patching metric that fits ``model``."""
    from p0circuit.patching.metrics import PatchMetric

    if not isinstance(metric, PatchMetric):
        raise BadInputError(
            f"metric must be a p0circuit.patching PatchMetric (NormRatio, AttnToP0, LogitMetric, "
            f"CacheMetric), got {type(metric).__name__}; wrap a function on logits as LogitMetric(fn)"
        )
    metric.validate(model.cfg.n_layers, model.cfg.n_heads)
    missing = [h.name for h in metric.needs(model.cfg.n_layers) if h.name not in model.hook_dict]
    if missing:
        from p0circuit.errors import MissingHookError

        raise MissingHookError(f"the model has no hook {missing[0]!r} that metric {metric.name!r} reads")


def parse_nodes(nodes: Sequence[Union[Node, str]]) -> list[Node]:
    """Nodes from Node objects or names like 'A0.H1@0'; duplicates and empties are errors."""
    out = [n if isinstance(n, Node) else Node.parse(n) for n in nodes]
    if not out:
        raise BadInputError("no candidate nodes given: pass at least one node (e.g. 'A0.H0@0')")
    if len(set(out)) != len(out):
        dup = sorted({n.name for n in out if out.count(n) > 1})
        raise BadInputError(f"duplicate nodes {dup}: list each node once")
    return out


def parse_edges(edges: Sequence[Any]) -> list[Any]:
    """Edges from Edge objects or names like 'M1@0->A2.H0@0.k'; duplicates and empties are errors."""
    from p0circuit.types import Edge

    out = [e if isinstance(e, Edge) else Edge.parse(e) for e in edges]
    if not out:
        raise BadInputError("no candidate edges given: pass at least one edge (e.g. 'M1@0->A2.H0@0.k')")
    if len(set(out)) != len(out):
        raise BadInputError("duplicate edges: list each edge once")
    return out
