"""Every notebook in notebooks/ runs top to bottom without error, and prints what it was stored with:
the notebooks are stored with their outputs; a re-run cell must print the same words (Markdown a cell
displays included), and every number it prints is compared with the stored one (a decimal within one unit
of its printed precision plus 2% of its value, a whole number (a count of nodes) exactly; timings, sizes,
memory addresses and temporary paths are left out)."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import sys

sys.path.insert(0, str(Path(__file__).parent))  # tests/browser.py

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


CHROMIUM = __import__("shutil").which("chromium")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    stored = nbformat.read(path, as_version=4)
    for i, (old, new) in enumerate(zip(_code_cells(stored), _code_cells(nb))):
        assert_same_values(printed(old), printed(new), f"{path.name}, code cell {i}")


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?=[x%]?(?:[^\w.]|\.(?!\w)|$))")
"""A printed number, also before a unit x or % and at the end of a sentence ("12.5x", "0.83."), but
not inside a name such as A0.H1@0 or M2.N90, nor a hex address."""
VARIES = re.compile(r"\b0x[0-9a-f]+|\d+(?:\.\d+)? ?(?:s|ms|min|seconds|MiB|MB|GiB)\b|/tmp/\S+|pytest-\d+"
                    r"|## What each analysis cost\n[\s\S]*?(?=\n## |\Z)")
"""What may differ between runs: timings (also the atlas' section of what each analysis cost, in forwards),
sizes, addresses and temporary paths."""


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def printed(cell) -> str:
    """The text a cell printed to stdout or returned (figures and HTML objects are left to the browser
    test; stderr and progress-bar widgets are left out: libraries show bars and warnings there that depend
    on the machine and on what is cached, e.g. transformers' GGUF conversion bar on a fresh machine)."""
    texts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream" and o.get("name") != "stdout":
            continue
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {}):
            continue  # a progress-bar widget (tqdm.auto in a kernel); its text/plain is the bar
        data = o.get("data", {})
        text = o.get("text") or data.get("text/markdown") or data.get("text/plain", "")  # Markdown: its text
        if isinstance(text, list):
            text = "".join(text)
        if text and not text.startswith(("<Figure", "<IPython")):
            texts.append(VARIES.sub(" ", text))
    return "\n".join(texts)


def words(text: str) -> str:
    """``text`` with each number replaced by ``#`` and its white space collapsed (a table's padding
    follows its numbers' widths)."""
    return " ".join(NUMBER.sub("#", text).split())


def assert_same_values(stored: str, ran: str, where: str) -> None:
    assert words(stored) == words(ran), f"{where}: printed other words:\n{ran}\n--- stored:\n{stored}"
    old, new = NUMBER.findall(stored), NUMBER.findall(ran)
    assert len(old) == len(new), f"{where}: printed {len(new)} numbers, stored {len(old)}:\n{ran}\n--- stored:\n{stored}"
    for a, b in zip(old, new):
        digits = len(a.split(".")[1].split("e")[0]) if "." in a else 0
        x, y = float(a), float(b)
        # a decimal: a rounding of its last printed digit and 2% of it; a whole number (a count) exactly
        slack = 10.0 ** -digits + 0.02 * max(abs(x), abs(y)) if digits else 0.0
        assert abs(x - y) <= slack, f"{where}: printed {b}, stored {a}"


def test_a_changed_printed_value_is_caught():
    cell = next(c for c in _code_cells(nbformat.read(NOTEBOOKS[0], as_version=4)) if "SinkReport" in printed(c))
    text = printed(cell)
    assert len(NUMBER.findall(text)) > 20  # the sink report's table
    assert_same_values(text, text, "same")
    for a, b in (("Sink_0^0.3 = 0.", "Sink_0^0.3 = 1."), ("Sink_0^0.3 = 0.", "Sink_0^0.3 = 0.1")):
        changed = text.replace(a, b, 1)  # a tenfold change, and a change in the first decimal
        assert changed != text
        with pytest.raises(AssertionError, match="printed"):
            assert_same_values(text, changed, "changed")
    assert NUMBER.findall("12.5x at layer 2. Sink = 0.83.") == ["12.5", "2", "0.83"]
    with pytest.raises(AssertionError, match="other words"):  # a changed verdict, its numbers the same
        assert_same_values("(a) holds: 13 nodes", "(a) fails: 13 nodes", "changed")
    for count in ("14", "264"):  # a count is exact, a large one too
        with pytest.raises(AssertionError, match=f"printed {int(count) + 1}"):
            assert_same_values(f"{count} nodes", f"{int(count) + 1} nodes", "changed")
    md = {"outputs": [{"output_type": "display_data", "data": {"text/markdown": "**(a) holds**",
                                                               "text/plain": "<IPython.core.display.Markdown object>"}}]}
    assert printed(md) == "**(a) holds**"


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a JupyterLab server and a browser, about a minute: opt in with -m slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_a_notebook_opens_and_runs_in_jupyterlab(tmp_path):
    """The quickstart as stored, opened in JupyterLab in a headless browser: its stored figures show,
    Run All runs every code cell in a fresh kernel without an error output (read from the notebook's
    model, every cell, not only the rendered ones; this is the quickstart's execution test), and the
    interactive circuit figure answers a click."""
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request

    from browser import Browser

    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(NOTEBOOKS[0], work / NOTEBOOKS[0].name)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--IdentityProvider.token=p0", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**__import__("os").environ, "HOME": str(tmp_path)})
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=p0", timeout=5)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError("JupyterLab did not start")
                time.sleep(0.5)
        with Browser(tmp_path / "profile") as b:
            b.open(f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOKS[0].name}?token=p0", 1280, 900)

            def wait(expression, seconds=180):
                end = time.time() + seconds
                while not b.js(expression):
                    if time.time() > end:
                        raise AssertionError(f"timed out waiting for {expression}")
                    time.sleep(0.5)

            wait("document.querySelectorAll('.jp-Notebook .jp-Cell').length > 5")
            wait("document.querySelectorAll('.jp-Notebook .jp-OutputArea-output img').length >= 2")  # stored plots
            # the stored circuit figure: its PNG, as the notebook is not trusted yet (Lab runs no stored script)
            assert "CircuitFigure" not in b.js("document.querySelector('.jp-Notebook').innerText")
            panel = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.sessionContext)"
            wait(f"(() => {{ const w = {panel}; return w && w.sessionContext.session && w.sessionContext.session.kernel "
                 "&& w.sessionContext.session.kernel.status === 'idle'; })()")
            b.js(f"window.jupyterapp.shell.activateById({panel}.id)")  # a headless page has no focus to give it
            b.js("window.ran = false; window.jupyterapp.commands.execute('notebook:run-all-cells')"
                 ".then(() => { window.ran = true; })")  # resolves when the last cell has run
            wait("window.ran")
            ran = b.js(f"{panel}.content.model.sharedModel.cells.filter(c => c.cell_type === 'code').map(c => "
                       "[c.execution_count, (c.outputs || []).filter(o => o.output_type === 'error')"
                       ".map(o => o.ename + ': ' + o.evalue)])")
            code_cells = sum(c.cell_type == "code" for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells)
            assert len(ran) == code_cells and all(count for count, _ in ran), ran  # every code cell ran
            assert not [e for _, errs in ran for e in errs], ran
            errors = b.js("[...document.querySelectorAll('[data-mime-type=\"application/vnd.jupyter.stderr\"]')]"
                          ".map(e => e.textContent).filter(t => t.includes('Traceback') || t.includes('Error'))")
            assert not errors, errors
            assert not b.js("document.querySelectorAll('.jp-OutputArea-output .jp-RenderedText[data-mime-type="
                            "\"application/vnd.jupyter.error\"]').length")
            cell = f"{panel}.content.widgets.find(c => c.model.sharedModel.getSource().includes('circuit_figure'))"
            b.js(f"{panel}.content.scrollToCell({cell})")  # Lab renders only the cells in view
            figure = f"{cell}.node.querySelector('.p0-circuit')"
            wait(f"!!({figure} && {figure}.querySelector('[id=\"node:M1@0\"]'))", 60)
            b.js(f"{figure}.querySelector('[id=\"node:M1@0\"]').dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
            assert b.js(f"{figure}.getAttribute('data-highlight')") == "M1@0"  # its script ran in JupyterLab
    finally:
        server.terminate()
        server.wait(timeout=60)
