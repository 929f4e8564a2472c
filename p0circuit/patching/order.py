"""Where each hook of a model fires in its forward, and how its activation is laid out, read off
the model itself: two tiny traced forwards, not a table of hook names.

The engine skips a patch that cannot change what the metric reads: a write can change a read only
if it happens first. Which hook comes first is a fact of the model's own forward (a mixture of
experts routes before its experts run, Gemma's ``ln1_post`` sits between the heads and
``hook_attn_out``), so it is taken from a forward: every hook point is given a forward hook that
records when it fires. The optional hooks (per-head q/k/v inputs, the MLP input, per-head results)
are switched on for the trace and restored after it. A hook that did not fire (an expert no token
was routed to, an input hook whose flag cannot be set) takes the span of the hooks that fired under
its nearest enclosing module, so it is ordered conservatively: never later than it could write,
never earlier than it could be read.

The same trace says which hooks are laid out ``[batch, pos, ...]`` (attention patterns and scores
``[batch, head, query, key]``): those the fast path may cut to a suffix of positions or stack along
the batch axis. Expert hooks see only the tokens routed to them, flattened (``[tokens, ...]``), so
a metric that reads them gets whole-prompt forwards, one group at a time.
"""

from dataclasses import dataclass
from functools import partial
from typing import Any
from weakref import WeakKeyDictionary

import torch

from p0circuit.core import hooks

_ORDERS: "WeakKeyDictionary[Any, HookOrder]" = WeakKeyDictionary()


@dataclass(frozen=True)
class HookOrder:
    """The firing order and layout of one model's hooks."""

    first: dict[str, int]
    """Hook name -> the index of its first firing in the traced forward."""
    last: dict[str, int]
    """Hook name -> the index of its last firing."""
    positional: frozenset[str]
    """Hooks whose activation is ``[batch, pos, ...]`` (``[batch, head, query, key]`` for patterns
    and scores) in both traces."""
    size: int
    """How many firings the trace recorded."""
    new_only: dict[str, bool]
    """For each laid-out hook, what it holds in a forward of later positions that attends to earlier
    ones through a key-value cache (the fast path's suffix forwards): True, only the new positions
    (most hooks; the query axis of patterns); False, every position so far (rotary keys, which
    TransformerLens rotates after appending them to the cache). A hook missing here is never read
    from a suffix forward."""

    def span(self, name: str) -> tuple[int, int]:
        """(earliest, latest) firing index of ``name``; for a hook that did not fire, the span of the
        hooks that fired under its nearest enclosing module (the whole forward when none did)."""
        if name in self.first:
            return self.first[name], self.last[name]
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:cut]) + "."
            inside = [n for n in self.first if n.startswith(prefix)]
            if inside:
                return min(self.first[n] for n in inside), max(self.last[n] for n in inside)
        return 0, self.size

    def can_change(self, write: str, read: str) -> bool:
        """Whether a change written at hook ``write`` can change hook ``read`` (it fires no later)."""
        return self.span(write)[0] <= self.span(read)[1]


def hook_order(model: Any) -> HookOrder:
    """The :class:`HookOrder` of ``model``, traced once and kept for the model's lifetime."""
    order = _ORDERS.get(model)
    if order is None:
        order = _trace(model)
        _ORDERS[model] = order
    return order


def _record(log: list, name: str, module: Any, inputs: Any, output: Any) -> None:
    log.append((name, tuple(output.shape) if isinstance(output, torch.Tensor) else None))


@torch.no_grad()
def _trace(model: Any) -> HookOrder:
    cfg = model.cfg
    shapes = [(2, min(3, cfg.n_ctx)), (3, min(5, cfg.n_ctx))]
    full = {"use_split_qkv_input": not cfg.use_attn_in, "use_hook_mlp_in": not cfg.attn_only, "use_attn_result": True}
    err: Exception = RuntimeError("no trace")
    for flags in (full, {**full, "use_split_qkv_input": False}, {}):  # a combination TransformerLens cannot run: fewer
        try:
            logs = _forwards(model, shapes, [k for k, on in flags.items() if on])
            break
        except Exception as failed:  # noqa: BLE001 (the next, smaller set of flags is tried)
            err = failed
    else:
        raise err
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, (name, _) in enumerate(logs[0]):
        first.setdefault(name, i)
        last[name] = i
    laid_out = []
    for (batch, length), log in zip(shapes, logs):
        ok = set()
        bad = set()
        for name, shape in log:
            axis = hooks.position_axis(name)
            fits = (shape is not None and len(shape) > axis and shape[0] == batch and shape[axis] == length
                    and (axis != 2 or (len(shape) > 3 and shape[3] == length)))
            (ok if fits else bad).add(name)
        laid_out.append(ok - bad)
    positional = frozenset(laid_out[0] & laid_out[1])
    return HookOrder(first, last, positional, len(logs[0]), _suffix_layout(model, positional))


def _suffix_layout(model: Any, positional: frozenset) -> dict[str, bool]:
    """:attr:`HookOrder.new_only` from one forward of 2 positions after a cached prefix of 3."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    cfg = model.cfg
    if cfg.n_ctx < 5:
        return {}
    ids = torch.arange(10, device=model.W_E.device).reshape(2, 5) % cfg.d_vocab
    log: list = []
    try:
        cache = TransformerLensKeyValueCache.init_cache(cfg, cfg.device, 2)
        model(ids[:, :3], past_kv_cache=cache, attention_mask=torch.ones_like(ids[:, :3]))
        handles = [point.register_forward_hook(partial(_record, log, name)) for name, point in model.hook_dict.items()]
        try:
            model(ids[:, 3:], past_kv_cache=cache, attention_mask=torch.ones_like(ids[:, 3:]))
        finally:
            for handle in handles:
                handle.remove()
    except Exception:  # noqa: BLE001 (a model that cannot run cached forwards gets none)
        return {}
    out: dict[str, bool] = {}
    for name, shape in log:
        if name in positional and shape is not None:
            held = shape[hooks.position_axis(name)]
            if held in (2, 5) and out.get(name, held == 2) == (held == 2):
                out[name] = held == 2
            else:
                out[name] = None  # type: ignore[assignment]
    return {k: v for k, v in out.items() if v is not None}


def _forwards(model: Any, shapes: list, flags: list) -> list[list]:
    """One forward per (batch, length) in ``shapes`` with the config ``flags`` on (restored after),
    each hook's firings logged as (name, shape)."""
    cfg = model.cfg
    saved = {k: getattr(cfg, k) for k in flags}
    logs: list[list] = []
    try:
        for key in flags:
            setattr(cfg, key, True)
        for batch, length in shapes:
            log: list = []
            handles = [point.register_forward_hook(partial(_record, log, name)) for name, point in model.hook_dict.items()]
            try:
                ids = torch.arange(batch * length, device=model.W_E.device).reshape(batch, length) % cfg.d_vocab
                model(ids)
            finally:
                for handle in handles:
                    handle.remove()
            logs.append(log)
    finally:
        for key, value in saved.items():
            setattr(cfg, key, value)
    return logs
