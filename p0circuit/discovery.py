"""A whole discovery on one model, as the command line and each sweep cell run it: the sink report,
one circuit per method, and the scores against the ground truth when the model is planted.

:func:`run_discovery` computes; :meth:`Discovery.write` writes the files; ``str()`` is the text the
command line prints. Each circuit's level (nodes or edges) is read from the circuit.
"""

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from torch import Tensor

from p0circuit.discover import discover
from p0circuit.graphs import compare, to_dot, to_svg
from p0circuit.io import write_atomic
from p0circuit.metrics import SinkReport, sink_report
from p0circuit.models.resolve import Resolved
from p0circuit.patching import Corruption, PatchMetric
from p0circuit.types import Circuit


@dataclass
class Discovery:
    """What one discovery found."""

    resolved: Resolved
    """The model and, for planted models, the ground truth."""
    tokens: Tensor
    """The prompts."""
    report: SinkReport
    """The sink report on the prompts."""
    metric: PatchMetric
    """The patching metric."""
    circuits: dict[str, Circuit] = field(default_factory=dict)
    """Method name -> circuit."""

    def scores(self, method: str) -> Optional[dict[str, float]]:
        """Precision, recall and AUROC of ``method``'s circuit against the truth at the circuit's level."""
        truth = self.resolved.truth
        if truth is None:
            return None
        circuit = self.circuits[method]
        return {k: v for k, v in compare(circuit, truth).items() if k.startswith(circuit.level)}

    @property
    def exact(self) -> bool:
        """True when every circuit equals the ground truth (precision and recall 1); False without truth."""
        all_scores = [self.scores(m) for m in self.circuits]
        return bool(all_scores) and all(s is not None and s[f"{self.circuits[m].level}_precision"] == 1
                                        and s[f"{self.circuits[m].level}_recall"] == 1
                                        for m, s in zip(self.circuits, all_scores))

    def __str__(self) -> str:
        lines = [str(self.report)]
        for method, circuit in self.circuits.items():
            lines += ["", f"== {method} patching, corruption={circuit.settings.get('corruption')}, metric={self.metric.name}",
                      str(circuit), circuit.interpretation]
            scores = self.scores(method)
            if scores is not None:
                lines.append("against the planted ground truth: " + ", ".join(f"{k}={v:.3f}" for k, v in scores.items()))
        return "\n".join(lines)

    def write(self, out: Union[str, Path]) -> Path:
        """``sink_report.json`` and, per method, ``circuit_<method>.json``/``.dot`` (and ``.svg`` when
        Graphviz's ``dot`` is installed) under ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "sink_report.json", json.dumps(self.report.to_dict(), indent=2, default=str))
        for method, circuit in self.circuits.items():
            write_atomic(out / f"circuit_{method}.json", circuit.to_json(indent=2))
            write_atomic(out / f"circuit_{method}.dot", to_dot(circuit))
            if shutil.which("dot"):
                write_atomic(out / f"circuit_{method}.svg", to_svg(circuit))
        return out


def run_discovery(
    resolved: Resolved, tokens: Tensor, *, methods: Sequence[str], corruption: Union[str, Corruption],
    metric: PatchMetric, threshold: float = 0.1, bos: Optional[bool] = False, **options: Any,
) -> Discovery:
    """The sink report and one :func:`~p0circuit.discover` circuit per method on ``tokens``."""
    report = sink_report(resolved.model, tokens, bos=bos)
    found = Discovery(resolved, tokens, report, metric)
    for method in methods:
        found.circuits[method] = discover(resolved.model, tokens, method=method, corruption=corruption, metric=metric,
                                          threshold=threshold, bos=bos, **options)
    return found
