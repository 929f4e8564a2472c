"""The files of a discovery (``p0circuit discover``): the sink report, each circuit as JSON and DOT,
its figure (PNG, SVG, interactive HTML) and the heatmap of every candidate's effect. The discovery
itself is computed in :mod:`p0circuit.studies.discovery.session`; this module only writes it."""

import json
import shutil
from pathlib import Path
from typing import Union

import matplotlib.pyplot as plt

from p0circuit.core.io import strict, write_atomic
from p0circuit.figures.drawing import circuit_figure
from p0circuit.figures.graphs import to_dot, to_svg
from p0circuit.figures.plotting import plot
from p0circuit.studies.discovery.session import Discovery


def write_discovery(found: Discovery, out: Union[str, Path]) -> Path:
    """Under ``out``: ``sink_report.json`` and, per method, the circuit as ``circuit_<method>.json``
    and ``.dot``, its figure as ``.png``, ``.svg`` (Graphviz's layout when its ``dot`` program is
    installed, else matplotlib's) and ``.html`` (interactive), with the truth overlaid on a planted
    model, and the heatmap of every candidate's effect as ``effects_<method>.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = strict(json.loads(json.dumps(found.report.to_dict(), default=str)))  # NaN -> null: strict JSON
    write_atomic(out / "sink_report.json", json.dumps(report, indent=2, allow_nan=False))
    truth = found.resolved.truth
    for method, circuit in found.circuits.items():
        write_atomic(out / f"circuit_{method}.json", circuit.to_json(indent=2))
        write_atomic(out / f"circuit_{method}.dot", to_dot(circuit, truth=truth))
        figure = circuit_figure(circuit, truth)
        figure.save(out / f"circuit_{method}.png")
        figure.save(out / f"circuit_{method}.html")
        write_atomic(out / f"circuit_{method}.svg",
                     to_svg(circuit, truth=truth) if shutil.which("dot") else figure.svg())
        heat = plot(circuit)
        heat.savefig(str(out / f"effects_{method}.png"), dpi=100)
        plt.close(heat)
    return out
