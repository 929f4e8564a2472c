"""Checks that a model can be measured: a ``HookedTransformer`` on one device with one dtype.

Token tensors are checked beside them in :mod:`p0circuit.models.tokens`; patching arguments (metrics,
node and edge names) in :mod:`p0circuit.patching`."""

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import torch

from transformer_lens import HookedTransformer

from p0circuit.core.errors import BadInputError, NonFiniteError
from p0circuit.core.threads import share


_CHECKED: ContextVar[frozenset] = ContextVar("p0circuit_checked_models", default=frozenset())
"""ids of the models a :func:`checked` block has checked (and whose weights nothing in it changes)."""


def check_model(model: Any) -> None:
    """Raise unless ``model`` is a ``HookedTransformer`` on one device, with one float dtype and finite
    weights. Inside a :func:`checked` block for this model it returns at once: it was checked there. A model
    that passes shares a busy machine in the user's own forwards from then on (:func:`~p0circuit.core.threads.share`)."""
    if id(model) in _CHECKED.get():
        return
    if not isinstance(model, HookedTransformer):
        raise BadInputError(
            f"expected a transformer_lens HookedTransformer, got {type(model).__name__}; build one "
            "with p0circuit.ModelSpec, build_planted or load_checkpoint"
        )
    check_devices(model)
    check_finite_weights(model)
    share(model)


@contextmanager
def checked(model: Any) -> Iterator[Any]:
    """Check ``model`` once where it enters a study (``analyze``, a discovery, a sweep cell) and carry
    it through the block as checked: every :func:`check_model` of it inside passes without checking
    again. Only for code that changes no weight of the model inside the block."""
    check_model(model)
    token = _CHECKED.set(_CHECKED.get() | {id(model)})
    try:
        yield model
    finally:
        _CHECKED.reset(token)


def check_finite_weights(model: Any) -> None:
    """Raise :class:`NonFiniteError` naming the first parameter (in module order) with NaN or inf.

    Checked before every analysis: TransformerLens turns NaN attention scores into zero attention
    (its softmax guards padded rows), so a NaN weight in a head would otherwise give a finite,
    silently wrong pattern and a plausible circuit.

    One sum per parameter first (NaN and inf propagate through a sum; 12x faster than testing every
    element on SmolLM2-135M); only when a sum is not finite are that parameter's elements tested,
    so a sum that merely overflows passes."""
    params = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    if not params:
        return
    with torch.no_grad():
        sums = torch.stack([p.detach().sum(dtype=torch.float64 if p.dtype == torch.float64 else torch.float32)
                            for _, p in params])
        suspects = [params[i] for i in torch.nonzero(~torch.isfinite(sums)).flatten().tolist()]
    for name, param in suspects:
        if param.is_floating_point() and not bool(torch.isfinite(param).all()):
            raise NonFiniteError(f"the model's weight {name} holds NaN or inf: every analysis of it would be wrong; "
                                 "reload the checkpoint (or find what wrote into the weights)")


def check_devices(model: Any) -> None:
    """Raise when the model's weights are split over devices, have no data (``meta``), mix float
    dtypes, or sit elsewhere than ``model.cfg.device`` says (so hooks would build tensors on the
    wrong device)."""
    n_devices = int(getattr(model.cfg, "n_devices", 1) or 1)
    if n_devices > 1:
        raise BadInputError(
            f"this model is split over {n_devices} devices (TransformerLens' n_devices={n_devices}); p0circuit "
            "patches a model on one device, and moving it silently would change where the work runs: load it "
            "with n_devices=1 on one device that holds it (bfloat16 halves its size), or on the CPU")
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


def check_block(model: Any, layer: Any, where: str, *, later: int = 0) -> int:
    """``layer`` as a block index of ``model`` that has at least ``later`` blocks after it (a study that reads
    what later blocks do with a state needs one), or a :class:`BadInputError` naming ``where`` and the range."""
    last = int(model.cfg.n_layers) - 1 - later
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= last:
        after = f" (it reads the {later} block(s) after it)" if later else ""
        raise BadInputError(f"{where}: layer={layer!r:.40} must be a block of this model in 0..{last}{after}; blocks "
                            f"count from 0 and this model has {model.cfg.n_layers}")
    return layer


def check_dims(model: Any, dims: Any, where: str) -> list[int]:
    """``dims`` as a list of residual-stream dimensions of ``model`` (each in 0..d_model-1, once), or a
    :class:`BadInputError` naming ``where``."""
    d_model = int(model.cfg.d_model)
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise BadInputError(f"{where}: dims={dims!r:.40} must be a list of residual dimensions (e.g. [507])")
    out = list(dims)
    bad = [d for d in out if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < d_model]
    if bad or len(set(out)) != len(out):
        raise BadInputError(f"{where}: dims={out!r:.60} must be distinct dimensions in 0..{d_model - 1} (d_model="
                            f"{d_model})" + (f"; {bad[0]!r:.20} is not" if bad else "; one is repeated"))
    return out
