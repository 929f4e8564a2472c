"""Loading a checkpoint written by :func:`p0circuit.studies.training.train` (a ``step_<N>/``
directory: ``model.safetensors`` and ``spec.json``) as a ``HookedTransformer``. Loading is a model's
concern, so it lives here, below the trainer that writes these directories."""

from pathlib import Path
from typing import Any, Union

from p0circuit.core.args import entry_point
from p0circuit.core.errors import CheckpointError
from p0circuit.models.spec import ModelSpec
from p0circuit.models.tokens import BOS_ATTR
from p0circuit.models.verify import load_strict, read_json, read_safetensors


@entry_point
def load_trained(path: Union[str, Path], device: str = "cpu") -> Any:
    """A ``HookedTransformer`` from a ``step_<N>/`` checkpoint directory written by :func:`train`."""
    path = Path(path)
    if not (path / "spec.json").is_file() or not (path / "model.safetensors").is_file():
        raise CheckpointError(f"{str(path)!r} is not a p0circuit training checkpoint (needs spec.json and model.safetensors)")
    meta = read_json(path / "spec.json", "the checkpoint's spec")
    if not isinstance(meta, dict) or not isinstance(meta.get("spec"), dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{str(path / 'spec.json')!r} lacks a 'spec' table or an integer 'step'; it was not written "
                              "by p0circuit train: re-save the checkpoint")
    model = ModelSpec.from_dict(meta["spec"]).build(device)
    load_strict(model, read_safetensors(path / "model.safetensors", device), path)
    model.train_step = meta["step"]  # type: ignore[attr-defined]
    if meta.get("bos") is not None:
        setattr(model, BOS_ATTR, int(meta["bos"]))
    return model
