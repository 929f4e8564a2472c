"""``p0circuit report DIR``: one self-contained HTML page for a sweep.

From the top: how many of the config's cells finished, failed or have not run (a partial sweep
says so before anything else); the settings as a table; one row per cell with its clean and
corrupted metric, signal, circuit size and scores; the P0 norm ratio and attention to P0 per layer
of every model; the attention patterns of one prompt (circuitsvis' bundled, self-contained
form); then the circuits, grouped so that the cells that differ only in the corruption stand side
by side (the controls next to the corruption that finds the circuit), each with the heatmap of
every candidate's effect and the interactive circuit figure, the planted ground truth overlaid
where there is one. Nothing on the page loads from the network.
"""

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any, Optional

import matplotlib.pyplot as plt

from p0circuit.figures.drawing import to_html
from p0circuit.core.errors import BadInputError, warn_user
from p0circuit.core.args import entry_point
from p0circuit.core.io import write_atomic
from p0circuit.figures.plotting import finish, new_figure, plot
from p0circuit.surfaces.sweep.config import Cell, SweepConfig
from p0circuit.surfaces.sweep.record import CellRecord
from p0circuit.surfaces.sweep.store import read_records, rebuild_index
from p0circuit.core.types import Circuit

GROUP = ("model", "prompts", "method", "metric")
"""The cell fields that a row of side-by-side circuits shares (the corruption varies along it)."""


def _png(fig: Any, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _floats(values: Any) -> list[float]:
    """A list read back from strict JSON: null is NaN again."""
    return [math.nan if v is None else float(v) for v in values]


def _number(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


def _norm_plots(records: list[CellRecord]) -> str:
    per_model: dict[str, dict[str, Any]] = {}
    for r in records:
        per_model.setdefault(r.grid.model, r.sink_report)
    fig, (ax1, ax2) = new_figure(2)
    for name, rep in per_model.items():
        ratio = _floats(rep["norm_ratio_resid"])
        ax1.plot(range(len(ratio)), ratio, marker="o", label=name)
        alpha = [max(_floats(a), default=math.nan) for a in rep["alpha"]]
        ax2.plot(range(len(alpha)), alpha, marker="o", label=name)
    ax1.set(xlabel="layer", ylabel="||h_0|| / mean ||h_t||", yscale="log", title="P0 norm ratio")
    ax2.set(xlabel="layer", ylabel="max over heads of alpha_0", title="attention to P0", ylim=(0, 1.05))
    ax1.legend(fontsize=8)
    finish(fig)
    return _png(fig, "P0 norm ratio and attention to P0 per layer")


def _attention(records: list[CellRecord]) -> str:
    from p0circuit.models.resolve import load_model
    from p0circuit.models.tokens import make_prompts
    from p0circuit.figures.viz import attention_html

    cell = records[0].grid
    model = load_model(cell.model, seed=cell.seed).model
    layer = min(2, model.cfg.n_layers - 1)
    prompts = make_prompts(model, 1, min(16, model.cfg.n_ctx), source=cell.prompts, seed=cell.seed)
    what = "natural-English" if prompts.source == "english" else "random-id"
    return (f"<p>Attention patterns of layer {layer} of <code>{html.escape(cell.model)}</code> on one {what} "
            f"prompt:</p>" + attention_html(model, prompts.tokens, layer))


def _table(header: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _settings(config: dict[str, Any]) -> str:
    rows = [[f"<code>{html.escape(k)}</code>", html.escape(", ".join(map(str, v)) if isinstance(v, list) else str(v))]
            for k, v in config.items()]
    return _table(["setting", "value"], rows, "settings")


def _scores(record: CellRecord) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in (record.scores or {}).items() if v is not None)


def _summary(records: list[CellRecord]) -> str:
    rows = []
    for r in records:
        c, s = r.grid, r.circuit.settings
        rows.append([html.escape(str(getattr(c, k))) for k in ("model", "prompts", "corruption", "method", "metric")] + [
            "yes" if r.signal else "<b class='nosignal'>no signal</b>", _number(s.get("clean_metric")),
            _number(s.get("corrupted_metric")), str(len(r.circuit.nodes)), str(len(r.circuit.edges)),
            html.escape(_scores(r))])
    return _table(["model", "prompts", "corruption", "method", "metric", "signal", "clean", "corrupted", "nodes",
                   "edges", "against the truth"], rows, "summary")


def _cell(record: CellRecord) -> str:
    c = record.grid
    circuit = Circuit.from_dict(record.circuit.to_dict())
    truth = Circuit.from_dict(record.truth.to_dict()) if record.truth else None
    s = circuit.settings
    lines = [f"<h4>{html.escape(c.corruption)}</h4>",
             f"<p class='metric'>metric clean <b>{_number(s.get('clean_metric'))}</b>, corrupted "
             f"<b>{_number(s.get('corrupted_metric'))}</b>; {len(circuit.nodes)} nodes, {len(circuit.edges)} edges</p>",
             f"<p>{html.escape(record.interpretation)}</p>"]
    if _scores(record):
        lines.append(f"<p class='scores'>against the planted truth: {html.escape(_scores(record))}</p>")
    if record.signal:
        lines.append(_png(plot(circuit), f"effects of every candidate, {c.corruption}"))
    if circuit.nodes or truth is not None:
        lines.append(to_html(circuit, truth, title=f"{c.method}, {c.corruption}"))
    return f"<section class='cell' data-corruption='{html.escape(c.corruption)}'>{''.join(lines)}</section>"


def _circuits(records: list[CellRecord], corruptions: list[str]) -> str:
    groups: dict[tuple, list[CellRecord]] = {}
    for r in records:
        groups.setdefault(tuple(getattr(r.grid, k) for k in GROUP), []).append(r)
    parts = []
    for key, members in groups.items():
        members.sort(key=lambda r: corruptions.index(r.grid.corruption) if r.grid.corruption in corruptions
                     else len(corruptions))
        parts.append(f"<h3>{html.escape(' | '.join(map(str, key)))}</h3><div class='row'>"
                     + "".join(_cell(r) for r in members) + "</div>")
    return "".join(parts)


def _status(config: Optional[SweepConfig], records: list[CellRecord], failed: list[dict[str, Any]]) -> str:
    done = {r.key for r in records}
    bad = [f for f in failed if f.get("key") not in done]
    if config is None:
        return (f"<div class='status partial'>{len(records)} cells finished; the config (config.json) is missing, "
                "so how many the sweep has is unknown</div>")
    total = len(config.cells())
    missing = total - len(done & {c.key for c in config.cells()}) - len(bad)
    cls = "complete" if len(done) >= total else "partial"
    text = (f"{len(done)} of {total} cells finished" + (f", {len(bad)} failed" if bad else "")
            + (f", {missing} not run yet" if missing > 0 else ""))
    items = "".join(f"<li><code>{html.escape(Cell(**f['cell']).label())}</code>: {html.escape(str(f.get('error')))}</li>"
                    for f in bad if isinstance(f.get("cell"), dict))
    hint = "" if cls == "complete" else " (run the same sweep command again to finish it)"
    return f"<div class='status {cls}'>{text}{hint}</div>" + (f"<ul class='failed'>{items}</ul>" if items else "")


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


CSS = """
body{font-family:sans-serif;max-width:1400px;margin:auto;padding:0 12px} pre{background:#f4f4f4;padding:6px;overflow-x:auto}
img.plot{max-width:100%;height:auto} .scroll{overflow-x:auto} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left} th{background:#eee} .summary td{white-space:nowrap}
.status{padding:10px 14px;margin:12px 0;font-weight:bold;border-radius:4px}
.status.partial{background:#f5a623;color:#222} .status.complete{background:#2e8b57;color:#fff}
.row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.cell{flex:1 1 420px;min-width:0;border:1px solid #ccc;border-radius:4px;padding:0 8px 8px}
.p0-circuit svg{max-width:100%;height:auto} .nosignal{color:#b2182b}
"""


@entry_point
def write_report(directory: Any, attention: bool = True) -> Path:
    """Write ``DIR/report.html`` from the sweep's cell files and return its path."""
    out = Path(directory)
    index = out / "results.jsonl"
    if not index.is_file() and not (out / "cells").is_dir():
        if (out / "analysis.json").is_file():  # an analysis' directory: its report is already there
            raise BadInputError(f"{out} holds an analysis, not a sweep: `p0circuit report` reads a sweep's results; "
                                f"the analysis' own report is {out / 'report.html'} (written by `p0circuit analyze`)")
        raise BadInputError(f"{out} has no results.jsonl: run `p0circuit sweep CONFIG --out {out}` first")
    records, notes = read_records(out)
    if (out / "cells").is_dir() and index.is_file():
        torn = [i + 1 for i, line in enumerate(index.read_text(encoding="utf-8", errors="replace").splitlines())
                if line.strip() and not _parses(line)]
        if torn:
            rebuild_index(out)
            notes.append(f"results.jsonl was unreadable at line(s) {torn[:5]} (cut short by a crash?); rebuilt it from "
                         f"the {len(records)} cell files")
    for note in notes:
        warn_user(f"report: {note}")
    if not records:
        raise BadInputError(f"{out} holds no readable finished cells" + (f" ({notes[0]})" if notes else " yet"))
    saved = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else None
    config = SweepConfig(**saved) if saved else None
    failed = [json.loads(p.read_text()) for p in sorted((out / "failed").glob("*.json"))] if (out / "failed").is_dir() else []
    records.sort(key=lambda r: r.grid.label())
    corruptions = list(config.corruptions) if config else sorted({r.grid.corruption for r in records})
    body = "\n".join([
        f"<h1>p0circuit sweep: {html.escape(out.name)}</h1>",
        _status(config, records, failed),
        "<h2>Settings</h2>" + (_settings(saved) if saved else "<p>config.json is missing.</p>"),
        "<h2>Summary</h2>", _summary(records),
        "<h2>Sink and norms per layer</h2>", _norm_plots(records),
        "<h2>Attention</h2>" + (_attention(records) if attention else "<p>(skipped)</p>"),
        "<h2>Circuits</h2><p>Each row holds the cells that differ only in the corruption, side by side. Heatmaps: "
        "red, the component carries the clean-to-corrupted change of the metric; blue, it works against it. "
        "Figures: drag to pan, scroll to zoom, hover for an effect, click a node to highlight every path through it."
        "</p>", _circuits(records, corruptions),
    ])
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width, "
            f"initial-scale=1'><title>p0circuit report</title><style>{CSS}</style></head><body>{body}</body></html>")
    path = out / "report.html"
    write_atomic(path, page)
    return path
