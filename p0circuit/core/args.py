"""Checks on what a user passes to a public entry point.

Every public function and spec class is marked with :func:`entry_point` (below), which
checks each argument against its annotation here before the body runs (a string where a number
belongs, a float where an int belongs, ``True`` for a count, NaN or inf for any float) and raises
:class:`~p0circuit.core.errors.BadInputError` naming the function, the parameter, the value and what to
pass instead. Ranges shared by name (every ``seed``, ``threshold``, ``n``) are in :data:`RANGES`;
ranges that depend on the model (a layer inside it) are checked in the body, with :func:`at_least`
where the wording should match.

The type test (:func:`_fits`) is ``isinstance`` for plain classes (an int is a valid float, ``True``
is never a number), element by element for lists and tuples, and beartype's ``is_bearable``
otherwise.
"""

import collections.abc
import dataclasses
import functools
import inspect
import math
import numbers
import typing
from typing import Any, Callable, Mapping

from beartype import BeartypeConf
from beartype.door import is_bearable

from p0circuit.core.errors import BadCallError, BadInputError, ConfigError

_CONF = BeartypeConf(is_pep484_tower=True)

FIXES: dict[str, str] = {
    "HookedTransformer": "build one with p0circuit.ModelSpec().build(), build_planted() or load_checkpoint()",
    "Tensor": "pass a torch tensor (token ids come from p0circuit.to_tokens, probe_tokens or make_prompts)",
    "Circuit": "pass a p0circuit.Circuit (from faithful_circuit, discover, prune or Circuit.from_json)",
    "CircuitLike": ("or what a patching method returned (a PatchResult): its own .to_circuit() gives the Circuit; "
                    "faithful_circuit and faithful_edges return a Circuit"),
    "PatchResult": "pass the PatchResult of activation_patch, path_patch or attribution_patch",
    "PatchOptions": "pass p0circuit.PatchOptions(...), or the options as keywords",
    "PatchMetric": "METRIC_FIX",  # replaced below
    "Corruption": "pass a corruption name (one of p0circuit.CORRUPTIONS, e.g. 'shift') or object (p0circuit.Shift())",
    "int": "pass a whole number",
    "float": "pass a finite number",
    "bool": "pass True or False",
    "str": "pass a string",
    "Path": "pass a path (str or pathlib.Path)",
}

METRIC_FIX = (
    "pass a metric such as p0circuit.NormRatio(layer), AttnToP0(heads=...) or a metric name ('attn_to_p0', "
    "'norm_ratio:2'). A function of your own is not a metric until wrapped, as one of: "
    "p0.LogitMetric(fn) for fn(logits [batch, pos, vocab]) -> a scalar, e.g. "
    "p0.LogitMetric(lambda logits: logits[:, -1, 0].mean()); "
    "p0.CacheMetric(fn, hooks_needed=[(layer, hook name), ...]) for fn(acts: dict[hook name, Tensor], p0) -> a "
    "scalar, e.g. p0.CacheMetric(lambda acts, p0: acts['blocks.1.hook_resid_post'][:, p0].norm(), "
    "hooks_needed=[(1, 'blocks.1.hook_resid_post')])")
"""What to pass as a patching metric: the one wording of every refusal of a metric (a plain function
included), here and in :func:`p0circuit.patching.metrics.check_metric`."""
FIXES["PatchMetric"] = METRIC_FIX


def describe(hint: Any) -> str:
    """A hint in words: ``int``, ``float or None``, ``a sequence of Node or str``."""
    origin, hint_args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        names = [describe(a) for a in hint_args if a is not type(None)]
        return " or ".join(names) + (" or None" if type(None) in hint_args else "")
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in hint_args)
    if origin is tuple and len(hint_args) == 2 and hint_args[1] is Ellipsis:
        return f"a tuple of {describe(hint_args[0])}"
    if origin is not None and hint_args and origin not in (tuple, dict):
        return f"a sequence of {describe(hint_args[0])}"
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _fix(hint: Any) -> str:
    words = describe(hint)
    fixes = [fix for name, fix in FIXES.items() if name in words.split(" or ") or f"of {name}" in words]
    if METRIC_FIX in fixes:  # it names the metric names (strings) itself, and is long enough alone
        return METRIC_FIX
    return "; ".join(fixes[:2]) or f"pass {words}"


def _show(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"


RANGES: dict[str, tuple[float, float, str]] = {
    "seed": (0, 2**32 - 1, "seeds are whole numbers from 0 to 2**32 - 1, what every generator used here takes"),
    "n": (1, 10**7, "the number of prompts"),
    "length": (1, 10**7, "tokens per prompt"),
    "threshold": (0, math.inf, "effects are kept when |effect| >= threshold, so a threshold is >= 0"),
    "min_signal": (0, math.inf, "the smallest |clean - corrupted| metric change that counts as signal"),
    "top_k": (1, math.inf, "how many components to keep"),
    "rows_per_forward": (1, 10**9, "prompt rows per patched forward"),
    "eps": (0, 1, "the attention share that makes a head a sink"),
    "norm_threshold": (0, math.inf, "the norm ratio that counts as amplified"),
    "massive_ratio": (0, math.inf, "the ratio to the median that makes an activation massive"),
    "theta": (0, 1, "the share of earlier positions holding one token that flags a position as P0-like"),
    "n_ctx": (1, 10**7, "the longest sequence the model accepts"),
    "n_layers": (1, 10**6, "blocks"),
    "tol": (0, math.inf, "a tolerance on effects is >= 0"),
    "precision_tol": (0, math.inf, "a tolerance on effects is >= 0"),
    "threads": (1, 4096, "CPU threads for torch, at most one per core is useful"),
}
"""Ranges of parameters by name, the same wherever the name appears (``seed`` in every function
takes the same values). Checked after the type, for int and float values only."""


def check_device(where: str, value: Any) -> None:
    """Raise unless ``value`` names a device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    import torch

    if value == "auto":  # a choice some entry points resolve themselves (TrainConfig)
        return
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise BadInputError(f"{where}: device={_show(value)} is not a device; pass 'cpu', 'cuda', 'cuda:0' or 'mps'") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(),
                 "meta": False}
    if not available.get(device.type, False):
        raise BadInputError(f"{where}: device={value!r} is not available on this machine; pass 'cpu'"
                            + (" (or install a CUDA build of torch)" if device.type == "cuda" else ""))
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise BadInputError(f"{where}: device={value!r} does not exist: this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")


@functools.lru_cache(maxsize=None)
def _fits(hint: Any) -> Callable[[Any], bool]:
    """A test of ``value`` against ``hint``. Plain classes and unions of them: ``isinstance`` (a
    Node is built thousands of times in a sweep; this keeps its check under a microsecond), with
    ``True`` refused where only numbers belong. Lists and tuples given for a ``Sequence[X]``,
    ``tuple[X, Y]`` or ``tuple[X, ...]``: every element (beartype checks one at random). Anything
    else: beartype's ``is_bearable``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, (str, typing.TypeVar)):
        return lambda value: True
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        tests = [_fits(a) for a in args]
        return lambda value: any(t(value) for t in tests)
    if isinstance(hint, type) and not args:
        classes = (hint, int) if hint is float else (hint,)  # the numeric tower: an int is a float
        no_bool = hint is not bool and issubclass(bool, classes)
        return lambda value: isinstance(value, classes) and not (no_bool and type(value) is bool)
    if origin is tuple and args and args[-1] is not Ellipsis:
        tests = [_fits(a) for a in args]
        return lambda value: (isinstance(value, (tuple, list)) and len(value) == len(tests)
                              and all(t(v) for t, v in zip(tests, value)))
    if origin in (tuple, list, collections.abc.Sequence, collections.abc.Iterable) and args:
        test = _fits(args[0])
        whole = (lambda value: is_bearable(value, hint, conf=_CONF))
        return lambda value: all(test(v) for v in value) if isinstance(value, (list, tuple)) else whole(value)
    return lambda value: is_bearable(value, hint, conf=_CONF)


def check_value(where: str, name: str, value: Any, hint: Any, error: type = BadInputError) -> None:
    """Raise ``error`` unless ``value`` fits ``hint``; ``where`` names the function (``f: x=...``)
    or the class (``Spec.x=...``)."""
    if hint is Any or hint is inspect.Parameter.empty or isinstance(hint, str):
        return
    if error is BadInputError and name == "device" and (isinstance(value, str) or type(value).__name__ == "device"):
        check_device(where, value)
    try:
        bad = not _fits(hint)(value)
    except Exception:  # the value broke the check itself (e.g. len() of a 0-d tensor): it does not fit
        bad = True
    kind = type(value)
    label = f"{where}.{name}" if error is not BadInputError else f"{where}: {name}"
    if bad:
        raise error(f"{label}={_show(value)} is not {describe(hint)}; {_fix(hint)}")
    if kind is int or kind is float or (kind is not bool and isinstance(value, numbers.Real)):
        integral = isinstance(value, numbers.Integral)
        if not integral and not math.isfinite(float(value)):
            raise error(f"{label}={value!r} is not finite; {FIXES['float']}")
        low, high, meaning = RANGES.get(name, (-math.inf, math.inf, ""))
        unbounded = high == math.inf
        if integral:
            low, high = max(low, -(2**63)), min(high, 2**63 - 1)
        if not low <= value <= high:  # the bound it breaks: a huge int is past the top, never under the bottom
            span = (f"in [{low}, {high}]" if not unbounded else f">= {low}" if value < low else
                    f"<= {high} (a 64-bit integer)")
            raise error(f"{label}={value!r:.40} must be {span}" + (f" ({meaning})" if meaning else ""))


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable) -> tuple[inspect.Signature, dict[str, Any]]:
    return inspect.signature(fn), _hints(fn)


def check_call(fn: Callable, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Check each argument of a call to ``fn`` against ``fn``'s annotations."""
    sig, hints = _signature(fn)
    where = fn.__qualname__
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as err:  # still a TypeError: a call of the wrong shape, e.g. positional options
        raise BadCallError(f"{where}: {err}; its signature is {where}{sig}") from None
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name not in hints:
            continue
        check_value(where, name, value, hints[name])


def check_fields(obj: Any) -> None:
    """Check every field of a dataclass instance against its annotation (call in ``__post_init__``):
    a :class:`ConfigError` (a spec, config or option with an invalid value)."""
    for name, hint, plain in _field_hints(type(obj)):
        value = getattr(obj, name)
        if type(value) not in plain or (type(value) is int and not -(2**63) <= value < 2**63):
            # a value of a plain type the hint names needs no more checks (unless past int64)
            check_value(type(obj).__name__, name, value, hint, error=ConfigError)


@functools.lru_cache(maxsize=None)
def _field_hints(cls: type) -> tuple[tuple[str, Any, frozenset], ...]:
    """(name, hint, the exact types that pass at once) per field: classes the hint names, less
    float (checked for NaN) and numbers whose name has a range."""
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in hints or f.name.startswith("_"):
            continue
        hint = hints[f.name]
        args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
        plain = {a for a in args if isinstance(a, type) and not typing.get_args(a) and a is not float}
        if f.name in RANGES:
            plain -= {int}
        out.append((f.name, hint, frozenset(plain)))
    return tuple(out)


def _hints(obj: Any) -> dict[str, Any]:
    """Resolved annotations (read by ``inspect``: ``typing.get_type_hints`` returns nothing for an
    object marked ``no_type_check``, as entry points are). One that cannot be resolved is not checked."""
    if not isinstance(obj, type):
        try:
            return inspect.get_annotations(obj, eval_str=True)
        except Exception:
            return {}
    out: dict[str, Any] = {}
    for klass in reversed(obj.__mro__):
        try:
            out.update(inspect.get_annotations(klass, eval_str=True))
        except Exception:
            continue
    return out


def at_least(where: str, name: str, value: Any, low: float, fix: str = "") -> None:
    """Raise unless ``value >= low``: ``where`` a class (``Shift``) gives a :class:`ConfigError`
    worded ``Shift.k=0 must be >= 1``, a function a :class:`BadInputError`."""
    if value < low:
        error, label = (ConfigError, f"{where}.{name}") if where[:1].isupper() else (BadInputError, f"{where}: {name}")
        raise error(f"{label}={value!r} must be >= {low}" + (f"; {fix}" if fix else ""))


RATIO_LINE = ("a norm ratio line at or below 1 makes every position a sink state, and a kept share divides by a "
              "state's excess norm (its ratio minus 1), which such a line lets be about 0")
"""Why a norm ratio line (a sink threshold) must exceed 1: the one wording of every refusal of one."""


def above_one(where: str, name: str, value: Any) -> None:
    """Refuse a norm ratio line at or below 1 (:data:`RATIO_LINE`): ``where`` a class gives a :class:`ConfigError`
    (``AnalysisSettings.norm_threshold``), a function a :class:`BadInputError`."""
    if not value > 1:
        error, label = (ConfigError, f"{where}.{name}") if where[:1].isupper() else (BadInputError, f"{where}: {name}")
        raise error(f"{label}={value!r} must be > 1: {RATIO_LINE}")


def finite(where: str, name: str, value: Any) -> Any:
    """``value`` (a tensor) when every element is finite, else a :class:`BadInputError` saying how many are not."""
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        bad = int((~torch.isfinite(value)).sum())
        if bad:
            raise BadInputError(f"{where}: {name} holds {bad} NaN or inf value(s) of {value.numel()}; pass finite "
                                "values")
    return value


def as_list(where: str, name: str, value: Any) -> list:
    """``list(value)`` for any iterable but a string; anything else is an error naming it."""
    if isinstance(value, (str, bytes)):
        raise BadInputError(f"{where}: {name}={value!r:.40} must be a list, not one string")
    try:
        return list(value)
    except TypeError:
        raise BadInputError(f"{where}: {name}={_show(value)} is not a list; pass e.g. [0, 1]") from None


F = typing.TypeVar("F", bound=Callable)


def entry_point(fn: F) -> F:
    """Mark a public entry point and check its arguments against its annotations on every call.

    A function's arguments, or a dataclass's fields (before its own ``__post_init__`` runs), are
    checked here: a value that does not fit its annotation is a
    :class:`BadInputError` (a field: :class:`ConfigError`) naming the parameter, the value and what
    to pass. The test-time type checker (``tests/typecheck.py``: beartype over the package,
    jaxtyping over its shape-annotated modules) skips entry points, so that a wrong argument gets
    this message instead of a type-checker error.
    """
    if isinstance(fn, type):
        if "__post_init__" in fn.__dict__:  # the dataclass __init__ calls it: check before it runs
            original = fn.__dict__["__post_init__"]

            def __post_init__(self: object) -> None:
                check_fields(self)
                original(self)

            fn.__post_init__ = __post_init__  # type: ignore[attr-defined]
        else:
            init = fn.__init__

            @functools.wraps(init)
            def __init__(self: object, *args: object, **kwargs: object) -> None:
                init(self, *args, **kwargs)
                check_fields(self)

            fn.__init__ = __init__  # type: ignore[misc]
        return typing.no_type_check(fn)

    typing.no_type_check(fn)  # the test-time checker skips the body too: users never run it

    @functools.wraps(fn)
    def checked(*args: object, **kwargs: object) -> object:
        check_call(fn, args, kwargs)
        return fn(*args, **kwargs)

    return typing.no_type_check(checked)  # type: ignore[return-value]
