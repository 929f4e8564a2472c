"""Extensions from the user's own modules: a corruption, metric, method or model family defined
outside p0circuit, usable from Python, sweeps and the command line.

A plugin is an ordinary Python module that registers what it defines when it is imported:

* a corruption: a :class:`~p0circuit.Corruption` subclass with a ``name`` (registered by being defined);
* a method: ``p0circuit.patching.registry.register(Method(name, fn, level))``;
* a metric entry: :func:`p0circuit.core.entries.register_metric` (``name`` or ``name:<block>``);
* a model family: :func:`p0circuit.core.entries.register_family` (``spec:<name>``).

It is loaded by ``p0circuit --plugin MODULE ...`` (a module name or a ``.py`` file; repeatable),
``plugins = ["MODULE"]`` in a sweep config (loaded again in every worker process), or, for an
installed package, an entry point in the group :data:`GROUP` (``[project.entry-points."p0circuit.core.plugins"]``
in its pyproject), which the command line and sweeps load at start.
"""

import importlib
import importlib.util
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Iterable

from p0circuit.core.errors import ConfigError

GROUP = "p0circuit.core.plugins"
"""The entry-point group of installed plugins."""


def load_plugin(name: str) -> ModuleType:
    """Import a plugin by module name (``my_pkg.p0``) or file path (``plugins/mine.py``)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a plugin is a module name or a .py file, got {name!r}")
    if name.endswith(".py"):
        path = Path(name).resolve()
        if not path.is_file():
            raise ConfigError(f"plugin file {name!r} does not exist")
        key = f"p0circuit_plugin_{path.stem}_{abs(hash(str(path)))}"
        if key in sys.modules:
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as err:
            del sys.modules[key]
            raise _failed(name, err) from None
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name == name or name.startswith(f"{err.name}."):
            raise ConfigError(f"plugin module {name!r} cannot be imported (not on sys.path); give its module name as "
                              "Python imports it, or the path of its .py file") from None
        raise _failed(name, err) from None
    except Exception as err:
        raise _failed(name, err) from None


def _failed(name: str, err: Exception) -> ConfigError:
    """The plugin's own error in one line, with the file and line it came from."""
    if isinstance(err, SyntaxError):
        where = f"{err.filename}, line {err.lineno}"
        return ConfigError(f"plugin {name!r} does not parse: {where}: {err.msg}; fix the plugin file")
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "its import"
    return ConfigError(f"plugin {name!r} raised {type(err).__name__} at {where}: {err}; fix the plugin (p0circuit "
                       "imports it to register what it defines)")


def load_plugins(names: Iterable[str]) -> list[ModuleType]:
    """:func:`load_plugin` for each name, in order."""
    return [load_plugin(n) for n in names]


def load_installed() -> list[ModuleType]:
    """Import every plugin installed under the entry-point group :data:`GROUP` (nothing is imported
    when none is installed)."""
    return [ep.load() for ep in entry_points(group=GROUP)]
