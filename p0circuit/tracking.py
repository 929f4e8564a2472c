"""Tracking where the P0 circuit sits across training checkpoints (science.md, claim 4).

For each checkpoint the tracker measures the sink report and reads off the circuit's location
from the norm profile: the first layer whose P0 norm ratio passes ``norm_threshold`` (where the
amplification has happened), the first layer with a sinking head, and the sink position. A stage
label follows from documented rules (:func:`stage`):

* ``converged``: the sink is at position 0 and the amplification is done within the first two
  layers (norm onset <= 1): the paper's final stage;
* ``transition``: a sink (a head with alpha_k > eps) exists at another position k (e.g. 1);
* ``early``: no sink yet, or a P0 sink whose amplification happens only in later layers
  (norm onset >= 2): the circuit still sits in middle layers.

Checkpoint series come from a local directory (:func:`checkpoint_series`, sub-directories
``step_<N>`` written by :func:`p0circuit.training.train` or holding Hugging Face checkpoints), from Pythia's public checkpoints for users with a
hub (:func:`pythia_series`), or from any list of ``(step, model)`` pairs.
"""

import re
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import pandas as pd
from torch import Tensor

from p0circuit.errors import BadInputError, CheckpointError
from p0circuit.experiments.plotting import finish, new_figure
from p0circuit.metrics import SinkReport, sink_report

STAGES = ("early", "transition", "converged")


def stage(report: SinkReport) -> tuple[str, str]:
    """The stage label of one checkpoint and the rule that gave it."""
    has_sink = (report.norm_onset_layer is not None or report.head_onset_layer is not None
                or report.sink_position_max_alpha > report.eps)
    if has_sink and report.sink_position != 0:
        return "transition", f"sink at position {report.sink_position}, not 0"
    if report.sink_position == 0 and report.norm_onset_layer is not None and report.norm_onset_layer <= 1:
        return "converged", f"P0 sink amplified by layer {report.norm_onset_layer} (within the first two layers)"
    if report.norm_onset_layer is None:
        return "early", "no layer reaches the norm threshold"
    return "early", f"P0 amplified only at layer {report.norm_onset_layer} (middle layers)"


def track(
    series: Iterable[tuple[int, Any]], tokens: Tensor, norm_threshold: float = 5.0, eps: float = 0.3,
    bos: Any = None,
) -> pd.DataFrame:
    """One row per checkpoint (sorted by step): onsets, sink position, Sink_0, stage.

    ``bos``: the probe's BOS choice, checked against ``tokens`` for every checkpoint."""
    rows = []
    for step, model in series:
        report = sink_report(model, tokens, eps=eps, norm_threshold=norm_threshold, bos=bos)
        label, rule = stage(report)
        rows.append({
            "step": int(step), "norm_onset": report.norm_onset_layer, "head_onset": report.head_onset_layer,
            "sink_position": report.sink_position, "sink_rate": report.sink_rate,
            "max_norm_ratio": max(report.norm_ratio_resid), "stage": label, "rule": rule,
        })
    if not rows:
        raise BadInputError("the checkpoint series is empty")
    frame = pd.DataFrame(rows).sort_values("step").set_index("step")
    if frame.index.duplicated().any():
        raise BadInputError(f"duplicate steps in the series: {sorted(set(frame.index[frame.index.duplicated()]))}")
    return frame


def checkpoint_series(directory: Union[str, Path]) -> list[tuple[int, Any]]:
    """``(step, model)`` for every ``step_<N>`` sub-directory, by step: a p0circuit training
    checkpoint (``spec.json``) or a Hugging Face checkpoint (``config.json``)."""
    from p0circuit.models import load_checkpoint
    from p0circuit.training import load_trained

    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{str(root)!r} is not a directory of checkpoints")
    found = []
    for sub in root.iterdir():
        m = re.fullmatch(r"step_(\d+)", sub.name)
        if m and sub.is_dir():
            found.append((int(m.group(1)), sub))
    if not found:
        raise CheckpointError(f"{str(root)!r} holds no step_<N> checkpoint directories")
    return [(step, load_trained(path) if (path / "spec.json").exists() else load_checkpoint(path))
            for step, path in sorted(found)]


def pythia_series(name: str, indices: Iterable[int], **kwargs: Any) -> Iterable[tuple[int, Any]]:
    """Pythia's training checkpoints by ``checkpoint_index`` (needs a hub or the HF cache).

    Yields lazily, one model at a time, keyed by the training step TransformerLens reports.
    """
    from p0circuit.models import load_pretrained

    for index in indices:
        model = load_pretrained(name, prepend_bos=False, checkpoint_index=index, **kwargs)
        yield int(model.cfg.checkpoint_value), model


def plot_tracking(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Any:
    """Onset layers and sink position against training step, stages marked."""
    fig, (ax1, ax2) = new_figure(2)
    steps = list(frame.index)
    ax1.plot(steps, frame["norm_onset"], marker="o", label="norm onset layer")
    ax1.plot(steps, frame["head_onset"], marker="s", label="head onset layer")
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
