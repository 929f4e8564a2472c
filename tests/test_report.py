"""The sweep report: one self-contained HTML page, checked as text and in a real headless browser."""

import json
import re
import shutil

import pytest

import p0circuit as p0

from p0circuit import BadInputError
from p0circuit.surfaces.cli import main
from p0circuit.surfaces.sweep_report import write_report
from p0circuit.surfaces.sweep import SweepConfig, run_sweep
from p0circuit.surfaces.sweep.record import CELL_SCHEMA
from p0circuit.surfaces.sweep.runner import CellsFailed

from browser import CHROMIUM, Browser


@pytest.fixture(scope="session")
def report(tmp_path_factory):
    """A partial sweep: of 4 cells, 2 finish (shift and its resample control), 1 fails (a checkpoint
    whose config names no architecture: found when the cell loads it) and 1 is not run."""
    out = tmp_path_factory.mktemp("sweep")
    (out / "broken").mkdir()
    (out / "broken" / "config.json").write_text('{"model_type": "llama"}')
    config = SweepConfig(models=["planted:rope", f"checkpoint:{out / 'broken'}"], corruptions=["shift", "resample"],
                         methods=["path"], n_prompts=6, seq_len=12)
    with pytest.raises(CellsFailed):
        run_sweep(config, out, progress=False, max_cells=3)
    return write_report(out)


def test_report_is_self_contained_and_says_what_is_missing(report):
    page = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing loads from the network
    assert "2 of 4 cells finished, 1 failed, 1 not run yet" in page
    assert "broken | auto | shift | path | sink_heads</code>: CheckpointError" in page  # the failed cell, its error
    assert "<table class='settings'>" in page and "<td><code>corruptions</code></td><td>shift, resample</td>" in page
    assert "data:image/png;base64," in page and "<h2>Circuits</h2>" in page
    assert "metric clean <b>1</b>, corrupted <b>" in page  # per cell, both runs' metric
    row = page[page.index("<div class='row'>"):]
    assert row.index("data-corruption='shift'") < row.index("data-corruption='resample'")  # one row, side by side
    assert "no signal" in page  # the resample control says so
    payloads = [json.loads(m) for m in re.findall(r'<script type="application/json">(.*?)</script>', page, re.S)]
    shift = payloads[0]["items"]
    assert shift["edge:M0@0->M1@0.mlp_in"]["status"] == "match"  # the planted truth overlaid
    control = payloads[1]["items"]
    assert {v["status"] for k, v in control.items() if k.startswith("edge:") and "metric" not in k} == {"missed"}


def test_report_needs_results(tmp_path):
    with pytest.raises(BadInputError, match="has no results.jsonl: run `p0circuit sweep"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


RED = (lambda p: p[0] > p[1] + 60 and p[0] > p[2] + 60)
"""A pixel of the heatmaps' and figures' red: RdBu's positive half, from its darkest end (103, 0, 31)
to the salmon near white, and the figure's #b2182b."""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
@pytest.mark.parametrize("width", [1280, 420])
def test_report_in_a_headless_browser(report, tmp_path, width):
    """What a reader sees at a desktop and a phone width: the partial-sweep banner first, nothing
    wider than the window, the controls beside (wide) or below (narrow) the shift cell, the
    heatmap's and the circuit's red, and a figure that answers hover and click."""
    with Browser(tmp_path / "profile") as b:
        b.open(report.resolve().as_uri(), width, 900)
        assert not b.errors, b.errors
        assert b.js("document.body.innerText.includes('Head selector')")  # circuitsvis rendered, offline
        banner = b.js("document.querySelector('.status').getBoundingClientRect().toJSON()")
        assert banner["top"] < 200
        shot = b.screenshot()
        shot.save(tmp_path / f"top_{width}.png")
        colour = shot.getpixel((int(banner["left"] + 6), int(banner["top"] + banner["height"] / 2)))
        assert max(abs(a - b_) for a, b_ in zip(colour, (245, 166, 35))) < 12, colour  # the partial banner's amber
        inner = b.js("innerWidth")
        assert b.js("document.documentElement.scrollWidth") <= inner
        rights = b.js("[...document.querySelectorAll('img.plot, .p0-circuit svg')].map(e => "
                      "e.getBoundingClientRect().right)")
        assert rights and max(rights) <= inner
        cells = b.js("[...document.querySelectorAll('.row')[0].querySelectorAll('.cell')].map(c => "
                     "c.getBoundingClientRect().toJSON())")
        assert len(cells) == 2
        if width >= 900:
            assert cells[0]["top"] == cells[1]["top"] and cells[0]["right"] < cells[1]["left"]
        else:
            assert cells[1]["top"] >= cells[0]["bottom"]
        heat = b.js("(() => { const r = document.querySelector(\"section[data-corruption='shift'] img.plot\")"
                    ".getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()")
        image = b.screenshot(tuple(heat))
        image.save(tmp_path / f"heatmap_{width}.png")
        assert sum(map(RED, image.getdata())) > 30  # the components that carry the change
        figure = "document.querySelector(\"section[data-corruption='shift'] .p0-circuit\")"
        box = b.js(f"(() => {{ const r = {figure}.getBoundingClientRect(); "
                   "return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()")
        drawn = b.screenshot(tuple(box))
        drawn.save(tmp_path / f"circuit_{width}.png")
        assert sum(map(RED, drawn.getdata())) > 30  # the edges with a positive effect
        node = f"{figure}.querySelector('[id=\"node:M1@0\"]')"
        b.js(f"(() => {{ const r = {node}.getBoundingClientRect(); {node}.dispatchEvent(new MouseEvent('mousemove', "
             "{bubbles: true, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2})); })()")
        assert b.js(f"{figure}.querySelector('.tip').textContent").startswith("M1@0")
        sink = f"{figure}.querySelector('[id=\"node:A2.H0@0\"]')"  # one of the two sink heads M1@0 writes keys to
        b.js(f"{sink}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        opacity = b.js(f"Object.fromEntries([...{figure}.querySelectorAll('[id^=\"node:\"],[id^=\"edge:\"]')]"
                       ".map(g => [g.id, g.style.opacity]))")
        on_path = ("node:A0.H0@0", "node:M0@0", "node:M1@0", "node:A2.H0@0", "node:metric", "edge:M1@0->A2.H0@0.k")
        assert all(opacity[k] == "1" for k in on_path), opacity
        assert opacity["node:A3.H0@0"] == opacity["edge:M1@0->A3.H0@0.k"] == "0.12"  # the other sink head: off it
        b.js(f"{figure}.querySelector('svg').dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        assert b.js(f"[...{figure}.querySelectorAll('[id^=\"node:\"]')].every(g => g.style.opacity === '1')")


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
    assert all(r["schema"] == CELL_SCHEMA for r in records)  # every cell record carries its version
    del records[0]["circuit"]
    records.append({k: v for k, v in records[-1].items() if k != "schema"})  # written before records were versioned
    index.write_text("\n".join(json.dumps(r) for r in records) + "\n{\"key\": \"tor")
    assert main(["report", str(out), "--no-attention"]) == 0
    err = capsys.readouterr().err
    assert "skipped results.jsonl line 1: the record lacks the key(s) ['circuit'] (CellRecord)" in err
    assert (f"skipped results.jsonl line {len(records)}: the record has no schema version (it was written by a p0circuit from before the "
            f"records were versioned); this p0circuit reads schema version {CELL_SCHEMA} only: sweep into a new --out") in err
    assert f"skipped results.jsonl line {len(records) + 1}: not valid JSON" in err


def test_a_sweep_computes_again_a_cell_of_another_version(report, tmp_path):
    """A cell written before cell records were versioned (or of another version) is not done: the same sweep computes
    it again and writes it over (the broken model's cells fail again, as in the fixture), and every finished record
    is of this version, which the summary reads."""
    from p0circuit.surfaces.sweep.runner import summary_table
    from p0circuit.surfaces.sweep.store import done_keys, read_records

    out = shutil.copytree(report.parent, tmp_path / "sweep")
    cells = sorted((out / "cells").glob("*.json"))
    old = json.loads(cells[0].read_text())
    cells[0].write_text(json.dumps({k: v for k, v in old.items() if k != "schema"}))
    assert done_keys(out) == {c.stem for c in cells[1:]}
    with pytest.raises(CellsFailed):
        run_sweep(SweepConfig(**json.loads((out / "config.json").read_text())), out, progress=False)
    assert json.loads(cells[0].read_text())["schema"] == CELL_SCHEMA and done_keys(out) == {c.stem for c in cells}
    records, notes = read_records(out)
    assert len(records) == len(cells) and not notes
    assert summary_table(records).count("planted:rope") == len(cells)
    cells[0].write_text(json.dumps({**old, "schema": CELL_SCHEMA + 1}))  # a newer p0circuit's: never overwritten
    with pytest.raises(p0.ConfigError, match="written by a newer p0circuit.*sweep into another --out"):
        run_sweep(SweepConfig(**json.loads((out / "config.json").read_text())), out, progress=False)
    assert json.loads(cells[0].read_text())["schema"] == CELL_SCHEMA + 1
