"""Where each hook of a model fires in its forward, and how its activation is laid out, read off
the model itself: tiny traced forwards, not a table of hook names.

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

**What the trace costs.** A forward of a few tokens still reads every weight once, so a trace of the
whole model costs about a forward of a real batch (0.5-0.8 s on SmolLM2, paid on each model's first
patching call). A ``HookedTransformer`` forward is the embedding (``input_to_embed``), the blocks in
turn, ``ln_final`` and the unembedding (TransformerLens' ``forward``, read by this module: a model whose
class overrides it is traced whole). Blocks of one *structure* (the same module classes, hook points,
parameter shapes and non-float settings such as ``attn_type``: :func:`structure`) run the same code, so
their hooks fire in the same order with the same layout: one block of each structure is traced and its
firings are repeated, renamed, for the others, and the unembedding runs with one output column (a view of
its weights: its own forward and hook points, no vocabulary-sized product). On SmolLM2 that is four calls
of one block of 30 (:data:`SHAPES` and a cached suffix), about 0.1 of a forward's weights
(``tests/test_order.py`` counts it with :class:`~p0circuit.patching.work.Count`, and holds this trace equal
to the whole-model one on every family). A model that carries hooks of its own, or has hook points outside
the embedding, the blocks, ``ln_final`` and the unembedding, is traced whole.
"""

import copy
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Optional
from weakref import WeakKeyDictionary

import torch
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from p0circuit.core import hooks
from p0circuit.patching.hooking import user_hooks
from p0circuit.patching.shape import BlockShape

_ORDERS: "WeakKeyDictionary[Any, HookOrder]" = WeakKeyDictionary()

SHAPES = ((2, 3), (3, 5))
"""(batch, positions) of the two traced forwards: a hook is laid out ``[batch, pos, ...]`` only if it is so in
both (sizes no hook's other axes are likely to share in both)."""
PREFIX, SUFFIX = 3, 2
"""Positions of the cached prefix and of the suffix forward that reads it (:attr:`HookOrder.new_only`)."""


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
    traced: str = "whole"
    """How the forwards were traced: ``"whole"`` (every block and the full unembedding) or ``"parts"``
    (one block per structure, a one-column unembedding)."""

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

    def facts(self) -> tuple:
        """What the engine reads, without how it was traced: two orders with equal facts decide alike."""
        return self.first, self.last, self.positional, self.size, self.new_only


def hook_order(model: Any) -> HookOrder:
    """The :class:`HookOrder` of ``model``, traced once and kept for the model's lifetime."""
    order = _ORDERS.get(model)
    if order is None:
        order = trace(model)
        _ORDERS[model] = order
    return order


def trace(model: Any, whole: bool = False) -> HookOrder:
    """Trace ``model``'s hook order now: by parts where :func:`structures` allows (see the module docstring),
    else (or with ``whole``) with forwards of the whole model."""
    reps = None if whole else structures(model)
    if reps is not None:
        try:
            return _trace(model, partial(_parts_forward, model, reps), "parts")
        except Exception:  # noqa: BLE001 (_NotParts, or a part that cannot run alone: the whole model decides)
            pass
    return _trace(model, partial(_whole_forward, model), "whole")


class _NotParts(Exception):
    """A forward traced by parts fired a hook outside the part that ran: trace the whole model instead."""


def structure(block: Any) -> tuple:
    """What decides which hooks a block fires, in what order and with what shapes: each submodule's name,
    class, parameter and buffer shapes and dtypes, and its settings other than floats (``attn_type``,
    ``d_mlp``, flags); its own name and index (``name``, ``layer_id``) and float settings (an attention scale)
    left out, since they change values only."""
    out = []
    for name, module in block.named_modules():
        settings = sorted((k, v) for k, v in vars(module).items()
                          if not k.startswith("_") and k not in ("name", "layer_id")
                          and isinstance(v, (bool, int, str, type(None))))
        tensors = [(n, tuple(t.shape), t.dtype) for n, t in
                   [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)] if t is not None]
        out.append((name, type(module).__module__, type(module).__qualname__, tuple(settings), tuple(tensors)))
    return tuple(out)


def structures(model: Any) -> Optional[dict[int, int]]:
    """Each block's representative: the first block of its :func:`structure`; None when the model cannot be
    traced by parts (its class overrides ``HookedTransformer.forward``, it carries hooks of its own, or it
    has hook points outside the embedding, the blocks, ``ln_final`` and the unembedding)."""
    if not isinstance(model, HookedTransformer) or type(model).forward is not HookedTransformer.forward:
        return None
    if user_hooks(model):
        return None
    outside = [n for n in model.hook_dict if not n.startswith(("hook_", "embed.", "pos_embed.", "blocks.", "ln_final.",
                                                                "unembed."))]
    if outside:
        return None
    seen: dict[tuple, int] = {}
    return {layer: seen.setdefault(structure(block), layer) for layer, block in enumerate(model.blocks)}


class _Recorder:
    """Forward hooks on every hook point, registered once for a whole trace, that append (name, shape) to
    ``log`` (a new list for each part of the forward that is traced)."""

    def __init__(self) -> None:
        self.log: list = []

    def take(self) -> list:
        """The firings since the last take."""
        log, self.log = self.log, []
        return log


def _record(rec: _Recorder, name: str, module: Any, inputs: Any, output: Any) -> None:
    rec.log.append((name, tuple(output.shape) if isinstance(output, torch.Tensor) else None))


@contextmanager
def _recording(model: Any) -> Iterator[_Recorder]:
    """A :class:`_Recorder` on every hook point for the block."""
    rec = _Recorder()
    handles = [point.register_forward_hook(partial(_record, rec, name)) for name, point in model.hook_dict.items()]
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()


def _ids(model: Any, batch: int, length: int) -> torch.Tensor:
    return torch.arange(batch * length, device=model.W_E.device).reshape(batch, length) % model.cfg.d_vocab


def _whole_forward(model: Any, rec: _Recorder, ids: torch.Tensor, cache: Optional[Any] = None) -> list:
    """The firing log of one forward of the whole model (with ``cache``: attending to what it holds)."""
    kv = {} if cache is None else {"past_kv_cache": cache, "attention_mask": torch.ones_like(ids)}
    rec.take()
    model(ids, **kv)
    return rec.take()


def _parts_forward(model: Any, reps: dict[int, int], rec: _Recorder, ids: torch.Tensor,
                   cache: Optional[Any] = None) -> list:
    """The firing log of one forward of ``ids``, run as ``HookedTransformer.forward`` runs it but with only
    each structure's representative block: the embedding, then for every block its representative's firings
    renamed, then ``ln_final`` and the unembedding (one output column). With ``cache``, as a forward that
    attends to the prefix the cache holds (the representatives' entries; a prefix run fills them)."""
    kv = {} if cache is None else {"past_kv_cache": cache, "attention_mask": torch.ones_like(ids)}
    rec.take()
    resid, _, shortformer, mask = model.input_to_embed(ids, **kv)
    log = rec.take()
    if any(name.startswith(("blocks.", "ln_final.", "unembed.")) for name, _ in log):
        raise _NotParts()
    out = list(log)
    ran: dict[int, list] = {}
    for rep in sorted(set(reps.values())):
        model.blocks[rep](resid, past_kv_cache_entry=cache[rep] if cache is not None else None,
                          shortformer_pos_embed=shortformer, attention_mask=mask)
        log = rec.take()
        if any(not name.startswith(f"blocks.{rep}.") for name, _ in log):
            raise _NotParts()
        ran[rep] = log
    for layer, rep in reps.items():
        cut = len(f"blocks.{rep}.")
        out += [(f"blocks.{layer}.{name[cut:]}", shape) for name, shape in ran[rep]]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    _one_column(model.unembed)(resid)
    log = rec.take()
    if any(not name.startswith(("ln_final.", "unembed.")) for name, _ in log):
        raise _NotParts()
    return out + log


def _one_column(unembed: Any) -> Any:
    """A shallow copy of the unembedding whose vocabulary-sized parameters are their first column (views, no
    copy) and which carries none of the original's module hooks: its own forward and hook points, run for a
    few floats instead of a read of the whole unembedding matrix."""
    clone = copy.copy(unembed)
    vocab = unembed.cfg.d_vocab_out
    clone.__dict__["_parameters"] = {k: (v[..., :1] if v is not None and v.shape[-1] == vocab else v)
                                     for k, v in unembed._parameters.items()}
    for name in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                 "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
        if name in clone.__dict__:
            clone.__dict__[name] = OrderedDict()
    return clone


@torch.no_grad()
def _trace(model: Any, forward: Any, how: str) -> HookOrder:
    cfg = model.cfg
    shapes = [(batch, min(length, cfg.n_ctx)) for batch, length in SHAPES]
    full = {"use_split_qkv_input": not cfg.use_attn_in, "use_hook_mlp_in": BlockShape.of(model).has_mlp, "use_attn_result": True}
    err: Exception = RuntimeError("no trace")
    for flags in (full, {**full, "use_split_qkv_input": False}, {}):  # a combination TransformerLens cannot run: fewer
        try:
            with _flags(model, [k for k, on in flags.items() if on]), _recording(model) as rec:
                logs = [forward(rec, _ids(model, batch, length)) for batch, length in shapes]
            break
        except _NotParts:
            raise
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
    return HookOrder(first, last, positional, len(logs[0]), _suffix_layout(model, positional, forward, how), how)


@contextmanager
def _flags(model: Any, flags: list) -> Iterator[None]:
    """The config ``flags`` switched on for the block, restored after."""
    saved = {k: getattr(model.cfg, k) for k in flags}
    try:
        for key in flags:
            setattr(model.cfg, key, True)
        yield
    finally:
        for key, value in saved.items():
            setattr(model.cfg, key, value)


def _suffix_layout(model: Any, positional: frozenset, forward: Any, how: str) -> dict[str, bool]:
    """:attr:`HookOrder.new_only` from one forward of :data:`SUFFIX` positions after a cached prefix of
    :data:`PREFIX` (with the model's flags as they are)."""
    cfg = model.cfg
    if cfg.n_ctx < PREFIX + SUFFIX:
        return {}
    ids = _ids(model, 2, PREFIX + SUFFIX)
    try:
        cache = TransformerLensKeyValueCache.init_cache(cfg, cfg.device, 2)
        with _recording(model) as rec:
            forward(rec, ids[:, :PREFIX], cache)
            log = forward(rec, ids[:, PREFIX:], cache)
    except Exception:  # noqa: BLE001 (a model that cannot run cached forwards gets none)
        if how == "parts":
            raise _NotParts() from None  # (unless the whole model cannot either: it decides)
        return {}
    out: dict[str, bool] = {}
    for name, shape in log:
        if name in positional and shape is not None:
            held = shape[hooks.position_axis(name)]
            if held in (SUFFIX, PREFIX + SUFFIX) and out.get(name, held == SUFFIX) == (held == SUFFIX):
                out[name] = held == SUFFIX
            else:
                out[name] = None  # type: ignore[assignment]
    return {k: v for k, v in out.items() if v is not None}
