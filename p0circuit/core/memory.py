"""This process's resident memory, read from Linux's ``/proc/self`` (``None`` elsewhere): the analysis
records each step's peak with it, so ``analysis.json`` says what a step needs on top of the model.

The peak is the kernel's high-water mark of resident pages (``VmHWM``), reset before a step by writing
``5`` to ``/proc/self/clear_refs`` (Linux 4.0 and later), after handing the heap's freed pages back
to the kernel (glibc's ``malloc_trim``), so that a step's peak is not an earlier step's freed memory.
Where the file cannot be written :func:`reset_peak` returns ``False`` and the caller records no peak.
Resetting the peak is process-wide: a caller's own reading of ``VmHWM``, and outside tools that read
the same mark (``getrusage``'s ``ru_maxrss``, ``/usr/bin/time``), start again from there; the analysis
keeps the process's peak before each reset and records it (``process_peak``)."""

import ctypes
import ctypes.util
import functools
import re
from pathlib import Path
from typing import Optional

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _status(field: str) -> Optional[int]:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return None if found is None else int(found.group(1)) * 1024


def resident() -> Optional[int]:
    """Resident memory now, in bytes."""
    return _status("VmRSS")


def peak() -> Optional[int]:
    """The peak resident memory since the last :func:`reset_peak` (or since the process started), in bytes."""
    return _status("VmHWM")


@functools.lru_cache(maxsize=None)
def _libc() -> Optional[ctypes.CDLL]:
    """The C library, found once (``find_library`` may run ``ldconfig``), or None."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _trim() -> None:
    """Return the C heap's free pages to the kernel (glibc; nothing elsewhere)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def reset_peak() -> bool:
    """Start a new peak from the memory resident now (after :func:`_trim`); ``False`` where the kernel
    does not allow it."""
    _trim()
    try:
        _CLEAR.write_text("5")
    except OSError:
        return False
    return True
