"""The sweep report: one self-contained HTML page, checked as text and in a real headless browser."""

import json
import re
import shutil
import subprocess

import pytest

from p0circuit import BadInputError
from p0circuit.cli import main
from p0circuit.report import write_report
from p0circuit.sweep import SweepConfig, run_sweep

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    config = SweepConfig(models=["planted:rope"], corruptions=["shift", "resample"], methods=["path"],
                         n_prompts=6, seq_len=12)
    run_sweep(config, out, progress=False)
    return write_report(out)


def test_report_is_self_contained(report):
    page = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing loads from the network
    assert "data:image/png;base64," in page and "<h2>Circuits</h2>" in page
    assert "M1@0-&gt;A2.H0@0" in page or "M1@0&#45;&gt;A2.H0@0" in page or "A2.H0@0" in page
    assert "NO SIGNAL" in page or "no signal" in page  # the resample control says so


def test_report_needs_results(tmp_path):
    with pytest.raises(BadInputError, match="has no results.jsonl: run `p0circuit sweep"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def _chromium(*args, tmp_path):
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_in_a_headless_browser(report, tmp_path):
    url = report.resolve().as_uri()
    dom = _chromium("--enable-logging=stderr", "--v=0", "--dump-dom", url, tmp_path=tmp_path)
    assert dom.returncode == 0
    errors = [l for l in dom.stderr.splitlines() if "Uncaught" in l or "ERROR:CONSOLE" in l]
    assert not errors, errors
    html = dom.stdout
    assert "<h2>Circuits</h2>" in html  # the attention view did not swallow the rest of the page
    assert html.count("<svg") >= 1 and '<img class="plot"' in html
    assert "Head selector" in html  # circuitsvis rendered from its bundled script
    shot = tmp_path / "shot.png"
    _chromium("--window-size=480,360", f"--screenshot={shot}", url, tmp_path=tmp_path)
    assert shot.exists() and shot.stat().st_size > 2000


def test_a_torn_index_is_rebuilt_and_bad_records_are_skipped_and_said(report, tmp_path, capsys):
    """Issue 14: a results.jsonl whose last line a crash cut short, and records missing fields."""
    out = shutil.copytree(report.parent, tmp_path / "sweep")
    index = out / "results.jsonl"
    lines = index.read_text().splitlines()
    index.write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]))
    assert main(["report", str(out), "--no-attention"]) == 0
    err = capsys.readouterr().err
    assert f"results.jsonl was unreadable at line(s) [{len(lines)}]" in err and "rebuilt it from the 2 cell files" in err
    assert len([json.loads(line) for line in index.read_text().splitlines()]) == len(lines)  # nothing finished lost
    shutil.rmtree(out / "cells")  # no cell files: the index alone, one record without its circuit
    records = [json.loads(line) for line in index.read_text().splitlines()]
    del records[0]["circuit"]
    index.write_text("\n".join(json.dumps(r) for r in records) + "\n{\"key\": \"tor")
    assert main(["report", str(out), "--no-attention"]) == 0
    err = capsys.readouterr().err
    assert "skipped results.jsonl line 1: the record lacks circuit" in err
    assert f"skipped results.jsonl line {len(records) + 1}: not valid JSON" in err
