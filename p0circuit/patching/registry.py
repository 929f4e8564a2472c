"""The patching methods by name: records that say what each method is, in one place.

A method registers itself in its own module (:mod:`p0circuit.patching.methods`) with
``register(Method(name, fn, level, ...))``, where ``fn`` is made with
:func:`~p0circuit.patching.options.takes_options` (it takes the shared options); :func:`p0circuit.discover`, the command line and sweep
configs read their choices from :data:`METHODS`, and every consumer of a result reads its level
(node or edge) from the result, never from the method's name.
"""

from dataclasses import dataclass
from typing import Callable, Literal

from p0circuit.core.args import entry_point
from p0circuit.core.errors import ConfigError, already_registered, check_key, nearest, source_of
from p0circuit.patching.options import taken_by
from p0circuit.patching.result import PatchResult

Level = Literal["node", "edge"]


@entry_point
@dataclass(frozen=True)
class Method:
    """A patching method: ``fn(model, tokens, *, <its own arguments>, options=PatchOptions) -> PatchResult``."""

    name: str
    """Registry name (``discover(method=...)``, ``--methods``, sweep ``methods``)."""
    fn: Callable[..., PatchResult]
    """The function; everything after ``tokens`` is keyword-only."""
    level: Level
    """What its effects are over: ``node`` or ``edge``."""
    exact: bool = True
    """False for first-order estimates (attribution)."""
    summary: str = ""
    """One line for ``--help`` and the docs."""

    def __post_init__(self) -> None:
        check_key("patching method", self.name, source_of(self.fn))
        if self.level not in ("node", "edge"):
            raise ConfigError(f"method {self.name!r}: level must be 'node' or 'edge', got {self.level!r}")


METHODS: dict[str, Method] = {}
"""Registry: method name -> :class:`Method`."""


@entry_point
def register(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS`. Its name is an identifier-like string no other function holds
    (a built-in method's or another plugin's name is refused, naming both); the same function
    (``module.qualname``) registering it again, its module imported again, replaces it quietly."""
    me = source_of(method.fn)  # (its name and level: checked when the Method was made)
    if not taken_by(method.fn):
        raise ConfigError(f"method {method.name!r}: its function must take the shared options; decorate it with "
                          "@p0circuit.takes_options() and read them from its options= argument (a PatchOptions)")
    if method.name in METHODS and source_of(METHODS[method.name].fn) != me:
        raise already_registered("patching method", method.name, f"by {source_of(METHODS[method.name].fn)}", me)
    METHODS[method.name] = method
    return method


@entry_point
def get_method(name: str) -> Method:
    """The registered method ``name``, or a clear error listing the choices."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}{nearest(name, METHODS)}; choose one of {sorted(METHODS)}")
    return METHODS[name]
