"""Temporarily enabled TransformerLens hook options, always restored.

Path and attribution patching write into per-head query/key/value inputs and MLP inputs, which
exist only with ``use_split_qkv_input`` and ``use_hook_mlp_in``. These flags live on the model's
config, so they are switched on inside a ``with`` block and restored on exit, exceptions included.
"""

from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Sequence

from p0circuit.core.errors import ConfigError
from p0circuit.core.hooks import OBSERVES
from p0circuit.patching.shape import BlockShape


@contextmanager
def receiver_hooks(model: Any, split_qkv: bool = True) -> Iterator[Any]:
    """Enable per-head q/k/v input hooks (unless ``split_qkv`` is False) and the MLP input hook
    (blocks with an MLP only) for the duration of the block."""
    cfg = model.cfg
    shape = BlockShape.of(model)
    grouped = shape.kv_heads != shape.n_heads
    if split_qkv and grouped and cfg.positional_embedding_type == "shortformer":
        raise ConfigError(
            "TransformerLens cannot split the query/key/value inputs of a grouped-query model with shortformer "
            "positions (it adds the position embedding to the keys once per query head, not per key/value head), "
            "and edges into queries, keys and values are patched there: use node-level methods (activation, "
            "attribution) on this model, or model.set_ungroup_grouped_query_attention(True)")
    old_split, old_mlp_in = model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in
    has_mlp = shape.has_mlp  # TransformerLens refuses the MLP-input flag without MLPs
    try:
        model.set_use_split_qkv_input(split_qkv or old_split)
        if has_mlp:
            model.set_use_hook_mlp_in(True)
        yield model
    finally:
        model.set_use_split_qkv_input(old_split)
        if has_mlp:
            model.set_use_hook_mlp_in(old_mlp_in)


@contextmanager
def attached(model: Any, fwd_hooks: Sequence[tuple[str, Callable]]) -> Iterator[None]:
    """Attach ``(hook name, fn(act, hook))`` pairs for the duration of the block, then remove them.

    Only the handles added here are removed (TransformerLens' ``model.hooks()`` resets every hook
    point on exit, which costs more than a small patched forward). Hooks run in the given order.
    """
    handles = []
    try:
        for name, fn in fwd_hooks:
            point = model.hook_dict[name]
            handles.append(point.register_forward_hook(partial(_call, fn, point)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _call(fn: Callable, point: Any, module: Any, inputs: Any, output: Any) -> Any:
    """PyTorch's forward hook for ``fn(act, hook)`` (bound with ``partial``: no function is made per
    hook, which the test-time type checker would wrap each time)."""
    result = fn(output, hook=point)
    return output if result is None else result


def user_hooks(model: Any) -> list[str]:
    """Modules of ``model`` (hook points or any other) that carry forward, pre-forward or backward
    hooks: ones the user left there, since p0circuit removes its own on exit (its observers,
    :data:`OBSERVES`, excepted)."""
    def mine(hooks: Any) -> bool:
        return any(not getattr(h, OBSERVES, False) for h in (hooks or {}).values())

    return [name or "(the model)" for name, module in model.named_modules()
            if mine(module._forward_hooks) or mine(module._forward_pre_hooks) or mine(module._backward_hooks)
            or mine(getattr(module, "_backward_pre_hooks", None))]
