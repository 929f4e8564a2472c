"""Exceptions raised by p0circuit.

Every error says what was wrong and what to do about it. They subclass ``ValueError`` (or
``TypeError``/``KeyError`` where that is the natural category) so that generic handlers still
catch them, and :class:`P0CircuitError` so that callers can catch ours alone.
"""

import typing
from dataclasses import fields
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class P0CircuitError(Exception):
    """Base class of every error p0circuit raises on purpose."""


class BadInputError(P0CircuitError, ValueError):
    """Tokens, prompts or tensors that cannot be measured as given."""


class ConfigError(P0CircuitError, ValueError):
    """A model spec, sweep config or option with an invalid value."""


class MissingHookError(P0CircuitError, KeyError):
    """The model lacks a hook point that a metric or patch needs."""

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return str(self.args[0]) if self.args else ""


class NonFiniteError(P0CircuitError, FloatingPointError):
    """NaN or inf found in activations or weights."""


class CheckpointError(P0CircuitError, OSError):
    """A local checkpoint directory that cannot be loaded."""


def from_known_keys(cls: type, data: dict, what: str) -> object:
    """``cls(**data)`` for a dataclass, naming unknown keys and the valid ones first."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}; valid keys: {sorted(known)}")
    return cls(**data)


def entry_point(fn: F) -> F:
    """Mark a public entry point that validates its own arguments.

    Its annotations say what it accepts, but the test-time type checker (jaxtyping + beartype over
    the whole package) skips it, so that a wrong argument gets the entry point's own message (what
    was wrong and what to do) instead of a type-checker error.
    """
    return typing.no_type_check(fn)
