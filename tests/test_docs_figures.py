"""The figures the README and docs/guide.md show are what the code draws now: ``docs/figures/make.py`` draws them again
(from the README's quick look) and each must match the stored file: fewer than 0.05% of its pixels may differ by
more than antialiasing does (a label's sign flipped changes 0.3%); after a change to the figures, run
``python docs/figures/make.py`` and commit."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "figures" / "make.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_the_docs_show_is_drawn_by_the_script():
    make = _script()
    shown = {p.name for doc in (ROOT / "README.md", ROOT / "docs" / "guide.md")
             for p in map(Path, __import__("re").findall(r"\]\((?:docs/)?(figures/[\w.]+\.png)\)", doc.read_text()))}
    assert shown == set(make.FIGURES) and all((SCRIPT.parent / f).is_file() for f in make.FIGURES)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure drawn again, once."""
    return {p.name: p for p in _script().make(tmp_path_factory.mktemp("figures"))}


@pytest.mark.parametrize("name", ["planted_circuit.png", "planted_heatmap.png"])
def test_a_stored_figure_is_what_the_code_draws(drawn, name):
    from PIL import Image

    stored = np.asarray(Image.open(SCRIPT.parent / name).convert("RGB"), dtype=float)
    now = np.asarray(Image.open(drawn[name]).convert("RGB"), dtype=float)
    assert stored.shape == now.shape, f"{name}: {stored.shape} stored, {now.shape} drawn now: run docs/figures/make.py"
    changed = float((np.abs(stored - now) > 40).any(-1).mean())  # pixels that differ visibly (not antialiasing)
    assert changed < 0.0005, f"{name}: {changed:.2%} of its pixels differ from what the code draws: run docs/figures/make.py"
