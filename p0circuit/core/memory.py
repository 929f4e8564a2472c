"""This process's resident memory, read from Linux's ``/proc/self`` (``None`` elsewhere): the analysis
records each step's peak with it, so ``analysis.json`` says what a step needs on top of the model.

The peak is the kernel's high-water mark of resident pages (``VmHWM``), reset before a step by writing
``5`` to ``/proc/self/clear_refs`` (Linux 4.0 and later); where that file cannot be written the peak is
the process's peak so far, and :func:`reset_peak` says so by returning ``False``."""

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


def reset_peak() -> bool:
    """Start a new peak from the memory resident now; ``False`` where the kernel does not allow it."""
    try:
        _CLEAR.write_text("5")
    except OSError:
        return False
    return True
