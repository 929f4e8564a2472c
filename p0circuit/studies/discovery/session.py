"""A whole discovery on one model, as the command line and each sweep cell run it: the sink report,
one circuit per method, and the scores against the ground truth when the model is planted.

:func:`run_discovery` computes; ``str()`` is the text the command line prints; the files and figures
are written by :func:`p0circuit.surfaces.discovery_files.write_discovery` (computing apart from drawing). Each circuit's level (nodes or edges) is read from the circuit.
"""

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from torch import Tensor

from p0circuit.core.defaults import CIRCUIT_THRESHOLD, EDGE_BUDGET, NODE_BUDGET
from p0circuit.studies.discovery.discover import discover
from p0circuit.core.errors import BadInputError
from p0circuit.core.circuits import compare
from p0circuit.measures import SinkReport, sink_report
from p0circuit.models.resolve import Resolved
from p0circuit.patching import Corruption, NormRatio, PatchMetric, get_method
from p0circuit.patching.budget import edges_within, live_nodes
from p0circuit.patching.metrics import metric_from_entry
from p0circuit.core.types import Circuit, Node
from p0circuit.models.checks import checked


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
    metric_reason: str = "given"
    """Why this metric (when it was chosen by :func:`choose_metric`)."""
    circuits: dict[str, Circuit] = field(default_factory=dict)
    """Method name -> circuit."""

    def scores(self, method: str) -> Optional[dict[str, float]]:
        """Precision, recall and AUROC of ``method``'s circuit against the truth at the circuit's level."""
        truth = self.resolved.truth
        if truth is None:
            return None
        circuit = self.circuits[method]
        return compare(circuit, truth)

    @property
    def exact(self) -> bool:
        """True when every circuit equals the ground truth (precision and recall 1); False without truth."""
        return bool(self.circuits) and self.resolved.truth is not None and not self.inexact()

    def inexact(self) -> list[str]:
        """Each method whose circuit is not the ground truth, with its precision and recall (empty without truth)."""
        out = []
        for method, circuit in self.circuits.items():
            scores = self.scores(method)
            if scores is None:
                continue
            level = circuit.level
            p, r = scores[f"{level}_precision"], scores[f"{level}_recall"]
            if p != 1 or r != 1:
                out.append(f"{method} patching's circuit ({level} precision {p:.3f}, recall {r:.3f})")
        return out

    def __str__(self) -> str:
        lines = [str(self.report)]
        for method, circuit in self.circuits.items():
            lines += ["", f"== {method} patching, corruption={circuit.settings.get('corruption')}, metric={self.metric.name}"
                          f" ({self.metric_reason})" + (f"; {circuit.settings['candidates']}" if "candidates" in circuit.settings else ""),
                      str(circuit), circuit.interpretation]
            scores = self.scores(method)
            if scores is not None:
                lines.append("against the planted ground truth: " + ", ".join(f"{k}={v:.3f}" for k, v in scores.items()))
        return "\n".join(lines)


def choose_metric(resolved: Resolved, report: SinkReport) -> tuple[PatchMetric, str]:
    """The metric a discovery uses when none is given, and why: a planted model's sink heads; else
    the P0 norm ratio where it first passes the norm threshold (the end of the amplification), so
    no forward runs past that block; else the patching default
    (:func:`p0circuit.patching.metrics.default_metric`: attention to P0 of the layers >= 2)."""
    if resolved.sink_heads:
        return metric_from_entry("sink_heads", resolved.model, resolved.sink_heads), "the planted sink heads"
    if report.norm_onset_layer is not None:
        return (NormRatio(report.norm_onset_layer),
                f"P0 norm ratio at the norm onset layer {report.norm_onset_layer}")
    return metric_from_entry("attn_to_p0", resolved.model), "no norm onset: attention to P0 of layers >= 2"


def run_discovery(
    resolved: Resolved, tokens: Tensor, *, methods: Sequence[str], corruption: Union[str, Corruption],
    metric: Optional[PatchMetric] = None, threshold: float = CIRCUIT_THRESHOLD, bos: Optional[bool] = False,
    nodes: Optional[Sequence[Node]] = None, edge_budget: int = EDGE_BUDGET, node_budget: int = NODE_BUDGET,
    progress: bool = False, **options: Any,
) -> Discovery:
    """The sink report and one :func:`~p0circuit.discover` circuit per method on ``tokens``.

    ``metric`` defaults to :func:`choose_metric`. ``nodes`` restricts the candidate nodes (and the
    senders and receivers of edges). More than ``node_budget`` candidates that can reach the metric
    is an error that says how to narrow them (exact patching costs about one suffix forward each).
    An edge-level method whose candidates would exceed ``edge_budget`` runs on the edges whose senders
    an activation pass keeps (run first if not among ``methods``); the circuit's settings say so.
    """
    with checked(resolved.model):  # checked here once; the sink report and every method below rely on it
        model = resolved.model
        report = sink_report(model, tokens, bos=bos)
        reason = "given"
        if metric is None:
            metric, reason = choose_metric(resolved, report)
        node_list = list(nodes) if nodes is not None else None
        live_nodes(model, metric, node_list, node_budget)  # refused past the budget, before any forward
        found = Discovery(resolved, tokens, report, metric, metric_reason=reason)
        patch = {"corruption": corruption, "metric": metric, "threshold": threshold, "bos": bos, "progress": progress,
                 **options}
        for method in methods:
            found.circuits[method] = _circuit(found, method, node_list, edge_budget, patch)
        return found


def _circuit(found: Discovery, method: str, nodes: Optional[list[Node]], edge_budget: int,
             patch: dict[str, Any]) -> Circuit:
    """``method``'s circuit of a discovery in progress (``found``: its model, prompts, metric and the circuits so far),
    by :func:`~p0circuit.discover` with the shared keywords ``patch`` (corruption, metric, threshold, BOS choice,
    progress, the caller's options). An edge-level method runs on the edges within ``edge_budget`` (those whose
    senders an activation pass keeps, when all would be too many: :func:`edges_within`)."""
    model, tokens = found.resolved.model, found.tokens
    if get_method(method).level == "node":
        return discover(model, tokens, method=method, nodes=nodes, **patch)

    def node_pass() -> Circuit:  # (reported only when "activation" is among the methods)
        return found.circuits.get("activation") or discover(model, tokens, method="activation", nodes=nodes, **patch)

    edges, note = edges_within(model, found.metric, nodes, edge_budget, node_pass)
    if not edges:
        raise BadInputError(f"{method}: no candidate edges ({note}); lower the threshold or widen the nodes")
    return discover(model, tokens, method=method, edges=edges, record={"candidates": note}, **patch)
