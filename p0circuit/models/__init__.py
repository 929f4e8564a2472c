"""Building and loading hooked models: specs, local checkpoints, planted weights.

Layer 2: model specs and families, checkpoint and GGUF loading, the planted models, tokens and
the BOS checks.

May import: p0circuit.core.
"""

from p0circuit.models.checkpoints import load_checkpoint, load_pretrained
from p0circuit.models.spec import ModelSpec, positional_kind

__all__ = ["ModelSpec", "load_checkpoint", "load_pretrained", "positional_kind"]
