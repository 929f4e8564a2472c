"""Exceptions raised by p0circuit.

Every error says what was wrong and what to do about it. They subclass ``ValueError`` (or
``TypeError``/``KeyError`` where that is the natural category) so that generic handlers still
catch them, and :class:`P0CircuitError` so that callers can catch ours alone.
"""

import functools
import typing
from typing import Any
from dataclasses import fields



class P0CircuitError(Exception):
    """Base class of every error p0circuit raises on purpose."""


class BadInputError(P0CircuitError, ValueError):
    """Tokens, prompts or tensors that cannot be measured as given."""


class BadCallError(P0CircuitError, TypeError):
    """A call of the wrong shape: an unknown or missing argument, an option passed by position."""


class ConfigError(P0CircuitError, ValueError):
    """A model spec, sweep config or option with an invalid value."""


class MissingHookError(P0CircuitError, KeyError):
    """The model lacks a hook point that a metric or patch needs."""

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return str(self.args[0]) if self.args else ""


class NonFiniteError(P0CircuitError, FloatingPointError):
    """NaN or inf found in activations or weights."""


FLOAT16_MAX = 65504.0
"""float16's largest finite value: massive activations at P0 pass it (Gemma 3's reach about 1e5)."""


def non_finite_fix(dtype: object, found: str) -> str:
    """A :class:`NonFiniteError`'s message: what was ``found`` and what to do. Under float16 an inf is an
    overflow (the fix: bfloat16 or float32); otherwise the weights (or the metric) are to be checked."""
    if str(dtype) == "torch.float16":
        return (f"float16 overflow: {found}; float16 holds values up to {FLOAT16_MAX:,.0f}, and the residual stream at "
                "position 0 (massive activations) can pass that: load the model in bfloat16 or float32 "
                "(load_checkpoint(path, dtype=torch.bfloat16), or model.to(torch.float32))")
    return (f"{found}: check the model's weights (torch.isfinite(p).all() for its parameters; where a hook is named, "
            "that block's) and the metric (a division by zero?)")


class CheckpointError(P0CircuitError, OSError):
    """A local checkpoint directory that cannot be loaded."""


def nearest(value: object, choices: "typing.Iterable[str]") -> str:
    """``" (did you mean 'x'?)"`` for the choice closest to a mistyped ``value``, or ``""``."""
    import difflib  # small, and only needed when a name is wrong

    found = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def source_of(obj: object) -> str:
    """Where a registered class or function is defined, ``module.qualname`` (a ``functools.partial``: its
    function's): a registry's identity of who registered a name. The same source registering the name
    again (its module imported again: a sweep worker, a notebook reload) replaces it quietly."""
    obj = obj.func if isinstance(obj, functools.partial) else obj
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def check_key(kind: str, name: object, source: str) -> str:
    """``name`` when it can be a registry key (a string of letters, digits and ``_``, as an identifier
    is), else an error naming ``source`` (what registers it) and the fix."""
    if not isinstance(name, str) or not name.isidentifier():
        like = f"my_{kind.replace(' ', '_')}"
        raise ConfigError(f"{source}: a {kind}'s name must be a string of letters, digits and '_' that does not start "
                          f"with a digit (no ':', '-' or spaces), like {like!r}; got {name!r}: rename it")
    return name


def already_registered(kind: str, name: str, holder: str, newcomer: str) -> ConfigError:
    """The error for a registry name taken by another source: extensions never shadow each other
    (a built-in included). ``holder`` says who has the name (``"by module.Class"``)."""
    return ConfigError(f"a {kind} named {name!r} is already registered {holder}; {newcomer} cannot take it: give it "
                       "another name")


def from_known_keys(cls: type, data: Any, what: str) -> object:
    """``cls(**data)`` for a dataclass, naming unknown keys and the valid ones first."""
    known = {f.name for f in fields(cls)}
    if not isinstance(data, typing.Mapping) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"a {what} is a table of its keys ({sorted(known)}), got {data!r:.60} ({type(data).__name__})")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}; valid keys: {sorted(known)}")
    return cls(**data)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointed at the user's line: the first frame on the stack outside the p0circuit package
    (through however many of its wrappers the call came, and past the import machinery when a warning is given
    while a module is imported), so a notebook or script shows its own line. Filters and the once-per-line
    registry behave as for ``warnings.warn`` from that line."""
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def skipped(frame: Any) -> bool:  # the package, a checker's wrapper of one of its functions, or importlib
        name = frame.f_code.co_filename
        return (os.path.abspath(name).startswith(package + os.sep) or name.startswith("<@beartype(p0circuit")
                or str(frame.f_globals.get("__name__", "")).startswith("p0circuit.")
                or ("importlib" in name and "_bootstrap" in name))

    frame = sys._getframe(1)
    while frame.f_back is not None and skipped(frame):
        frame = frame.f_back
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__", "<string>"), registry=registry)
