"""The batched patching engine shared by activation and path patching.

A *patch group* is a list of :class:`PatchOp` applied together to one copy of the base run;
one metric value comes back per group. The fast path (:func:`run_groups`) avoids recomputing
anything a patch cannot change:

* blocks before the patched one: each forward starts from the base run's cached residual stream
  (``start_at_layer``); a single head-output or MLP-output patch updates its own block's output
  in place at the patched positions (:func:`skip_block`), so the forward starts one block later;
* positions before the first patched one: under the causal mask they are unchanged in every
  layer, so only the suffix is run, attending to the prefix's cached keys and values through a
  frozen TransformerLens key-value cache; what the metric reads is reassembled to full length;
* positions after the last one the metric reads (:meth:`PatchMetric.last_position`; a metric
  read at P0 reads one): nothing there can reach them, so forwards stop at that position, and a
  patch of later positions only has its exact effect, 0, without a forward;
* many groups are stacked along the batch dimension in one forward;
* a forward ends at the last hook the metric reads: where that is inside a block (an attention pattern), the rest
  of the block (its MLP) is not run.

Hooks of earlier blocks that the metric reads come from the same cache. The slow, obvious path
(:func:`run_groups_reference`) runs one full forward per group with ordinary hooks; the tests
check that both agree.
"""

from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.hooks import HookRef
from p0circuit.core.threads import adapt
from p0circuit.patching.metrics import PatchMetric, RunView
from p0circuit.patching.hooking import attached
from p0circuit.patching.order import hook_order
from p0circuit.patching.shape import BlockShape


@dataclass(frozen=True)
class PatchOp:
    """Set (or add to) a hook's activation at some positions (and one head) of the base run."""

    hook: HookRef
    """Where."""
    positions: tuple[int, ...]
    """Base-frame positions."""
    value: Tensor
    """``[batch, len(positions), ...]``: the new value, or the delta with ``add=True``."""
    head: Optional[int] = None
    """Head index for per-head hooks (``hook_z``, ``hook_q_input``, ...)."""
    add: bool = False
    """Add ``value`` instead of replacing."""

    def apply(self, act: Tensor, rows: slice) -> None:
        """Apply in place to ``act[rows]``."""
        pos = list(self.positions)
        if self.head is None:
            if self.add:
                act[rows, pos] += self.value
            else:
                act[rows, pos] = self.value
        elif self.add:
            act[rows, pos, self.head] += self.value
        else:
            act[rows, pos, self.head] = self.value


def start_layer(group: Sequence[PatchOp]) -> int:
    """Earliest block a forward applying ``group`` must run (embedding ops start at block 0)."""
    return max(0, min(op.hook.layer if op.hook.layer >= 0 else 0 for op in group)) if group else 0


def base_hooks(n_layers: int, metric: PatchMetric, extra: Sequence[HookRef], stop: Optional[int] = None,
               attn_only: bool = False) -> set[str]:
    """Hooks the base-run cache must hold: the input and output of every block before ``stop``
    (and its middle and MLP output, for :func:`skip_block`, unless the blocks are attention-only),
    the metric's, and ``extra``. (The keys and values for suffix forwards come from the base run's
    key-value cache: :func:`cache_run`.)"""
    layers = range(n_layers if stop is None else min(stop, n_layers))
    names = {hooks.EMBED} | {hooks.resid_pre(l) for l in layers} | {hooks.resid_post(l) for l in layers}
    if not attn_only:
        names |= {hooks.mlp_out(l) for l in layers} | {hooks.resid_mid(l) for l in layers}
    names |= {h.name for h in metric.needs(n_layers)}
    names |= {h.name for h in extra}
    return names


def stop_layer(model: Any, metric: PatchMetric) -> Optional[int]:
    """The block after the last one the metric reads (None when it reads the logits): no forward
    needs to run further."""
    if metric.needs_logits:
        return None
    needed = [h.layer for h in metric.needs(model.cfg.n_layers)]
    if not needed or max(needed) >= model.cfg.n_layers:  # nothing, or a hook after the blocks (ln_final)
        return None
    return max(needed) + 1


def reaches(model: Any, hook: HookRef, metric: PatchMetric) -> bool:
    """Whether a change at ``hook`` can change anything ``metric`` reads: the write must come no
    later in the model's forward than one of the reads (:func:`p0circuit.patching.order.hook_order`,
    traced from the model, not a table of names); logits are reached by everything."""
    if metric.needs_logits:
        return True
    order = hook_order(model)
    return any(order.can_change(hook.name, h.name) for h in metric.needs(model.cfg.n_layers))


def laid_out(model: Any, metric: PatchMetric) -> bool:
    """Whether every hook ``metric`` reads is laid out ``[batch, pos, ...]``, so that forwards may
    run a suffix or a prefix of the positions and stack groups along the batch axis (expert hooks,
    which see only the tokens routed to them, are not)."""
    positional = hook_order(model).positional
    return all(h.name in positional for h in metric.needs(model.cfg.n_layers))


def skippable(model: Any, group: Sequence[PatchOp], metric: PatchMetric) -> bool:
    """Whether :func:`skip_block` can stand in for the patched block (see there)."""
    if len(group) != 1:
        return False
    op = group[0]
    layer = op.hook.layer
    allowed = {hooks.resid_post(layer), hooks.pattern(layer)}
    if layer >= 0 and op.hook.name == hooks.resid_post(layer):  # the block's output itself (a direct edge, an R node)
        return all(h.layer != layer or h.name in allowed for h in metric.needs(model.cfg.n_layers))
    if layer < 0 or output_norm(model, "mlp") is not None:
        return False
    if op.hook.name == hooks.mlp_in(layer) and (BlockShape.of(model).parallel or op.head is not None):
        return False
    if op.hook.name not in (hooks.head_z(layer), hooks.mlp_out(layer), hooks.mlp_post(layer), hooks.mlp_in(layer)):
        return False
    return all(h.layer != layer or h.name in allowed for h in metric.needs(model.cfg.n_layers))



def output_norm(model: Any, sublayer: str) -> Optional[Any]:
    """The norm block outputs of ``sublayer`` ("attn" or "mlp") pass through before the residual
    stream, one module per block (a list), or None: Gemma 2/3's ``ln1_post``/``ln2_post`` (norms
    before and after), OLMo 2/3's ``ln1``/``ln2`` (post-norm only)."""
    name, shape = {"attn": "ln1", "mlp": "ln2"}[sublayer], BlockShape.of(model)
    if shape.norms_around:
        name += "_post"
    elif not shape.post_norm:  # (there, skip_block's ln2 before the MLP does not hold)
        return None
    return [getattr(block, name) for block in model.blocks]


def skip_block(model: Any, base_cache: dict[str, Tensor], op: PatchOp) -> Tensor:
    """The patched output of block ``l`` without re-running it, for a head-output, MLP-output or
    neuron op.

    A head output or MLP output changes the residual stream only at the patched positions; the
    MLP and its norm act position by position. So the block's output is the cached one plus, at
    those positions: the change of the MLP output (MLP op; a neuron's change times its row of
    ``W_out`` for a neuron op); or the change of the head's output
    ``(z' - z) W_O`` plus, in sequential blocks, the resulting change of the MLP output,
    recomputed on those positions alone. ``run_groups_reference`` checks this against full runs.
    """
    layer = op.hook.layer
    pos = list(op.positions)
    out = base_cache[hooks.resid_post(layer)].clone()
    if op.hook.name == hooks.resid_post(layer):  # the output itself: set or add at the positions
        out[:, pos] = out[:, pos] + op.value if op.add else op.value
        return out
    if op.hook.name == hooks.mlp_in(layer):  # only the MLP sees the change; the residual stream does not
        out[:, pos] = _mlp_in_outputs(model, base_cache, [op])[0]
        return out
    base = base_cache[op.hook.name]
    if op.hook.name in (hooks.mlp_out(layer), hooks.mlp_post(layer)):
        out[:, pos] += _mlp_change(model, base_cache, op)
        return out
    z = base[:, pos, op.head]
    delta_z = op.value if op.add else op.value - z
    delta = delta_z @ model.blocks[layer].attn.W_O[op.head]  # (B, P, d_head) x (d_head, d_model) -> (B, P, d_model)
    if not BlockShape.of(model).mlp_sees_heads:  # no MLP sees the head's change inside the block
        out[:, pos] += delta
        return out
    block = model.blocks[layer]
    mid = base_cache[hooks.resid_mid(layer)][:, pos] + delta
    mlp_new = block.apply_mlp(block.ln2(mid))
    out[:, pos] = mid + mlp_new
    return out


def _mlp_in_outputs(model: Any, base_cache: dict[str, Tensor], ops: Sequence[PatchOp]) -> list[Tensor]:
    """Block ``l``'s output at each op's positions for MLP-input ops (an edge into the MLP): the
    cached ``resid_mid`` plus the MLP of ``resid_mid + delta`` (``value`` replaces the input when the
    op does not add), the ops' positions concatenated into one MLP call."""
    layer = ops[0].hook.layer
    block, mid = model.blocks[layer], base_cache[hooks.resid_mid(layer)]
    parts = [mid[:, list(op.positions)] for op in ops]
    inputs = torch.cat([part + op.value if op.add else op.value for part, op in zip(parts, ops)], dim=1)
    new = block.apply_mlp(block.ln2(inputs))
    out, at = [], 0
    for part in parts:
        out.append(part + new[:, at:at + part.shape[1]])
        at += part.shape[1]
    return out


def _mlp_change(model: Any, base_cache: dict[str, Tensor], op: PatchOp) -> Tensor:
    """The change of block ``l``'s MLP output at ``op.positions`` for an MLP-output or neuron op."""
    pos = list(op.positions)
    base = base_cache[op.hook.name][:, pos]
    if op.hook.name == hooks.mlp_out(op.hook.layer):
        return op.value if op.add else op.value - base
    change = op.value if op.add else op.value - base[:, :, op.head]  # (B, P): the neuron's activation
    return change[..., None] * model.blocks[op.hook.layer].mlp.W_out[op.head]  # (B, P, 1) x (d_model,) -> (B, P, d_model)


def skipped_outputs(model: Any, base_cache: dict[str, Tensor], ops: Sequence[PatchOp]) -> list[Tensor]:
    """:func:`skip_block` for many ops of one layer at once, each at its own positions only:
    ``out[i]`` is the patched block output at ``ops[i].positions``, shaped (B, P_i, d_model).

    The MLP and its norm act position by position, so the head ops' MLP inputs (at their own
    positions) are concatenated along the position axis and run through one MLP call."""
    if not ops:
        return []
    layer = ops[0].hook.layer
    if not BlockShape.of(model).mlp_sees_heads:
        return [skip_block(model, base_cache, op)[:, list(op.positions)] for op in ops]
    post = base_cache[hooks.resid_post(layer)]  # (the ops of one start block: all of block layer, or R nodes of layer)
    out: list[Optional[Tensor]] = [None] * len(ops)
    heads = []
    mlp_in = [i for i, op in enumerate(ops) if op.hook.name == hooks.mlp_in(layer)]
    for i, value in zip(mlp_in, _mlp_in_outputs(model, base_cache, [ops[i] for i in mlp_in]) if mlp_in else []):
        out[i] = value
    for i, op in enumerate(ops):
        pos = list(op.positions)
        if op.hook.name == hooks.mlp_in(layer):
            continue
        if op.hook.name == hooks.resid_post(layer):  # the block's output itself
            out[i] = post[:, pos] + op.value if op.add else op.value
        elif op.hook.name != hooks.head_z(layer):  # MLP output or neuron: no MLP call needed
            out[i] = post[:, pos] + _mlp_change(model, base_cache, op)
        else:
            heads.append(i)
    if not heads:
        return out  # type: ignore[return-value]
    base_z = base_cache[hooks.head_z(layer)]  # (B, T, H, d_head)
    W_O = model.blocks[layer].attn.W_O  # (H, d_head, d_model); model.W_O would re-stack every block
    mid_base = base_cache[hooks.resid_mid(layer)]
    mids: list[Tensor] = []
    by_len: dict[int, list[int]] = {}
    for i in heads:
        by_len.setdefault(len(ops[i].positions), []).append(i)
    for p_len, idx in by_len.items():  # ops with as many positions: one batched matmul
        pos = torch.tensor([list(ops[i].positions) for i in idx], device=base_z.device)  # (k, P)
        heads_ix = torch.tensor([ops[i].head for i in idx], device=base_z.device)
        z = base_z[:, pos, heads_ix[:, None]]  # (B, k, P, d_head)
        values = torch.stack([ops[i].value for i in idx], dim=1)  # (B, k, P, d_head)
        adds = [ops[i].add for i in idx]
        if all(adds):
            dz = values
        elif not any(adds):
            dz = values - z
        else:
            keep = torch.tensor(adds, device=z.device)[None, :, None, None]
            dz = torch.where(keep, values, values - z)
        b, k = dz.shape[:2]
        delta = dz.new_empty(b, k, p_len, W_O.shape[-1])  # (B, k, P, d_model)
        for head in heads_ix.unique().tolist():  # by head: no per-op copy of W_O
            of_head = (heads_ix == head).nonzero().flatten()
            delta[:, of_head] = dz[:, of_head] @ W_O[head]
        mids.append((mid_base[:, pos] + delta).reshape(b, k * p_len, -1))
    block = model.blocks[layer]
    mid = torch.cat(mids, dim=1)  # (B, sum of P, d_model)
    new = mid + block.apply_mlp(block.ln2(mid))
    part = 0
    for p_len, idx in by_len.items():
        for i in idx:
            out[i] = new[:, part:part + p_len]
            part += p_len
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class BaseRun:
    """The cached run every patched forward of one call starts from."""

    model: Any
    cache: dict[str, Tensor]
    """Base-run activations (:func:`base_hooks`)."""
    metric: PatchMetric
    p0: int
    """Index of the clean first token in the base run."""
    logits: Optional[Tensor] = None
    """Base-run logits: lets metrics on logits use suffix-only forwards."""
    tokens: Optional[Tensor] = None
    """The base run's prompts (what the slow reference path runs from)."""

    @property
    def batch(self) -> int:
        """Prompts in the base run."""
        return self.cache[hooks.EMBED].shape[0]

    @property
    def length(self) -> int:
        """Positions in the base run."""
        return self.cache[hooks.EMBED].shape[1]

    @cached_property
    def end(self) -> int:
        """One past the last position the metric reads: patched forwards run no further."""
        if not laid_out(self.model, self.metric):  # hooks of routed tokens: whole prompts only
            return self.length
        last = self.metric.last_position(self.p0)
        if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
            raise BadInputError(f"metric {self.metric.name}: last_position({self.p0}) returned {last!r}; it must be "
                                "None (any position) or the index >= 0 of the last position the metric reads")
        return self.length if last is None else min(self.length, last + 1)

    def value(self) -> float:
        """The metric on the base run itself (what a patch the metric cannot see leaves). When the
        metric declares a last position, it is also computed with every later position hidden (NaN),
        as a patched forward shows them; a metric that reads past its declaration is refused."""
        needs = self.metric.needs(self.model.cfg.n_layers)
        full = float(self.metric(RunView({h.name: self.cache[h.name] for h in needs}, self.logits, self.p0)))
        end = self.end
        if end < self.length:
            hidden = {h.name: _to_length(_first_positions(self.cache[h.name], end, h.name), self.length, h.name)
                      for h in needs}
            logits = None if self.logits is None else _to_length(self.logits[:, :end], self.length, "logits")
            seen = float(self.metric(RunView(hidden, logits, self.p0)))
            if seen != full:
                raise BadInputError(
                    f"metric {self.metric.name}: last_position({self.p0}) says it reads positions up to "
                    f"{end - 1} only, but its value changes when the later ones are hidden ({full:.6g} -> {seen:.6g}); "
                    "return None from last_position (it may read any position) or make it read only what it declares")
        return full


@dataclass(frozen=True)
class Chunk:
    """Groups run together in one batched forward: they share the start block and first position."""

    groups: Sequence[Sequence[PatchOp]]
    start: int
    """First block run (one past a block that :func:`skip_block` stands in for)."""
    stop: Optional[int]
    """Block after the last one the metric reads (None: run to the logits)."""
    skipped: Sequence[bool]
    """Per group: whether its patched block is replaced by :func:`skip_block`."""
    first: int = 0
    """First position run (positions before it are taken from the base run)."""
    patched: Sequence[Optional[Tensor]] = ()
    """Per skipped group: its patched block's output at its positions (:func:`skipped_outputs`)."""


@torch.no_grad()
def run_groups(
    base: BaseRun,
    groups: Sequence[Sequence[PatchOp]],
    rows_per_forward: int,
    on_done: Optional[Callable[[int], None]] = None,
) -> list[float]:
    """Metric value of ``base`` with each group applied (fast path), in four steps: groups the metric
    cannot see are answered at once (:func:`_unseen`); the rest are planned by the block their forward
    starts at and the first position it runs (:func:`_plan`); a start block at or after the metric's
    last needs no forward (:func:`_without_forward`); every other plan entry runs in chunks of patched
    forwards (:func:`_run_chunk`). ``base.logits`` lets metrics on logits use the suffix-only forwards;
    ``on_done(n)`` is called as groups finish (a progress bar)."""
    done = on_done or (lambda n: None)
    groups, out = _unseen(base, groups, done)
    by_start, skip = _plan(base, groups, out)
    stop = stop_layer(base.model, base.metric)
    per_chunk = max(1, rows_per_forward // base.batch) if laid_out(base.model, base.metric) else 1  # (rows of routed tokens)
    patched: dict[int, Tensor] = {}
    current = None
    for (start, first), idx in sorted(by_start.items()):
        if start != current:  # a new start block: the outputs of its skipped groups in one go
            current = start
            todo = [i for (s, _), ids in by_start.items() if s == start for i in ids if skip[i]]
            patched = dict(zip(todo, skipped_outputs(base.model, base.cache, [groups[i][0] for i in todo])))
        if stop is not None and start >= stop:  # no forward needed: the metric reads only earlier hooks
            for i in idx:
                out[i] = _without_forward(base, groups[i], start, skip[i], patched.get(i))
            done(len(idx))
            continue
        for c in range(0, len(idx), per_chunk):
            adapt()  # fewer threads while other processes keep the cores busy (core/threads.py)
            part = idx[c : c + per_chunk]
            chunk = Chunk([groups[i] for i in part], start, stop, [skip[i] for i in part], first,
                          [patched.get(i) for i in part])
            for i, v in zip(part, _run_chunk(base, chunk)):
                out[i] = v
            done(len(part))
    return [float(v) for v in out]  # type: ignore[arg-type]


def _unseen(base: BaseRun, groups: Sequence[Sequence[PatchOp]],
            done: Callable[[int], None]) -> tuple[list[list[PatchOp]], list[Optional[float]]]:
    """When the metric reads only a prefix of the positions: every group cut to that prefix, and the
    base run's value for the groups left with nothing the metric can see (no forward)."""
    out: list[Optional[float]] = [None] * len(groups)
    if base.end >= base.length:
        return [list(g) for g in groups], out
    groups = [_trimmed(g, base.end) for g in groups]
    if not (base.metric.needs_logits and base.logits is None):
        value = base.value()  # (refuses a metric that reads past its last_position)
        unseen = [i for i, g in enumerate(groups) if not g]  # all it patches comes after what the metric reads
        for i in unseen:
            out[i] = value
        done(len(unseen))
    return groups, out


def _plan(base: BaseRun, groups: Sequence[Sequence[PatchOp]],
          out: Sequence[Optional[float]]) -> tuple[dict[tuple[int, int], list[int]], dict[int, bool]]:
    """The groups still to run, by (start block, first position), and whether each skips its own block
    (its block's output computed directly: :func:`skippable`)."""
    by_start: dict[tuple[int, int], list[int]] = {}
    skip: dict[int, bool] = {}
    suffix_ok = _suffix_ok(base.model, base.metric, base.logits, base.cache)
    for i, g in enumerate(groups):
        if out[i] is not None:
            continue
        skip[i] = skippable(base.model, g, base.metric)
        first = min((p for op in g for p in op.positions), default=0) if suffix_ok else 0
        by_start.setdefault((start_layer(g) + int(skip[i]), first), []).append(i)
    return by_start, skip


def _without_forward(base: BaseRun, group: Sequence[PatchOp], start: int, skip: bool,
                     patched: Optional[Tensor]) -> float:
    """The metric of one group whose forward would start at or after the metric's last block: from the
    cached activations, with the group's change applied where the metric reads it."""
    acts = {h.name: base.cache[h.name] for h in base.metric.needs(base.model.cfg.n_layers)}
    name = hooks.resid_post(start - 1)
    if skip and name in acts:  # (a metric that reads only earlier hooks is left as it is)
        acts[name] = _with_positions(acts[name], group[0].positions, patched)
    elif not skip:  # a metric that reads the very hook patched (an embedding, say)
        acts = _with_ops(acts, [(slice(None), op) for op in group])
    return float(base.metric(RunView(acts, None, base.p0)))


def _trimmed(group: Sequence[PatchOp], end: int) -> list[PatchOp]:
    """``group`` without its positions at or after ``end``, which nothing the metric reads can see
    (an op left with no position is dropped)."""
    out = []
    for op in group:
        keep = [i for i, p in enumerate(op.positions) if p < end]
        if len(keep) == len(op.positions):
            out.append(op)
        elif keep:
            value = op.value[:, keep] if op.value.ndim > 1 and op.value.shape[1] == len(op.positions) else op.value
            out.append(replace(op, positions=tuple(op.positions[i] for i in keep), value=value))
    return out


def _with_ops(acts: dict[str, Tensor], ops: Sequence[tuple[slice, PatchOp]]) -> dict[str, Tensor]:
    """``acts`` with each op applied to its rows of a copy of its hook's activation (those it touches)."""
    out = dict(acts)
    for name in {op.hook.name for _, op in ops if op.hook.name in acts}:
        out[name] = acts[name].clone()
    for rows, op in ops:
        if op.hook.name in out:
            op.apply(out[op.hook.name], rows)
    return out


def _with_positions(act: Tensor, positions: Sequence[int], values: Tensor) -> Tensor:
    """A copy of ``act`` (B, T, ...) with ``values`` at ``positions``."""
    out = act.clone()
    out[:, list(positions)] = values
    return out


def apply_ops(ops: Sequence[tuple[slice, PatchOp]], act: Tensor, hook: Any) -> Tensor:
    """A forward hook (bound with ``partial``, not a closure made per call): each op on its rows."""
    for rows, op in ops:
        op.apply(act, rows)
    return act


def _keep(into: dict[str, Tensor], name: str, act: Tensor, hook: Any) -> None:
    """A forward hook that keeps ``act`` as ``into[name]``."""
    into[name] = act


class ReadAll(Exception):
    """Raised by the hook of :func:`ended_at_last_read` to end a forward once every hook the metric reads has fired."""


def _read_all(act: Tensor, hook: Any) -> None:
    """The last hook the metric reads has fired (after the hooks that keep it): nothing later can change the metric."""
    raise ReadAll


def ended_at_last_read(model: Any, metric: PatchMetric, start: int, stop: Optional[int]) -> list[tuple[str, Callable]]:
    """The hook that ends a forward from block ``start`` (catch :class:`ReadAll`) where the last hook ``metric`` reads
    fires, by the traced hook order; to be attached after the hooks that keep what the metric reads. None (an empty
    list) where the forward runs to the logits, or a read's place was not traced."""
    if stop is None or metric.needs_logits:
        return []
    reads, fired = [h.name for h in metric.needs(model.cfg.n_layers) if h.layer >= start], hook_order(model).last
    if not reads or not all(r in fired for r in reads):
        return []
    return [(max(reads, key=fired.__getitem__), _read_all)]


def _run_chunk(base: BaseRun, chunk: Chunk) -> list[float]:
    model, base_cache, metric, batch = base.model, base.cache, base.metric, base.batch
    groups, start, stop, first = chunk.groups, chunk.start, chunk.stop, chunk.first
    n = len(groups)
    if start >= model.cfg.n_layers:
        first = 0  # nothing but the unembedding runs: no suffix forward needed
    if start < model.cfg.n_layers:
        resid = base_cache[hooks.resid_pre(start)].repeat(n, 1, 1)  # (n*B, T, d)
    else:  # only the final norm and unembedding are left
        resid = base_cache[hooks.resid_post(start - 1)].repeat(n, 1, 1)
    by_hook: dict[str, list[tuple[slice, PatchOp]]] = {}
    early: dict[str, Tensor] = {}  # hooks below `start` that differ per group (the skipped block's output)
    if any(chunk.skipped):
        for i, g in enumerate(groups):  # resid holds block start-1's base output: write the patched positions
            if chunk.skipped[i]:
                resid[i * batch:(i + 1) * batch, list(g[0].positions)] = chunk.patched[i]
        # block start-1's output, per group: the patched rows just written, the base run elsewhere
        if any(h.name == hooks.resid_post(start - 1) for h in metric.needs(model.cfg.n_layers)):
            early[hooks.resid_post(start - 1)] = resid.clone()
    for i, g in enumerate(groups):
        rows = slice(i * batch, (i + 1) * batch)
        if chunk.skipped[i]:
            continue
        for op in g:
            if op.hook.layer < 0:  # embeddings: fold into the block-0 input
                base_act = base_cache[op.hook.name]
                delta = op.value if op.add else op.value - base_act[:, list(op.positions)]
                resid[rows, list(op.positions)] += delta
            else:
                by_hook.setdefault(op.hook.name, []).append((rows, op))
    if first:
        by_hook = {k: [(r, replace(op, positions=tuple(p - first for p in op.positions))) for r, op in v]
                   for k, v in by_hook.items()}
    captured: dict[str, Tensor] = {}
    fwd_hooks: list[tuple[str, Callable]] = []
    for name, ops in by_hook.items():
        fwd_hooks.append((name, partial(apply_ops, ops)))
    for h in metric.needs(model.cfg.n_layers):
        if h.layer >= start:
            fwd_hooks.append((h.name, partial(_keep, captured, h.name)))
        elif h.name in early:
            captured[h.name] = early[h.name]
        else:
            captured[h.name] = base_cache[h.name].repeat(n, *([1] * (base_cache[h.name].ndim - 1)))
    below = [(slice(i * batch, (i + 1) * batch), op) for i, g in enumerate(groups) if not chunk.skipped[i] for op in g
             if op.hook.name in captured]  # ops on a hook the metric reads from before the forward (embeddings)
    captured.update(_with_ops(captured, below))
    fwd_hooks += ended_at_last_read(model, metric, start, stop)
    kv = _prefix_cache(model, base_cache, start, first, n) if first else None
    extra: dict[str, Any] = {}
    end = base.end
    if model.cfg.positional_embedding_type == "shortformer":  # positions enter each block's queries and keys
        extra["shortformer_pos_embed"] = model.W_pos[first:end].unsqueeze(0).expand(resid.shape[0], -1, -1)
    try:
        with attached(model, fwd_hooks):
            logits = model(resid[:, first:end].contiguous(), start_at_layer=start, stop_at_layer=stop, past_kv_cache=kv,
                           **extra)
    except ReadAll:
        logits = None  # (the metric reads no logits)
    positional = laid_out(model, metric)  # else: one group, whole prompts (run_groups saw to it)
    new_only = hook_order(model).new_only
    for h in metric.needs(model.cfg.n_layers):
        if h.layer >= start and positional:
            act = captured[h.name]
            if first and new_only[h.name]:  # (rotary keys come out of a suffix forward whole)
                act = _reassemble(base_cache[h.name], act, first, n, hooks.position_axis(h.name))
            captured[h.name] = _to_length(act, base.length, h.name)
    if metric.needs_logits:
        if first:
            logits = _reassemble(base.logits, logits, first, n, 1)  # type: ignore[arg-type]
        logits = _to_length(logits, base.length, "logits")
    values = []
    for i in range(n):
        rows = slice(i * batch, (i + 1) * batch) if positional else slice(None)
        view = RunView({k: v[rows] for k, v in captured.items()}, logits[rows] if metric.needs_logits else None, base.p0)
        values.append(float(metric(view)))
    return values


def _suffix_ok(model: Any, metric: PatchMetric, base_logits: Optional[Tensor], base_cache: dict[str, Tensor]) -> bool:
    if metric.needs_logits and base_logits is None:
        return False
    if model.cfg.positional_embedding_type not in ("rotary", "standard") or not laid_out(model, metric):
        return False
    known = hook_order(model).new_only  # what a cached suffix forward shows of each hook
    if any(h.name not in known for h in metric.needs(model.cfg.n_layers)):
        return False
    stop = stop_layer(model, metric)
    layers = range(model.cfg.n_layers if stop is None else stop)
    return all(hooks.kv_entry(l, w) in base_cache for l in layers for w in ("k", "v"))


def _prefix_cache(model: Any, base_cache: dict[str, Tensor], start: int, first: int, n: int) -> Any:
    """A frozen key-value cache holding the base run's keys and values of positions < ``first``
    exactly as its attention appended them (:func:`cache_run`), repeated for ``n`` groups (empty
    placeholders for the blocks that do not run: before ``start``, or past the cached ones)."""
    cached = [l for l in range(model.cfg.n_layers) if hooks.kv_entry(l, "k") in base_cache]
    like_k, like_v = (base_cache[hooks.kv_entry(cached[0], w)][:, :0] for w in ("k", "v"))
    entries = []
    for layer in range(model.cfg.n_layers):
        if layer < start or layer not in cached:  # not run: an empty placeholder
            k, v = like_k, like_v
        else:
            k, v = base_cache[hooks.kv_entry(layer, "k")], base_cache[hooks.kv_entry(layer, "v")]
        entries.append(TransformerLensKeyValueCacheEntry(
            k[:, :first].repeat(n, 1, 1, 1), v[:, :first].repeat(n, 1, 1, 1), frozen=True))
    mask = torch.ones(like_k.shape[0] * n, first, dtype=torch.int, device=like_k.device)
    return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=mask, frozen=True)


def _first_positions(act: Tensor, end: int, name: str) -> Tensor:
    """Hook ``name``'s activation at its first ``end`` (query and key) positions."""
    axis = hooks.position_axis(name)
    act = act.narrow(axis, 0, end)
    return act.narrow(3, 0, end) if axis == 2 else act


def _padded(act: Tensor, length: int, axis: int, fill: float) -> Tensor:
    """``act`` brought to ``length`` entries along ``axis``, the new ones ``fill``."""
    short = length - act.shape[axis]
    if short <= 0:
        return act
    shape = list(act.shape)
    shape[axis] = short
    return torch.cat([act, act.new_full(shape, fill)], dim=axis)


def _to_length(act: Tensor, length: int, name: str) -> Tensor:
    """Activations of hook ``name`` (or logits) run up to some position, brought to ``length``
    positions: NaN where nothing ran; an attention pattern's (or score's) keys after the last run
    query are 0 (-inf), as the causal mask makes them."""
    axis = hooks.position_axis(name)
    if axis == 2:  # [batch, head, query, key]
        act = _padded(act, length, 3, 0.0 if name.endswith("hook_pattern") else float("-inf"))
    return _padded(act, length, axis, float("nan"))


def _reassemble(base: Tensor, suffix: Tensor, first: int, n: int, axis: int) -> Tensor:
    """Full-length activations: the base run's positions < ``first``, then the suffix run's."""
    prefix = base.narrow(axis, 0, first)
    if axis == 2:  # an attention pattern: as many keys as the suffix run saw
        prefix = prefix.narrow(3, 0, suffix.shape[3])
    prefix = prefix.repeat(n, *([1] * (base.ndim - 1)))
    return torch.cat([prefix, suffix], dim=axis)


@torch.no_grad()
def run_groups_reference(
    model: Any, base_tokens: Tensor, groups: Sequence[Sequence[PatchOp]], metric: PatchMetric, p0: int
) -> list[float]:
    """The slow, obvious path: one full forward per group, ordinary hooks, no batching."""
    values = []
    names = [h.name for h in metric.needs(model.cfg.n_layers)]
    for group in groups:
        adapt()
        captured: dict[str, Tensor] = {}
        fwd_hooks: list[tuple[str, Callable]] = []
        for op in group:
            fwd_hooks.append((op.hook.name, partial(apply_ops, [(slice(None), op)])))
        for name in names:
            fwd_hooks.append((name, partial(_keep, captured, name)))
        logits = model.run_with_hooks(base_tokens, fwd_hooks=fwd_hooks)
        values.append(float(metric(RunView(captured, logits, p0))))
    return values


def cache_run(model: Any, tokens: Tensor, names: set[str], stop: Optional[int] = None,
              kv: bool = False) -> tuple[dict[str, Tensor], Optional[Tensor]]:
    """Run ``tokens`` once through the blocks before ``stop`` (all of them and the unembedding when
    None), keeping only ``names``; returns (cache dict, logits or None when stopped early).

    With ``kv`` the run also fills a TransformerLens key-value cache, and the cache dict holds
    each run block's keys and values as its attention appended them (:func:`p0circuit.core.hooks.kv_entry`):
    the prefix that suffix-only forwards attend to, whatever the attention does to its keys
    between ``hook_k`` and the cache (QK-norm, clipping)."""
    adapt()
    extra: dict[str, Any] = {}
    if kv:
        extra["past_kv_cache"] = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
        extra["attention_mask"] = torch.ones_like(tokens)  # no padding (TransformerLens asks for it with a cache)
    out, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, stop_at_layer=stop, **extra)
    acts = dict(cache.cache_dict)
    if kv:
        for layer, entry in enumerate(extra["past_kv_cache"].entries):
            if entry.past_keys.shape[1]:  # blocks at or past ``stop`` did not run
                acts[hooks.kv_entry(layer, "k")], acts[hooks.kv_entry(layer, "v")] = entry.past_keys, entry.past_values
    return acts, (out if stop is None else None)
