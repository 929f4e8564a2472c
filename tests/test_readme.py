"""The README's quick look, run as written: the planted part in the fast tier, the whole block (a real model
loaded, offline) with the real-model tests. A changed name or signature in the package breaks it here first."""

import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")  # the figures are drawn, not shown

README = Path(__file__).parent.parent / "README.md"
REAL_LINE = "model = p0.load_smollm2()"
"""Where the quick look turns to a real model."""


def quick_look() -> str:
    """The README's first Python block (under "A quick look in Python")."""
    text = README.read_text()
    section = text.split("## A quick look in Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README.md lost its quick look's python block"
    return block.group(1)


def test_the_quick_look_is_the_one_tested():
    code = quick_look()
    assert code.startswith("import p0circuit as p0") and REAL_LINE in code
    assert "faithful_circuit" in code  # the headline search is on the first screen


def test_the_readme_quick_look_runs_on_the_planted_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever it writes stays out of the repository
    code = quick_look().split(REAL_LINE)[0]
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - the README's own code
    assert scope["p0"].compare(scope["circuit"], scope["pm"].truth)["edge_recall"] == 1.0
    assert scope["found"].search.faithful and scope["edges"].edge_search.faithful


@pytest.mark.real
def test_the_readme_quick_look_runs_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(quick_look(), str(README), "exec"), scope)  # noqa: S102
    assert scope["ids"].shape[0] == 1 and int(scope["ids"][0, 0]) != scope["model"].tokenizer.bos_token_id
