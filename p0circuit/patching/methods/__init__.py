"""The patching methods, one module each. Every module here is imported when the package is, and
registers its methods in :data:`p0circuit.patching.registry.METHODS`: adding a method is adding
one file to this folder (see docs/contributing.md)."""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_info.name}")

from p0circuit.patching.methods.activation import activation_patch  # noqa: E402
from p0circuit.patching.methods.attribution import attribution_patch  # noqa: E402
from p0circuit.patching.methods.path import path_patch  # noqa: E402

__all__ = ["activation_patch", "attribution_patch", "path_patch"]
