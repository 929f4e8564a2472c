"""Modules and names that moved (installed when :mod:`p0circuit` is imported).

* :data:`RENAMED`: modules moved into the layer subpackages in this release. Importing an old path
  still works for this release: it gives the new module and a ``FutureWarning`` naming it.
* :data:`MODULES`: modules removed earlier; importing one raises an ``ImportError`` naming where
  its contents live now, instead of a bare "No module named ...".
"""

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any, Optional

from p0circuit.core.errors import warn_user

RENAMED = {
    "p0circuit.errors": "p0circuit.core.errors",
    "p0circuit.args": "p0circuit.core.args",
    "p0circuit.io": "p0circuit.core.io",
    "p0circuit.hooks": "p0circuit.core.hooks",
    "p0circuit.types": "p0circuit.core.types",
    "p0circuit.entries": "p0circuit.core.entries",
    "p0circuit.choices": "p0circuit.core.choices",
    "p0circuit.plugins": "p0circuit.core.plugins",
    "p0circuit.progress": "p0circuit.core.progress",
    "p0circuit.tokens": "p0circuit.models.tokens",
    "p0circuit.planted": "p0circuit.models.planted",
    "p0circuit.metrics.report": "p0circuit.measures.sink_report",
    "p0circuit.metrics": "p0circuit.measures",
    "p0circuit.drawing": "p0circuit.figures.drawing",
    "p0circuit.graphs": "p0circuit.figures.graphs",
    "p0circuit.plotting": "p0circuit.figures.plotting",
    "p0circuit.viz": "p0circuit.figures.viz",
    "p0circuit.analysis": "p0circuit.studies.analysis",
    "p0circuit.find": "p0circuit.studies.discovery.discover",
    "p0circuit.discovery": "p0circuit.studies.discovery.session",
    "p0circuit.locate": "p0circuit.studies.discovery.locate",
    "p0circuit.experiments": "p0circuit.studies.experiments",
    "p0circuit.training": "p0circuit.studies.training",
    "p0circuit.tracking": "p0circuit.studies.tracking",
    "p0circuit.cli": "p0circuit.surfaces.cli",
    "p0circuit.sweep": "p0circuit.surfaces.sweep",
    "p0circuit.report": "p0circuit.surfaces.sweep_report",
    "p0circuit.measures.report": "p0circuit.measures.sink_report",  # from p0circuit.metrics import report
    "p0circuit.patching.inputs": "p0circuit.patching.setup",  # the Setup's module, named for what it holds
}
"""Old module path -> its new path (a package's submodules follow it: ``p0circuit.metrics.norms``
-> ``p0circuit.measures.norms``)."""

MODULES = {
    "p0circuit.faithfulness": "p0circuit.patching.faithfulness (or p0circuit.faithfulness_curve)",
    "p0circuit.validation": "p0circuit.models.checks (check_model, check_devices), "
                            "p0circuit.patching.metrics.check_metric, p0circuit.core.types.parse_nodes and "
                            "p0circuit.patching.edges.parse_edges",
    "p0circuit.experiments.plotting": "p0circuit.figures.plotting",
    "p0circuit.patching.numerics": "p0circuit.patching.check",
    "p0circuit.patching.runs": "p0circuit.patching.job (class PatchJob) and p0circuit.patching.ops",
    "p0circuit.patching.activation": "p0circuit.patching.methods.activation (or p0circuit.activation_patch)",
    "p0circuit.patching.path": "p0circuit.patching.methods.path (or p0circuit.path_patch)",
    "p0circuit.patching.attribution": "p0circuit.patching.methods.attribution (or p0circuit.attribution_patch)",
}
"""Removed module path -> where its contents live now."""

NAMES = {
    "disagreements": "p0circuit.check_attribution(model, tokens, ...).linearization, or "
                     "p0circuit.patching.check.differences(approx, exact, tol)",
}
"""Old top-level name -> its replacement."""

CLASSES = {
    "FaithfulCircuit": "faithful_circuit returns the one p0circuit.Circuit; its search's numbers are circuit.search "
                       "(a p0circuit.patching.NodeSearch)",
    "EdgeCircuit": "faithful_edges returns the one p0circuit.Circuit; its edge search's numbers are "
                   "circuit.edge_search (a p0circuit.patching.EdgeSearch)",
}
"""Old class names that now resolve to :class:`~p0circuit.Circuit` for this release, with a ``FutureWarning`` saying
what the searches return instead (an ``isinstance`` check against the old name still holds)."""


def old_class(name: str) -> Any:
    """The class an old name of :data:`CLASSES` resolves to (the one Circuit), after its ``FutureWarning``."""
    warn_user(f"p0circuit.{name} is gone: {CLASSES[name]}; the old name means p0circuit.Circuit for this release "
              "only", FutureWarning)
    return importlib.import_module("p0circuit.core.types").Circuit


_LONGEST_FIRST = sorted(RENAMED, key=len, reverse=True)


def new_name(fullname: str) -> Optional[str]:
    """The new path of a moved module (or of a submodule of a moved package); None if it did not move."""
    for old in _LONGEST_FIRST:
        if fullname == old or fullname.startswith(old + "."):
            return RENAMED[old] + fullname[len(old):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(self.target)

    def exec_module(self, module: Any) -> None:
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith("p0circuit."):  # first on sys.meta_path: every other import leaves at once
            return None
        if fullname in MODULES and fullname not in RENAMED:
            raise ImportError(f"{fullname} moved: use {MODULES[fullname]}", name=fullname)
        new = new_name(fullname)
        if new is None:
            return None
        warn_user(f"{fullname} moved to {new}; the old path works for this release only", FutureWarning)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
