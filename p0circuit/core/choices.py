"""The names the command line offers, read from the code that defines them, without importing it.

``p0circuit --help`` and argument errors must answer at once, before torch and TransformerLens
are imported (seconds). So the built-in corruption and method names are read from their own
definitions, the source of the modules that register them, with :mod:`ast` (a few milliseconds):
a corruption is a class with ``name: ClassVar[str] = "..."`` in ``patching/corruptions.py``, a
method a ``register(Method("...", ...))`` call in a module of ``patching/methods/``. There is no
second list to keep in step; ``tests/test_cli.py`` checks that what is read here equals the
registries. When the registries are already imported (a corruption or method defined in the same
process, or a ``--plugin`` module), :func:`offered` adds what they hold. ``p0circuit analyze``'s number
options come from ``AnalysisSettings`` itself (``studies/analysis/settings.py``, which imports no torch:
``number_fields``). Model and metric entries and their named models are in :mod:`p0circuit.core.entries`.
"""

import ast
import functools
import sys
from pathlib import Path

PATCHING = Path(__file__).parent.parent / "patching"


def _literal(node: ast.AST) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _corruptions(tree: ast.Module) -> set[str]:
    """Names of the classes that set ``name: ClassVar[str] = "..."`` (defining one registers it)."""
    return {_literal(stmt.value) for cls in tree.body if isinstance(cls, ast.ClassDef) for stmt in cls.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "name"
            and stmt.value is not None} - {""}


def _methods(tree: ast.Module) -> set[str]:
    """First arguments of ``Method("...", ...)`` calls (each passed to ``register``)."""
    return {_literal(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Method" and node.args} - {""}


@functools.lru_cache(maxsize=None)
def builtin(what: str) -> tuple[str, ...]:
    """The built-in ``METHODS`` or ``CORRUPTIONS``, read from their defining modules' source."""
    if what == "CORRUPTIONS":
        files, read = [PATCHING / "corruptions.py"], _corruptions
    elif what == "METHODS":
        files, read = sorted((PATCHING / "methods").glob("*.py")), _methods
    else:
        raise ValueError(f"choices.builtin: {what!r} is not 'METHODS' or 'CORRUPTIONS'")
    return tuple(sorted(set().union(*(read(ast.parse(f.read_text(encoding="utf-8"))) for f in files))))


def offered(what: str) -> list[str]:
    """The sorted names of ``METHODS`` or ``CORRUPTIONS``: the built-in ones, plus any registered
    in this process (the registries, if imported)."""
    names = set(builtin(what))
    registry = sys.modules.get("p0circuit.patching")
    if registry is not None:
        names |= set(getattr(registry, what))
    return sorted(names)
