"""Writing files and directories so that they appear whole or not at all.

A reader (a resumed sweep, the report, a resumed training run) never sees half a file: text goes
to a temporary file that is renamed over the target, and a checkpoint directory is filled under a
temporary name and renamed when complete.
"""

import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable


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


def run_dir(command: str, entry: str, *settings: str) -> Path:
    """The default output directory of ``p0circuit <command>`` for a model entry and settings:
    ``runs/<command>/<entry>[/<settings>]``, each part made a directory name (``real:smollm2`` ->
    ``real-smollm2``; settings joined by ``-``), so runs of different models or settings never share
    a directory."""
    def safe(text: str) -> str:
        return "".join(c if c.isalnum() or c in "._-" else "-" for c in text.replace(":", "-")).strip("-.")

    path = Path("runs") / command / (safe(entry) or "model")
    return path / safe("-".join(settings)) if settings else path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that it appears whole or not at all."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
