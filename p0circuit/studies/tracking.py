"""Tracking where the P0 circuit sits across training checkpoints (docs/science.md, claim 4).

For each checkpoint the tracker measures the sink report and locates the circuit: by activation
patching where affordable (:func:`p0circuit.studies.discovery.locate.locate`: the layers whose heads and MLPs
causally produce the sink's norm, at P0 or at the sink position), from the norm profile otherwise
(the first layer whose norm ratio passes ``norm_threshold``, where the amplification has happened).
A stage label follows from documented rules (:func:`stage`):

* ``transition``: a sink (a head with alpha_k > eps, or an amplified norm) exists at a position
  k other than 0 (e.g. 1);
* ``converged``: the sink is at position 0, a layer passes the norm threshold, and the circuit sits
  within the first two layers: every located layer <= 1 (patching), or norm onset <= 1 (norm
  profile): the paper's final stage;
* ``early``: no sink yet, or a P0 sink whose circuit reaches into later layers (patching finds a
  component in layer >= 2, or the norm onset is >= 2): the circuit still sits in middle layers.

Checkpoint series come from a local directory (:func:`checkpoint_series`, sub-directories
``step_<N>`` written by :func:`p0circuit.studies.training.train` or holding Hugging Face checkpoints), from
Pythia's public checkpoints for users with a hub (:func:`pythia_series`), or from any list of
``(step, model)`` pairs.
"""

import re
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import pandas as pd
from torch import Tensor

from p0circuit.core.defaults import LOCATE_THRESHOLD, NORM_THRESHOLD, SINK_EPS
from p0circuit.core.errors import BadInputError, CheckpointError, ConfigError
from p0circuit.core.args import entry_point
from p0circuit.studies.discovery.locate import MAX_NODES, Location, affordable, from_norm_profile
from p0circuit.studies.discovery.locate import locate as locate_circuit
from p0circuit.patching.setup import Setup
from p0circuit.figures.plotting import finish, new_figure
from p0circuit.measures import SinkReport, sink_report
from p0circuit.models.checkpoints import load_pretrained
from p0circuit.models.resolve import load_any_checkpoint

STAGES = ("early", "transition", "converged")


def stage(report: SinkReport, location: Optional[Location] = None) -> tuple[str, str]:
    """The stage label of one checkpoint and the rule that gave it (rules in the module docstring)."""
    has_sink = (report.norm_onset_layer is not None or report.head_onset_layer is not None
                or report.sink_position_max_alpha > report.eps or (location is not None and bool(location.layers)))
    if has_sink and report.sink_position != 0:
        return "transition", f"sink at position {report.sink_position}, not 0"
    if report.norm_onset_layer is None:
        return "early", "no layer reaches the norm threshold"
    if location is not None and location.by == "patching" and location.layers:
        where = f"circuit in layers {location.label()} (patching: {', '.join(location.nodes)})"
        if max(location.layers) <= 1:
            return "converged", f"P0 sink with its {where}: within the first two layers"
        return "early", f"P0 sink with its {where}: reaches middle layers"
    if report.norm_onset_layer <= 1:
        return "converged", f"P0 sink amplified by layer {report.norm_onset_layer} (within the first two layers)"
    return "early", f"P0 amplified only at layer {report.norm_onset_layer} (middle layers)"


LOCATE = ("auto", "patching", "norm")


@entry_point
def track(
    series: Iterable[tuple[int, Any]], tokens: Tensor, norm_threshold: float = NORM_THRESHOLD, eps: float = SINK_EPS,
    bos: Any = None, locate: str = "auto", max_nodes: int = MAX_NODES, threshold: float = LOCATE_THRESHOLD,
) -> pd.DataFrame:
    """One row per checkpoint (sorted by step): onsets, sink position, Sink_0, circuit layers, stage.

    ``locate``: ``auto`` (patching when :func:`~p0circuit.studies.discovery.locate.affordable` with ``max_nodes``,
    the norm profile otherwise), ``patching`` or ``norm``. ``threshold``: normalized effect a node
    needs to count as part of the circuit. ``bos``: the probe's BOS choice, checked against
    ``tokens`` for every checkpoint.
    """
    if locate not in LOCATE:
        raise ConfigError(f"locate must be one of {LOCATE}, got {locate!r}")
    rows = []
    for step, model in series:
        report = sink_report(model, tokens, eps=eps, norm_threshold=norm_threshold, bos=bos)
        patch = locate == "patching" or (locate == "auto" and affordable(model, max_nodes))
        if patch:
            where = locate_circuit(Setup.of(model, tokens, corruption="shift", bos=bos), report=report,
                                   threshold=threshold, norm_threshold=norm_threshold)
        else:
            where = from_norm_profile(report)
        label, rule = stage(report, where)
        rows.append({
            "step": int(step), "norm_onset": report.norm_onset_layer, "head_onset": report.head_onset_layer,
            "sink_position": report.sink_position, "sink_rate": report.sink_rate,
            "max_norm_ratio": max(report.norm_ratio_resid), "circuit_layers": where.label(),
            "circuit_first": min(where.layers) if where.layers else None,
            "circuit_last": max(where.layers) if where.layers else None,
            "located_by": where.by, "circuit_nodes": " ".join(where.nodes), "stage": label, "rule": rule,
        })
    if not rows:
        raise BadInputError("the checkpoint series is empty")
    frame = pd.DataFrame(rows).sort_values("step").set_index("step")
    if frame.index.duplicated().any():
        raise BadInputError(f"duplicate steps in the series: {sorted(set(frame.index[frame.index.duplicated()]))}")
    return frame


@entry_point
def checkpoint_series(directory: Union[str, Path]) -> list[tuple[int, Any]]:
    """``(step, model)`` for every ``step_<N>`` entry, by step: a p0circuit training checkpoint
    (``spec.json``), a Hugging Face checkpoint (``config.json``), a directory holding one ``.gguf``
    file, or a ``step_<N>.gguf`` file."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{str(root)!r} is not a directory of checkpoints")
    found = []
    for sub in root.iterdir():
        m = re.fullmatch(r"step_(\d+)(\.gguf)?", sub.name)
        if not m or sub.is_dir() == bool(m.group(2)):
            continue
        if sub.is_dir() and not (sub / "spec.json").is_file() and not (sub / "config.json").is_file():
            ggufs = sorted(sub.glob("*.gguf"))
            if len(ggufs) != 1:
                raise CheckpointError(f"{str(sub)!r} holds no spec.json or config.json and {len(ggufs)} .gguf files; "
                                      "a checkpoint directory needs one of those (one .gguf file)")
            sub = ggufs[0]
        found.append((int(m.group(1)), sub))
    if not found:
        raise CheckpointError(f"{str(root)!r} holds no step_<N> checkpoints (directories or step_<N>.gguf files)")
    return [(step, load_any_checkpoint(path)) for step, path in sorted(found)]


@entry_point
def pythia_series(name: str, indices: Iterable[int], **kwargs: Any) -> Iterable[tuple[int, Any]]:
    """Pythia's training checkpoints by ``checkpoint_index`` (needs a hub or the HF cache).

    Yields lazily, one model at a time, keyed by the training step TransformerLens reports.
    """
    for index in indices:
        model = load_pretrained(name, prepend_bos=False, checkpoint_index=index, **kwargs)
        yield int(model.cfg.checkpoint_value), model


def plot_tracking(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Any:
    """Onset layers, the located circuit's layers and the sink position against training step,
    stages marked."""
    fig, (ax1, ax2) = new_figure(2)
    steps = list(frame.index)
    ax1.plot(steps, frame["norm_onset"], marker="o", label="norm onset layer")
    ax1.plot(steps, frame["head_onset"], marker="s", label="head onset layer")
    located = frame[frame["circuit_first"].notna()] if "circuit_first" in frame else frame.iloc[:0]
    if len(located):
        ax1.vlines(list(located.index), located["circuit_first"].astype(float) - 0.2,
                   located["circuit_last"].astype(float) + 0.2, linewidth=8, alpha=0.35, color="tab:green",
                   label="circuit layers")
    ax1.set(xlabel="training step", ylabel="layer", title="where the circuit sits")
    ax1.legend(fontsize=8)
    ax2.plot(steps, frame["sink_position"], marker="o")
    for s, label in zip(steps, frame["stage"]):
        ax2.annotate(label, (s, frame.loc[s, "sink_position"]), fontsize=7, rotation=30)
    ax2.set(xlabel="training step", ylabel="sink position", title="sink position and stage")
    if min(steps) > 0 and max(steps) / min(steps) > 20:
        ax1.set_xscale("log")
        ax2.set_xscale("log")
    return finish(fig, path)
