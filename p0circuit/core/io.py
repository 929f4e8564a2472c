"""Writing files and directories so that they appear whole or not at all, and where p0circuit keeps what it derives
from the real models' files (:func:`cache_root`).

A reader (a resumed sweep, the report, a resumed training run) never sees half a file: text goes
to a temporary file that is renamed over the target, and a checkpoint directory is filled under a
temporary name and renamed when complete.
"""

import glob
import math
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Union

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError


def strict(x: Any) -> Any:
    """``x`` with tuples as lists and every NaN or infinity as None: JSON that strict readers accept
    (``json.dumps(strict(x), allow_nan=False)``)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    return x


def describe(value: Any, depth: int = 0) -> Any:
    """``value`` as a JSON-able record that tells two settings apart: a tensor by its shape, dtype
    and a digest of its contents, a function by where it is defined (module, name, file and line)
    and the values it is bound to (closure, defaults, a partial's arguments), a dataclass by its
    public fields, tuples as lists; anything else by its repr (a long one by its type)."""
    if depth > 4:
        return type(value).__name__
    import dataclasses
    import hashlib

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v, depth + 1) for k, v in value.items()}
    if hasattr(value, "detach") and hasattr(value, "shape"):  # a tensor (torch is not imported here)
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256((data.double() if data.is_floating_point() else data).numpy().tobytes())
        return {"tensor": list(data.shape), "dtype": str(data.dtype).replace("torch.", ""),
                "sha256": digest.hexdigest()[:16]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: describe(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if callable(value):
        code = getattr(value, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        out = {"function": f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}",
               "defined": where}
        # what the same code is bound to: two lambdas of one line that capture other values (other
        # logit ids, say) are other metrics, and compare unequal
        bound = [c.cell_contents for c in (getattr(value, "__closure__", None) or ()) if _filled(c)]
        bound += list(getattr(value, "__defaults__", None) or ())
        bound += [getattr(value, "args", ()), getattr(value, "keywords", {})] if hasattr(value, "func") else []
        if bound:
            out["bound"] = [describe(b, depth + 1) if b is not value else "itself" for b in bound]
        return out
    text = repr(value)
    return text if len(text) <= 200 else f"{type(value).__name__} object"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet filled
        return False
    return True


def run_dir(command: str, entry: str, *settings: str) -> Path:
    """The default output directory of ``p0circuit <command>`` for a model entry and settings:
    ``runs/<command>/<entry>[/<settings>]``, each part made a directory name (``real:smollm2`` ->
    ``real-smollm2``; settings joined by ``-``), so runs of different models or settings never share
    a directory."""
    def safe(text: str) -> str:
        return "".join(c if c.isalnum() or c in "._-" else "-" for c in text.replace(":", "-")).strip("-.")

    path = Path("runs") / command / (safe(entry) or "model")
    return path / safe("-".join(settings)) if settings else path


@entry_point
def write_atomic(path: Union[str, Path], text: str) -> None:
    """Write ``text`` to ``path`` so that it appears whole or not at all: through a temporary sibling
    (``<name>.<pid>.tmp``) renamed over it, removed again when the write is cut short (an error, Ctrl-C); one left by
    a process that was killed is removed by the next write of ``path`` (:func:`clear_stale`). A path whose directory
    does not exist (or is a file) is refused before anything is written."""
    path = Path(path)
    if not path.parent.is_dir():
        raise BadInputError(f"write_atomic: path={str(path)!r}: {str(path.parent)!r} is not a directory; make it first "
                            "(or choose a path in one)")
    clear_stale(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def out_dir(where: str, out: Union[str, Path]) -> Path:
    """``out`` as a directory to write into, after refusing one that is a file or lies under a file (nothing is made
    here)."""
    out = Path(out)
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        lies = "is" if parent == out else f"lies under {str(parent)!r}, which is"
        raise BadInputError(f"{where}: out={str(out)!r} {lies} a file, not a directory; choose another directory")
    return out


def out_file(where: str, path: Union[str, Path]) -> Path:
    """``path`` as a file to write, after refusing one that is a directory or whose directory does not exist (or is a
    file): nothing is drawn or computed for a file that cannot be written."""
    path = Path(path)
    if path.is_dir() or not path.parent.is_dir():
        why = "is a directory" if path.is_dir() else f"lies in {str(path.parent)!r}, which is not a directory"
        raise BadInputError(f"{where}: path={str(path)!r} {why}; pass the path of a file in an existing directory")
    return path


def clear_stale(path: Path) -> list[Path]:
    """Remove the temporary files that writes of ``path`` cut short left beside it (``<name>.<pid>.tmp`` of a process
    that no longer runs); returns them."""
    path = Path(path)
    gone = []
    if path.parent.is_dir():
        for stale in path.parent.glob(f"{glob.escape(path.name)}.*.tmp"):
            pid = stale.name[len(path.name) + 1:-len(".tmp")]
            if pid.isdigit() and not _running(int(pid)):
                stale.unlink(missing_ok=True)
                gone.append(stale)
    return gone


@contextmanager
def file_atomic(final: Path) -> Iterator[Path]:
    """A temporary sibling of ``final`` to write, ``.<name>.<pid>.partial``, renamed over ``final`` in one step when
    the block ends and removed when it raises or is interrupted: another process that reads ``final`` (a sweep
    worker, a notebook kernel) never sees it half-written, and nothing half-written is left. Partial files of
    processes that no longer run (killed while writing) are removed first."""
    for stale in final.parent.glob(f".{final.name}.*.partial"):
        pid = stale.name[len(final.name) + 2:-len(".partial")]
        if pid.isdigit() and not _running(int(pid)):
            stale.unlink(missing_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def cache_root() -> Path:
    """Where p0circuit keeps what it derives from the real models' files (assembled GGUF files under ``models/``,
    converted models under ``gguf/``): ``$P0CIRCUIT_CACHE``, else ``~/.cache/p0circuit``."""
    return Path(os.environ.get("P0CIRCUIT_CACHE") or Path.home() / ".cache" / "p0circuit")


def write_dir_atomic(final: Path, fill: Callable[[Path], None]) -> Path:
    """Create directory ``final`` by ``fill(tmp)`` on a temporary sibling, then a rename.

    A process killed meanwhile leaves only ``.tmp_<name>_<pid>``, which :func:`remove_stale` clears.
    """
    tmp = final.parent / f".tmp_{final.name}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def remove_stale(directory: Path) -> None:
    """Remove the temporary directories of writes cut short in ``directory``."""
    for stale in directory.glob(".tmp_*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
