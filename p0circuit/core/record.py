"""Typed JSON records: frozen dataclasses whose fields are a JSON object's keys, read back with their types.

A :class:`Record` writes itself with :meth:`Record.to_dict` (nested records as objects, a field left
:data:`ABSENT` left out) and reads a JSON object back with :meth:`Record.from_dict`, which checks every
key against the field's annotation, all the way down: a missing or unknown key, a value of the wrong
type (``"token"`` where an object belongs, ``null`` where a number does, ``true`` where a count does)
and a non-finite number anywhere are refused with a :class:`~p0circuit.core.errors.ConfigError` that
names the key path (``onsets['without_bos'][0].keyed_on.swapped``) and what to do. A record with a
``schema`` field checks its version first (:func:`check_schema`). Imports no torch: records are read
before any model is loaded.
"""

import ast
import dataclasses
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from dataclasses import MISSING, fields
from typing import Any, ClassVar, Optional, TypeVar, Union

from p0circuit.core.errors import ConfigError, P0CircuitError

SCHEMA = "schema"
"""The key of a versioned record's version."""


class Absent:
    """A key that a record's dict leaves out (``None`` is a value, and JSON holds it): the default of a
    field that some records have and others lack (a skipped onset has no ``nodes``)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __copy__(self) -> "Absent":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "Absent":
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Absent)

    def __hash__(self) -> int:
        return 0

    def __bool__(self) -> bool:  # an absent key reads as nothing: ``row.circuit or ...``
        return False


ABSENT = Absent()
"""The one :class:`Absent`."""
T = TypeVar("T")
Maybe = Union[T, Absent]
"""A field that some records lack (its key left out of ``to_dict()``)."""


def check_schema(data: Any, source: str, version: int, fix: str) -> None:
    """Refuse a file (``data``, read from ``source``) whose ``schema`` is not ``version``, saying which it
    is, which this p0circuit reads, and ``fix``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source} holds a JSON {type(data).__name__}, not an object: not a p0circuit record; {fix}")
    found = data.get(SCHEMA)
    if found == version and not isinstance(found, bool):
        return
    if found is None:
        said = "has no schema version (it was written by a p0circuit from before the records were versioned)"
    elif isinstance(found, int) and not isinstance(found, bool) and found > version:
        said = f"has schema version {found} (written by a newer p0circuit; upgrade p0circuit to read it as it is)"
    else:
        said = f"has schema version {found!r}"
    raise ConfigError(f"{source} {said}; this p0circuit reads schema version {version} only: {fix}")


def _name(hint: Any) -> str:
    """A type annotation in words, for the errors."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return "any JSON value"
    if hint is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(hint) if a is not Absent)
    if origin in (list, tuple):
        return f"a list of {_name(typing.get_args(hint)[0])}" if typing.get_args(hint) else "a list"
    if origin is dict:
        return f"an object of {_name(typing.get_args(hint)[1])}" if typing.get_args(hint) else "an object"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, Record):
        return f"an object ({hint.__name__})"
    return {int: "a whole number", float: "a finite number", str: "a string", bool: "true or false",
            dict: "an object", list: "a list"}.get(hint, getattr(hint, "__name__", str(hint)))


class _Mismatch(Exception):
    """A value that does not fit an annotation (caught where a union tries its next alternative)."""

    def __init__(self, path: str, hint: Any, value: Any, why: str = "") -> None:
        super().__init__(path)
        self.path, self.hint, self.value, self.why = path, hint, value, why


Mismatch = _Mismatch
"""What a record's own check (:meth:`Record._check`) raises for a value that does not fit: ``Mismatch(path, hint,
value, why)``, ``hint`` a type or what belongs there in words; :meth:`Record.from_dict` reports it by key path."""


class _Keys(_Mismatch):
    """A missing or unknown key of a record at ``path`` (said in ``said``)."""

    def __init__(self, path: str, said: str) -> None:
        super().__init__(path, dict, None)
        self.said = said


def _finite(value: Any, path: str) -> Any:
    """``value`` (any JSON value) with every number checked finite, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _Mismatch(path, float, value, "a non-finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(v, f"{path}[{i}]")
    return value


def read_value(value: Any, hint: Any, path: str) -> Any:
    """``value`` read as ``hint``: a nested record made, a number checked finite, a list or object read item by
    item; :class:`_Mismatch` (with the key path) where it does not fit."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return _finite(value, path)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not Absent]
        if value is None and type(None) in options:
            return None
        misses = []
        for option in options:
            if option is type(None):
                continue
            try:
                return read_value(value, option, path)
            except _Mismatch as miss:
                misses.append(miss)
        keyed = [m for m in misses if isinstance(m, _Keys)]
        if len(keyed) == len(misses) == 1:
            raise keyed[0]  # the one record this value could be, with the key it lacks
        own = [m for m in misses if not isinstance(m, _Keys)]
        if len(own) == 1 and len(misses) > 1 and isinstance(own[0].hint, str):
            raise own[0]  # the one record whose keys it has, refused by that record's own check
        deepest = max(misses, key=lambda m: len(m.path), default=None)
        if deepest is not None and deepest.path != path:
            raise deepest  # a record that fits at this level but not deeper: the deeper reason is the useful one
        raise _Mismatch(path, hint, value)
    if isinstance(hint, type) and issubclass(hint, Record):
        if not isinstance(value, dict):
            raise _Mismatch(path, hint, value)
        return hint._read(value, path)
    if origin is typing.Literal:
        if value not in typing.get_args(hint) or isinstance(value, bool) != any(isinstance(a, bool) for a in
                                                                               typing.get_args(hint)):
            raise _Mismatch(path, hint, value)
        return value
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch(path, hint, value)
        args = typing.get_args(hint)
        if not args:
            return _finite(list(value), path)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _Mismatch(path, hint, value, f"{len(value)} items where {len(args)} belong")
            return tuple(read_value(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        items = [read_value(v, args[0], f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise _Mismatch(path, hint, value)
        args = typing.get_args(hint)
        if not args:
            return _finite(dict(value), path)
        for k in value:
            if not isinstance(k, str):
                raise _Mismatch(f"{path}[{k!r}]", str, k, "a key that is not a string")
        return {k: read_value(v, args[1], f"{path}[{k!r}]") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise _Mismatch(path, hint, value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mismatch(path, hint, value)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch(path, hint, value)
        if not math.isfinite(value):
            raise _Mismatch(path, hint, value, "a non-finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _Mismatch(path, hint, value)
        return value
    if hint is type(None):
        if value is not None:
            raise _Mismatch(path, hint, value)
        return None
    raise TypeError(f"a record field annotated {hint!r} cannot be read from JSON (at {path})")


def _as_json(value: Any) -> Any:
    """A field's value as JSON: records as objects, containers item by item."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


class Record:
    """Base class of a frozen dataclass whose fields are a JSON object's keys (see the module docstring)."""

    SCHEMA_VERSION: ClassVar[Optional[int]] = None
    """The version a record with a ``schema`` field reads (None: an unversioned record)."""
    FIX: ClassVar[str] = ""
    """What to do about a file this record refuses (a damaged or other-version file)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field (``schema`` first), a nested record as its object, an absent one left out."""
        out: dict[str, Any] = {}
        names = [f.name for f in fields(self)]  # type: ignore[arg-type]
        for name in ([SCHEMA] if SCHEMA in names else []) + [n for n in names if n != SCHEMA]:
            value = getattr(self, name)
            if not isinstance(value, Absent):
                out[name] = _as_json(value)
        return out

    @classmethod
    def keys(cls) -> list[str]:
        """The record's keys (its fields' names), in order."""
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[T], data: Any, what: Optional[str] = None) -> T:
        """The record of a JSON object (``what``: the object, in words, for the errors): its schema version
        checked first where it has one, then every key against its field's annotation, by key path."""
        what = what or cls.__name__  # type: ignore[attr-defined]
        version = cls.SCHEMA_VERSION  # type: ignore[attr-defined]
        if version is not None and SCHEMA in cls.keys():  # type: ignore[attr-defined]
            check_schema(data, what, version, cls.FIX)  # type: ignore[attr-defined]
        if not isinstance(data, dict):
            raise ConfigError(f"{what} must be a JSON object, got {type(data).__name__}; {cls.FIX}".rstrip("; "))  # type: ignore[attr-defined]
        try:
            return cls._read(data, "")  # type: ignore[attr-defined]
        except _Keys as keys:
            where = f"{what}: its {keys.path.lstrip('.')!r}" if keys.path else what
            raise ConfigError(f"{where} {keys.said}; {cls._fix()}") from None  # type: ignore[attr-defined]
        except _Mismatch as miss:
            where = f"its key {miss.path.lstrip('.')}" if miss.path else "it"
            raise ConfigError(f"{what}: {where} must be {_name(miss.hint)}, got {miss.why or repr(miss.value)[:60]}; "
                              f"{cls._fix()}") from None  # type: ignore[attr-defined]

    @classmethod
    def _fix(cls) -> str:
        return cls.FIX or (f"a record's keys and their types are the fields of {cls.__module__}.{cls.__name__}")

    @classmethod
    def _read(cls: type[T], data: dict[str, Any], path: str) -> T:
        hints = typing.get_type_hints(cls)
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        required = [f.name for f in fields(cls)  # type: ignore[arg-type]
                    if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise _Keys(path, f"lacks the key(s) {missing} ({cls.__name__})")  # type: ignore[attr-defined]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise _Keys(path, f"has the unknown key(s) {unknown} ({cls.__name__}'s keys: {known})")  # type: ignore[attr-defined]
        values = {k: read_value(v, hints[k], f"{path}.{k}") for k, v in data.items()}
        try:
            record = cls(**values)
        except P0CircuitError as err:  # a record's own check when made (its keys disagree): by key path, with the fix
            raise _Mismatch(path, f"{cls.__name__} with keys that agree", data, str(err)) from None  # type: ignore[attr-defined]
        record._check(path)  # type: ignore[attr-defined]
        return record

    def _check(self, path: str) -> None:
        """What a record checks beyond its keys and types (nothing by default); ``path``: where it sits."""

    def replace(self: T, **changes: Any) -> T:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """``field name -> its docstring`` of a dataclass, read from the source of the class and of the dataclasses it
    inherits fields from (Python keeps no attribute docstrings at run time): what the written docs say of each key."""
    out: dict[str, str] = {}
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base) and base is not cls:
            out.update({k: v for k, v in field_docs(base).items() if k not in out})
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for stmt, after in zip(body, body[1:] + [None]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
            out[stmt.target.id] = " ".join(str(doc).split())
    return out


def describe_records(classes: typing.Sequence[type]) -> str:
    """The Markdown list of each record of ``classes``, its docstring's first paragraph and every key with its type
    and docstring: what docs/records.md says of the nested records (held to the code by a test)."""
    lines = []
    for cls in classes:
        first = _markdown(" ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split()))
        lines += [f"### `{cls.__name__}`", "", first, ""]
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in fields(cls):  # type: ignore[arg-type]
            lines.append(f"- `{f.name}` ({_name(hints[f.name])}): {_markdown(docs.get(f.name, ''))}")
        lines.append("")
    return "\n".join(lines)


def _markdown(text: str) -> str:
    """A docstring's reST (``x``, :func:`~a.b`) as Markdown (`x`, `b`)."""
    text = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    return text.replace("``", "`")
