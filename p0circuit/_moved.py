"""Modules and names that moved: importing an old path raises an ImportError naming the new one,
instead of a bare "No module named ..." (installed when :mod:`p0circuit` is imported)."""

import importlib.abc
import sys
from typing import Any

MODULES = {
    "p0circuit.faithfulness": "p0circuit.patching.faithfulness (or p0circuit.faithfulness_curve)",
    "p0circuit.validation": "p0circuit.models.checks (check_model, check_devices), "
                            "p0circuit.patching.metrics.check_metric, p0circuit.patching.sites.parse_nodes and "
                            "p0circuit.patching.edges.parse_edges",
    "p0circuit.experiments.plotting": "p0circuit.plotting",
    "p0circuit.patching.options": "p0circuit.patching.hooking",
    "p0circuit.patching.numerics": "p0circuit.patching.check",
    "p0circuit.patching.runs": "p0circuit.patching.job (class PatchJob) and p0circuit.patching.ops",
    "p0circuit.patching.activation": "p0circuit.patching.methods.activation (or p0circuit.activation_patch)",
    "p0circuit.patching.path": "p0circuit.patching.methods.path (or p0circuit.path_patch)",
    "p0circuit.patching.attribution": "p0circuit.patching.methods.attribution (or p0circuit.attribution_patch)",
}
"""Old module path -> where its contents live now."""

NAMES = {
    "disagreements": "p0circuit.check_attribution(model, tokens, ...).linearization, or "
                     "p0circuit.patching.check.differences(approx, exact, tol)",
}
"""Old top-level name -> its replacement."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname in MODULES:
            raise ImportError(f"{fullname} moved: use {MODULES[fullname]}", name=fullname)
        return None


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
