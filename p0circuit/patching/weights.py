"""What a setup's runs read of the model's weights, as a digest: the check that a search runs on the model its
result was measured on.

A result's numbers hold for the weights its runs read: the blocks up to the last one the metric reads (every
block and the unembedding for a metric on the logits), the embedding rows of the token ids the clean and the
corrupted runs hold, and the position embedding. :func:`digest` gives a CRC-32 of each of those tensors (of
their bytes: a change of any element, in place or by ``.data``, changes it), computed when the setup is checked;
a search of the result computes it again before any work and refuses a model whose digest moved, naming the
tensors (:func:`changed`). A change the runs cannot see (an embedding row no prompt uses, a block after the
metric's) leaves the result valid, and is not refused.
"""

import re
import zlib
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.patching.engine import stop_layer
from p0circuit.patching.metrics import PatchMetric

_BLOCK = re.compile(r"blocks\.(\d+)\.")
EMBEDDING = "embed.W_E"
"""The token embedding: only the rows of the ids the runs hold are read."""


def _crc(tensor: Tensor) -> int:
    data = tensor.detach().reshape(-1).contiguous().cpu()
    return zlib.crc32(memoryview(data.view(torch.uint8).numpy()))


def digest(model: Any, metric: PatchMetric, runs: Sequence[Optional[Tensor]]) -> dict[str, int]:
    """Tensor name -> CRC-32 of what the runs of ``runs`` (token tensors; None: an ablation's, which has none) read of
    ``model``'s parameters and buffers under ``metric`` (the module docstring says which)."""
    stop = stop_layer(model, metric)  # None: the metric reads the logits, or a hook after the blocks
    ids = torch.unique(torch.cat([t.reshape(-1) for t in runs if t is not None]))
    out: dict[str, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        block = _BLOCK.match(name)
        if block is not None and stop is not None and int(block.group(1)) >= stop:
            continue  # a block after the metric's: no run reads it
        if block is None and stop is not None and name.startswith(("unembed.", "ln_final.")):
            continue
        out[name] = _crc(tensor[ids.to(tensor.device)] if name == EMBEDDING else tensor)
    return out


def embedding_rows(model: Any, runs: Sequence[Optional[Tensor]]) -> int:
    """The :func:`digest` entry of the token embedding for the token tensors ``runs``: the CRC-32 of the rows they
    read (cheap next to the blocks': a setup under another corruption checks its predecessor's rows with it)."""
    ids = torch.unique(torch.cat([t.reshape(-1) for t in runs if t is not None]))
    tensor = dict(model.named_parameters())[EMBEDDING]
    return _crc(tensor[ids.to(tensor.device)])


def changed(before: dict[str, int], now: dict[str, int]) -> list[str]:
    """The tensors whose digest differs (or that one side lacks), in the model's order."""
    return [k for k in now if before.get(k) != now[k]] + [k for k in before if k not in now]
