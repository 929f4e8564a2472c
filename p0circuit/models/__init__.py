"""Building and loading hooked models: specs, local checkpoints, planted weights."""

from p0circuit.models.checkpoints import load_checkpoint, load_pretrained
from p0circuit.models.spec import ModelSpec, positional_kind

__all__ = ["ModelSpec", "load_checkpoint", "load_pretrained", "positional_kind"]
