"""``p0circuit report DIR``: one self-contained HTML page for a sweep.

The page holds the sweep's settings, the summary table, the P0 norm ratio and attention to P0
per layer for every model (PNG images embedded as data URIs), the attention patterns of one
prompt (circuitsvis' bundled, self-contained form), and every cell's circuit graph (inline SVG,
or DOT text when Graphviz is missing). Nothing on the page loads from the network.
"""

import base64
import html
import io
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from p0circuit.errors import BadInputError, entry_point
from p0circuit.graphs import to_dot, to_svg
from p0circuit.io import write_atomic
from p0circuit.models.resolve import load_model
from p0circuit.plotting import finish, new_figure
from p0circuit.sweep.runner import read_records, rebuild_index, summary_table
from p0circuit.tokens import make_prompts
from p0circuit.types import Circuit
from p0circuit.viz import attention_html


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _norm_plots(records: list[dict[str, Any]]) -> str:
    per_model: dict[str, dict[str, Any]] = {}
    for r in records:
        if "sink_report" in r:
            per_model.setdefault(r["cell"]["model"], r["sink_report"])
    if not per_model:
        return "<p>No sink reports in these results.</p>"
    fig, (ax1, ax2) = new_figure(2)
    for name, rep in per_model.items():
        layers = range(len(rep["norm_ratio_resid"]))
        ax1.plot(layers, rep["norm_ratio_resid"], marker="o", label=name)
        ax2.plot(layers, [max(a) for a in rep["alpha"]], marker="o", label=name)
    ax1.set(xlabel="layer", ylabel="||h_0|| / mean ||h_t||", yscale="log", title="P0 norm ratio")
    ax2.set(xlabel="layer", ylabel="max over heads of alpha_0", title="attention to P0", ylim=(0, 1.05))
    ax1.legend(fontsize=8)
    finish(fig)
    return f'<img class="plot" alt="P0 norm ratio and attention to P0 per layer" src="{_png(fig)}">'


def _attention(records: list[dict[str, Any]]) -> str:
    cell = records[0]["cell"]
    model = load_model(cell["model"], seed=cell["seed"]).model
    layer = min(2, model.cfg.n_layers - 1)
    prompts = make_prompts(model, 1, min(16, model.cfg.n_ctx), source=cell.get("prompts", "auto"), seed=cell["seed"])
    what = "natural-English" if prompts.source == "english" else "random-id"
    return (f"<p>Attention patterns of layer {layer} of <code>{html.escape(cell['model'])}</code> on one {what} "
            f"prompt:</p>" + attention_html(model, prompts.tokens, layer))


def _graph(circuit: Circuit) -> str:
    if not circuit.nodes:
        return "<p class='empty'>empty circuit</p>"
    if shutil.which("dot"):
        svg = to_svg(circuit)
        return svg[svg.index("<svg"):]
    return f"<pre>{html.escape(to_dot(circuit))}</pre>"


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


@entry_point
def write_report(directory: Any, attention: bool = True) -> Path:
    """Write ``DIR/report.html`` from ``DIR/results.jsonl`` and return its path."""
    out = Path(directory)
    index = out / "results.jsonl"
    if not index.is_file() and not (out / "cells").is_dir():
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
        warnings.warn(f"report: {note}", stacklevel=2)
    if not records:
        raise BadInputError(f"{out} holds no readable finished cells" + (f" ({notes[0]})" if notes else " yet"))
    config = (out / "config.json").read_text() if (out / "config.json").exists() else "{}"
    cells = []
    for r in sorted(records, key=lambda r: json.dumps(r["cell"], sort_keys=True)):
        c = r["cell"]
        circuit = Circuit.from_dict(r["circuit"])
        scores = ", ".join(f"{k}={v:.3f}" for k, v in (r.get("scores") or {}).items() if v == v)
        cells.append(
            f"<section class='cell'><h3>{html.escape(' | '.join(str(c[k]) for k in ('model', 'prompts', 'corruption', 'method', 'metric')))}</h3>"
            f"<p>{html.escape(str(r.get('interpretation', '')))}</p><p>{html.escape(scores)}</p>{_graph(circuit)}</section>"
        )
    body = "\n".join([
        f"<h1>p0circuit sweep: {html.escape(out.name)}</h1>",
        f"<h2>Settings</h2><pre>{html.escape(config)}</pre>",
        f"<h2>Summary</h2><pre>{html.escape(summary_table(records))}</pre>",
        "<h2>Sink and norms per layer</h2>", _norm_plots(records),
        "<h2>Attention</h2>" + (_attention(records) if attention else "<p>(skipped)</p>"),
        "<h2>Circuits</h2>", *cells,
    ])
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>p0circuit report</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto} pre{background:#f4f4f4;padding:6px;"
            "overflow-x:auto} .plot{max-width:100%} .cell{border-top:1px solid #ccc}</style></head><body>"
            f"{body}</body></html>")
    path = out / "report.html"
    write_atomic(path, page)
    return path
