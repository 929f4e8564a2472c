"""An analysis as files: ``analysis.json`` (strict JSON), ``analysis.md`` and a self-contained
``report.html`` whose figures are embedded PNG images (nothing loads from the network)."""

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from p0circuit.core.io import strict, write_atomic
from p0circuit.core.types import Kind, Node

_TITLES = {"without_bos": "without BOS", "with_bos": "with BOS"}


def _fmt(effects: dict[str, float], k: int = 8) -> str:
    items = list(effects.items())[:k]
    return ", ".join(f"{n} {v:+.3g}" for n, v in items) or "none"


def _stages(stages: list[Any]) -> str:
    return ", ".join(f"{k} at layer {l} ({r:.3g}x)" for k, l, r in stages) or "none"


def _curve(curve: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:.3f}" for k, v in curve.items()) or "n/a"


def markdown(d: dict[str, Any]) -> str:
    """The analysis as Markdown."""
    s = d["settings"]
    lines = [f"# P0-sink analysis of {d['model']}", "",
             f"{s['n_prompts']} prompts x {s['length']} tokens of text (a BOS token adds one); effects are normalized "
             "(the share of the clean-to-corrupted change of the metric that one component carries when it alone is "
             f"patched; positive raises the metric), kept at |effect| >= {s['threshold']}. Measured in "
             f"{d['timing']['seconds']:.0f} s of steps, {d['timing']['forwards']} times one forward of the batch "
             f"({d['timing']['forward_s'] * 1000:.0f} ms) timed in the same run.", "",
             f"**The paper's claim** (without BOS, position 0 becomes a sink): {d['verdict']['claim']}.", ""]
    for tag, title in _TITLES.items():
        sk = d["sinks"].get(tag)
        if sk is None:
            continue
        lines += [f"## {title[0].upper() + title[1:]}", ""]
        if "skipped" in sk:
            lines += [f"Not measured: {sk['skipped']}", ""]
            continue
        lines += [f"- Sink_0^0.3 = {sk['sink_rate']:.3f}; P0 norm stages: {_stages(sk['norm_stages'])}.",
                  "- Massive dimensions at P0 (dimension: layers, peak): " + ("; ".join(
                      f"{m['dim']}: {m['first_layer']}-{m['last_layer']}, {m['peak_value']:.4g} at layer "
                      f"{m['peak_layer']} ({m['peak_ratio']:.0f}x)" for m in sk["massive_dims"][:4]) or "none") + "."]
        by_where: dict[str, list[Any]] = {}
        for p in sk["sink_positions"]:
            by_where.setdefault(p["where"], []).append(p)
        for where, ps in by_where.items():
            peak = max(ps, key=lambda p: p["ratio"])
            lines.append(f"- Sink states at **{where}**: layers {', '.join(str(p['layer']) for p in ps)}; peak "
                         f"{peak['ratio']:.3g}x the prompt's median norm at layer {peak['layer']} (in "
                         f"{peak['share']:.0%} of prompts), attention received {peak['attention']:.3f} (strongest head "
                         f"{peak['max_head_attention']:.3f})" + (("; tokens " + ", ".join(
                             f"{t!r} x{c}" for t, c in peak.get("tokens", [])[:3])) if where == "other" else "") + ".")
        lines.append("")
        for o in d["onsets"].get(tag, []):
            lines += [f"### Onset at layer {o['layer']}, {o['where']}", ""]
            if "skipped" in o:
                lines += [f"Not measured: {o['skipped']}", ""]
                continue
            lines.append(f"Corruption `{o['corruption']}`, metric `{o['metric']}`: {o['clean']:.4g} clean -> "
                         f"{o['corrupted']:.4g} corrupted; {o['candidates']} candidate nodes ({o['seconds']:.1f} s).")
            if o.get("corruption_choice"):
                lines[-1] += f" Corruption chosen: {o['corruption_choice']['why']}."
            if not o["signal"]:
                lines += ["", f"No signal: {o['message']}", ""]
                continue
            lines += ["", f"- Nodes: {_fmt(o['nodes'], 12)}.",
                      f"- Faithfulness (k nodes kept: share of the change kept): {_curve(o['faithfulness'])}."]
            ep = o.get("edge_pass", {})
            if ep:
                lines.append(f"- Edges ({ep.get('candidates', 0)} candidates): {_fmt(o['edges'], 10)}.")
            sk_e = o.get("into_sinks") or {}
            if sk_e.get("candidates"):
                lines.append(f"- Edges into the sink heads' keys and values (metric `{sk_e['metric']}`, "
                             f"{sk_e['clean']:.3g} clean -> {sk_e['corrupted']:.3g}; {sk_e['candidates']} candidates): "
                             + (_fmt(sk_e["edges"], 8) if sk_e["signal"] else "no signal") + ".")
            elif sk_e.get("note"):
                lines.append(f"- Edges into the sink heads: {sk_e['note']}.")
            npass = o.get("neuron_pass", {})
            if "metric" in npass:
                lines.append(f"- Neurons writing `{npass['metric']}` ({npass['clean']:.4g} clean -> "
                             f"{npass['corrupted']:.4g}; MLPs {npass['mlps']}, {npass['screen']}): "
                             f"{_fmt(o['neurons'], 10)}; faithfulness within the confirmed: "
                             f"{_curve(npass['faithfulness_within_confirmed'])}.")
            elif npass.get("note"):
                lines.append(f"- Neurons: {npass['note']}.")
            lines.append("")
        v = d["variations"].get(tag)
        if v:
            lines += [f"### What changes at layer {v['layer']}", ""]
            for name, c in v["corruption"].items():
                text = c.get("error") or c.get("note") or (_fmt(c["nodes"], 6) if c["signal"] else
                                                          "no signal: " + c["message"])
                lines.append(f"- corruption `{name}`: {text}")
            for n, row in v["length"].items():
                lines.append(f"- {n} tokens: Sink_0^0.3 = {row['sink_rate']:.3f}; stages {_stages(row['norm_stages'])}"
                             + (f"; nodes {_fmt(row.get('nodes', {}), 6)}" if row.get("signal") else "; no signal"))
            lines.append("")
    if "truth" in d:
        lines += ["## Planted ground truth", "", "Nodes: " + ", ".join(d["truth"]["nodes"]),
                  "", "Edges: " + ", ".join(d["truth"]["edges"]), ""]
    return "\n".join(lines)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt  # here, not at the top: only the HTML page needs matplotlib

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figures(d: dict[str, Any]) -> dict[str, str]:
    """Per BOS setting: the P0 norm ratio and the strongest head's attention per layer, the alpha_0
    heatmap, and per onset the node effects as a layer x head (+ MLP) heatmap at P0."""
    import matplotlib.pyplot as plt  # here, not at the top: only the HTML page needs matplotlib

    figs: dict[str, str] = {}
    for tag, title in _TITLES.items():
        sk = d["sinks"].get(tag)
        if not sk or "skipped" in sk:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
        layers = range(len(sk["norm_ratio"]))
        axes[0].plot(layers, [x if x and math.isfinite(x) else float("nan") for x in sk["norm_ratio"]], marker="o")
        axes[0].axhline(d["settings"]["norm_threshold"], color="grey", ls=":")
        axes[0].set(yscale="log", xlabel="layer", ylabel="||h_0|| / mean ||h_t||", title=f"P0 norm ratio, {title}")
        axes[1].plot(layers, [max(a) for a in sk["alpha"]], marker="o", label="strongest head")
        axes[1].plot(layers, sk["sink_rate_per_layer"], marker="s", label="share of heads > 0.3")
        axes[1].set(xlabel="layer", ylim=(0, 1.05), title="attention to P0")
        axes[1].legend(fontsize=8)
        im = axes[2].imshow([list(r) for r in sk["alpha"]], aspect="auto", vmin=0, vmax=1, cmap="viridis",
                            origin="lower")
        axes[2].set(xlabel="head", ylabel="layer", title="alpha_0 per head")
        fig.colorbar(im, ax=axes[2])
        fig.tight_layout()
        figs[tag] = _png(fig)
        for o in d["onsets"].get(tag, []):
            if not o.get("effects"):
                continue
            grid = [[float("nan")] * (d["n_heads"] + 1) for _ in range(o["layer"] + 1)]
            for name, v in o["effects"].items():
                n = Node.parse(name)
                if n.pos != 0 or n.layer > o["layer"]:
                    continue
                if n.kind == Kind.HEAD:
                    grid[n.layer][n.head] = v
                elif n.kind == Kind.MLP:
                    grid[n.layer][d["n_heads"]] = v
            fig, ax = plt.subplots(figsize=(min(12, 2 + 0.5 * d["n_heads"]), 1.2 + 0.35 * (o["layer"] + 1)))
            im = ax.imshow(grid, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
            ax.set_xticks(range(d["n_heads"] + 1), [f"H{h}" for h in range(d["n_heads"])] + ["MLP"], fontsize=7)
            ax.set(ylabel="layer", title=f"effects at P0, onset layer {o['layer']} ({o['where']}, {o['corruption']})")
            fig.colorbar(im, ax=ax)
            fig.tight_layout()
            figs[f"{tag}/{o['where']}@L{o['layer']}"] = _png(fig)
    return figs


def report_html(d: dict[str, Any]) -> str:
    """A self-contained page: the Markdown's content as HTML with the figures."""
    figs = _figures(d)
    body = []
    current = ""
    for line in markdown(d).split("\n"):
        text = html.escape(line)
        text = _inline(text)
        if line.startswith("### "):
            body.append(f"<h3>{text[4:]}</h3>")
            key = None
            for k in figs:
                if "/" in k and line.startswith("### Onset at layer "):
                    where = line.split(", ", 1)[1]
                    layer = line.split("layer ")[1].split(",")[0]
                    if k.endswith(f"{where}@L{layer}") and k.startswith(current):
                        key = k
            if key:
                body.append(f'<img alt="node effects" src="{figs[key]}">')
        elif line.startswith("## "):
            current = {"Without BOS": "without_bos", "With BOS": "with_bos"}.get(line[3:], "")
            body.append(f"<h2>{text[3:]}</h2>")
            if current in figs:
                body.append(f'<img alt="norm ratio and attention to P0 per layer" src="{figs[current]}">')
        elif line.startswith("# "):
            body.append(f"<h1>{text[2:]}</h1>")
        elif line.startswith("- "):
            body.append(f"<li>{text[2:]}</li>")
        elif line:
            body.append(f"<p>{text}</p>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em;line-height:1.4}"
             "img{max-width:100%;display:block;margin:0.5em 0}code{background:#eee;padding:0 3px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>P0-sink analysis of {html.escape(d['model'])}"
            f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>")


def _inline(text: str) -> str:
    """Markdown ``code`` and **bold** as HTML."""
    out, parts = [], text.split("`")
    for i, part in enumerate(parts):
        out.append(f"<code>{part}</code>" if i % 2 else part)
    text = "".join(out)
    parts = text.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def write_all(result: Any, out: Path) -> None:
    """``analysis.json``, ``analysis.md`` and ``report.html`` in ``out``."""
    d = result.data
    write_atomic(out / "analysis.json", json.dumps(strict(d), indent=1, allow_nan=False))
    write_atomic(out / "analysis.md", markdown(d))
    write_atomic(out / "report.html", report_html(d))
