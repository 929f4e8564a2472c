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

A name belongs to one source: an extension cannot shadow a built-in or another plugin (the error
names both); a plugin imported again replaces its own names quietly.
"""

import importlib
import importlib.util
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from p0circuit.core.errors import ConfigError, warn_user

GROUP = "p0circuit.core.plugins"
"""The entry-point group of installed plugins."""
OLD_GROUP = "p0circuit.plugins"
"""The group's name before the layout moved plugins into ``core``: still loaded, with a ``FutureWarning``."""


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
    ours = Path(__file__).resolve().parent.parent  # p0circuit's frames left out: the plugin's line is the one to fix
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<") and "importlib" not in f.filename
              and ours not in Path(f.filename).resolve().parents]
    where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "its import"
    return ConfigError(f"plugin {name!r} raised {type(err).__name__} at {where}: {err}; fix the plugin (p0circuit "
                       "imports it to register what it defines)")


def load_plugins(names: Iterable[str]) -> list[ModuleType]:
    """:func:`load_plugin` for each name, in order."""
    return [load_plugin(n) for n in names]


def installed() -> list[Any]:
    """The entry points of installed plugins: in the group :data:`GROUP`, then the old :data:`OLD_GROUP`
    (``importlib.metadata``'s, or the ``importlib_metadata`` backport's where another package installed it)."""
    return [ep for group in (GROUP, OLD_GROUP) for ep in entry_points(group=group)]


def load_installed() -> list[ModuleType]:
    """Import every plugin of :func:`installed` (nothing when none is installed); one under the old
    group's name gets a ``FutureWarning`` saying to rename its group."""
    found = installed()
    for ep in found:
        if ep.group == OLD_GROUP:
            warn_user(f"plugin {ep.name!r} ({ep.value}) is installed under the entry-point group {OLD_GROUP!r}, now "
                      f"named {GROUP!r}: rename the group in its pyproject ([project.entry-points.\"{GROUP}\"]); "
                      "the old name is still loaded for one release", FutureWarning)
    return [ep.load() for ep in found]
