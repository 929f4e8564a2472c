"""The names the command line offers, without importing the modules that define them.

``p0circuit --help`` and argument errors must answer at once, before torch and TransformerLens
are imported (seconds). The registries stay the truth: ``tests/test_cli.py`` checks that these
lists equal them, so a method or corruption added to a registry and not here fails the tests; and
when the registries are already imported (a corruption or method defined in the same process, then
``p0circuit.cli.main([...])``, or a ``--plugin`` module), :func:`offered` adds what they hold.
Model and metric entries and their named models are in :mod:`p0circuit.entries`.
"""

import sys

METHODS = ("activation", "attribution", "attribution_edges", "path", "triage")
"""Patching methods (``p0circuit.METHODS``)."""
CORRUPTIONS = ("pos_mean", "resample", "shift", "swap", "zero")
"""Corruptions (``p0circuit.CORRUPTIONS``)."""


def offered(what: str) -> list[str]:
    """The sorted names of ``METHODS`` or ``CORRUPTIONS``: the ones above, plus any registered in
    this process (the registries, if imported)."""
    names = set(globals()[what])
    registry = sys.modules.get("p0circuit.patching")
    if registry is not None:
        names |= set(getattr(registry, what))
    return sorted(names)
