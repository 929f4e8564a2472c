"""One rule for the suite's float comparisons: a tolerance scaled to the values compared.

Two float32 computations of the same number (a fast path and a plain forward, our conversion and
transformers', one thread and two) round differently: each of the ``n`` terms of a reduction can
contribute about ``eps`` (2**-23, 1.2e-7) of the magnitude being summed. A model's forward sums
over ``d_model``, ``d_mlp`` and the positions, layer after layer, so the error of a metric is a few
hundred to a few thousand ``eps`` of the magnitude of what it was computed from, whatever the
thread count or the load of the machine. Hence:

* :data:`REL32` (``2**10 * eps``, 1.2e-4): the tolerance of a float32 forward, relative to the
  largest magnitude compared (:func:`close`, :func:`assert_close`);
* :data:`REL64` for float64 arithmetic on the same inputs (a normalization, a table built from
  the same numbers): ``2**10 * eps64``.

``scale`` is the magnitude the numbers were computed at, when it is larger than the numbers
themselves (a logit difference near 0 computed from logits near 20: the logits' size).
"""

import math

import torch

EPS32 = float(torch.finfo(torch.float32).eps)
REL32 = 2**10 * EPS32
"""Relative tolerance of float32 forwards: a thousand roundings of the compared magnitude."""
REL64 = 2**10 * float(torch.finfo(torch.float64).eps)
"""Relative tolerance of float64 arithmetic on the same numbers."""


def tolerance(*values: float, scale: float = 0.0, rel: float = REL32) -> float:
    """``rel`` times the largest magnitude among ``values`` and ``scale``."""
    return rel * max([abs(float(v)) for v in values if math.isfinite(float(v))] + [abs(scale)])


def close(a: float, b: float, scale: float = 0.0, rel: float = REL32) -> bool:
    """``|a - b| <= rel * max(|a|, |b|, scale)``."""
    return abs(float(a) - float(b)) <= tolerance(a, b, scale=scale, rel=rel)


def assert_close(actual, expected, scale: float = 0.0, rel: float = REL32, what: str = "") -> None:
    """:func:`close` for two numbers or two tensors (elementwise, against the largest magnitude of
    either), with a message that says by how much and against what."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        a, b = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
        diff = float((a - b).abs().max())
        tol = rel * max(float(a.abs().max()), float(b.abs().max()), abs(scale))
    else:
        diff, tol = abs(float(actual) - float(expected)), tolerance(actual, expected, scale=scale, rel=rel)
    assert diff <= tol, f"{what}: differ by {diff:.3g}, more than {tol:.3g} ({rel:.2g} of the magnitude compared)"


def results_close(a, b, rel: float = REL32) -> bool:
    """Two patching results over the same names, every raw value :func:`close` at the scale of
    their clean metrics."""
    assert a.raw.keys() == b.raw.keys(), (sorted(a.raw)[:5], sorted(b.raw)[:5])
    scale = max(abs(a.clean_metric), abs(b.clean_metric))
    return all(close(a.raw[k], b.raw[k], scale, rel) for k in a.raw)
