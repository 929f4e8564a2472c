"""The ``>>>`` examples in the docstrings of the public functions a notebook user calls first, run as written
(doctest; the fast tier). The modules are found by reading the package for examples, not listed by hand, so an
example added anywhere is run the day it lands."""

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "p0circuit"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_with_examples() -> list[str]:
    """Every module of the package whose source holds a ``>>>`` example."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text():
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = modules_with_examples()


def test_the_examples_cover_the_first_calls():
    """At least 15 examples, on the calls a notebook user makes first."""
    finder = doctest.DocTestFinder()
    names = {t.name.rsplit(".", 1)[-1] for m in MODULES for t in finder.find(importlib.import_module(m)) if t.examples}
    assert len(names) >= 15, sorted(names)
    for first in ("build_planted", "probe_tokens", "sink_report", "activation_patch", "faithful_circuit",
                  "faithful_edges", "compare", "keyed_on", "sink_reads"):
        assert first in names, first


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run_as_written(name):
    failed, attempted = doctest.testmod(importlib.import_module(name), optionflags=FLAGS, report=True)
    assert attempted > 0 and failed == 0, f"{name}: {failed} of {attempted} examples failed (the output above)"
