"""The seconds a process spends before and around an analysis' steps: its imports, counted where p0circuit
imports its heavy modules (the first public name used, ``p0.load_smollm2``, or the command line's import of
the analysis), so that a record can say what the steps did not pay for. Imports only the standard library."""

import time
from contextlib import contextmanager
from typing import Iterator

_spent = {"seconds": 0.0, "depth": 0}


@contextmanager
def importing() -> Iterator[None]:
    """Count the time of the block as import time (nested blocks once, the outermost)."""
    _spent["depth"] += 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _spent["depth"] -= 1
        if _spent["depth"] == 0:
            _spent["seconds"] += time.perf_counter() - start


def import_seconds() -> float:
    """Seconds this process has spent in :func:`importing` blocks (torch and TransformerLens included when they
    were first imported there; 0 when the caller imported p0circuit's modules directly)."""
    return round(_spent["seconds"], 2)
