"""Temporarily enabled TransformerLens hook options, always restored.

Path and attribution patching write into per-head query/key/value inputs and MLP inputs, which
exist only with ``use_split_qkv_input`` and ``use_hook_mlp_in``. These flags live on the model's
config, so they are switched on inside a ``with`` block and restored on exit, exceptions included.
"""

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def receiver_hooks(model: Any) -> Iterator[Any]:
    """Enable per-head q/k/v input hooks and the MLP input hook for the duration of the block."""
    old_split, old_mlp_in = model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in
    try:
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
        yield model
    finally:
        model.set_use_split_qkv_input(old_split)
        model.set_use_hook_mlp_in(old_mlp_in)
