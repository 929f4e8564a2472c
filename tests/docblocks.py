"""Figures and counts quoted in the docs, written by the test or benchmark that measures them.

A quoted figure sits in a marked block of a Markdown file::

    <!-- measured:NAME -->
    ...text the measuring code wrote...
    <!-- /measured:NAME -->

:func:`check` compares the block with what was just measured and fails, naming the block, when they
differ; with ``P0_WRITE_DOCS=1`` in the environment it writes the new text instead (run the test or
benchmark that way, then commit the docs). Nothing else edits these blocks, so no figure is kept by hand.
"""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- measured:{re.escape(name)} -->\n)(.*?)(<!-- /measured:{re.escape(name)} -->)", re.S)


def read(path: str, name: str) -> str:
    """The text of block ``name`` in ``path`` (relative to the repository root)."""
    match = _pattern(name).search((ROOT / path).read_text(encoding="utf-8"))
    if match is None:
        raise LookupError(f"{path} has no block <!-- measured:{name} -->")
    return match.group(2)


def write(path: str, name: str, text: str) -> None:
    """Replace block ``name`` of ``path`` with ``text``."""
    file = ROOT / path
    old = file.read_text(encoding="utf-8")
    read(path, name)
    file.write_text(_pattern(name).sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(3), old),
                    encoding="utf-8")


def check(path: str, name: str, text: str) -> None:
    """Fail unless block ``name`` of ``path`` says ``text`` (``P0_WRITE_DOCS=1``: write it)."""
    if os.environ.get("P0_WRITE_DOCS") == "1":
        write(path, name, text)
        return
    stated = read(path, name)
    assert stated.strip() == text.strip(), (
        f"{path}'s block {name!r} is out of date; run this test again with P0_WRITE_DOCS=1 and commit it.\n"
        f"stated:\n{stated}\nmeasured:\n{text}")
