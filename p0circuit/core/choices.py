"""The names the command line offers, without importing the code that implements them.

``p0circuit --help`` and argument errors must answer at once, before torch and TransformerLens
are imported (seconds). The built-in corruption and method names are defined once, in
:mod:`p0circuit.core.names`, which the classes and registrations take their names from;
``tests/test_cli.py`` checks that they equal the registries. When the registries are already imported
(a corruption or method defined in the same process, or a ``--plugin`` module), :func:`offered` adds what
they hold. ``p0circuit analyze``'s number options come from ``AnalysisSettings`` itself
(``studies/analysis/settings.py``, which imports no torch: ``number_fields``). Model and metric entries
and their named models are in :mod:`p0circuit.core.entries`.
"""

import functools
import sys

from p0circuit.core import names


@functools.lru_cache(maxsize=None)
def builtin(what: str) -> tuple[str, ...]:
    """The built-in ``METHODS`` or ``CORRUPTIONS`` (:mod:`p0circuit.core.names`, where they are defined)."""
    if what not in ("METHODS", "CORRUPTIONS"):
        raise ValueError(f"choices.builtin: {what!r} is not 'METHODS' or 'CORRUPTIONS'")
    return tuple(getattr(names, what))


def offered(what: str) -> list[str]:
    """The sorted names of ``METHODS`` or ``CORRUPTIONS``: the built-in ones, plus any registered
    in this process (the registries, if imported)."""
    names = set(builtin(what))
    registry = sys.modules.get("p0circuit.patching")
    if registry is not None:
        names |= set(getattr(registry, what))
    return sorted(names)
