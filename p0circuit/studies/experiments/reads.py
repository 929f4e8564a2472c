"""What the sink reads: the P0 state's norm against its direction, tested by editing the state.

An onset makes position 0's residual state large (its norm) and points it somewhere (its direction).
Under a pre-norm (RMSNorm or LayerNorm before each sublayer), a later head's key at position 0 is computed
from the *normalized* state, which is the same for ``h`` and ``c * h``: a head can read the state's direction
directly, its norm only through what later blocks add to it (a large state turns less under the same
additions: the paper's "stabilization"). :func:`sink_reads` separates the two causally. After block
``layer`` (the onset), the P0 state of every prompt is replaced by one of :data:`EDITS` and the rest of the
model runs on:

* ``rescaled``: scaled to the mean norm of the prompt's other positions, its direction kept (the norm removed);
* ``massive_removed``: its massive dimensions set to the other positions' mean there, the rest kept;
* ``direction_replaced``: its norm kept, its direction that of the mean of the prompt's other positions (an
  ordinary direction with the sink's norm);
* ``random_direction``: its norm kept, a random direction (the positive control: a metric that does not fall
  here cannot see a changed state, and the other edits say nothing);
* ``state_replaced``: replaced by the mean of the other positions' states (position 0 made ordinary).

Each edit is measured on the attention later heads give position 0 (alpha_0, as in Gu et al. 2025: the mean
over the queries that can see it), Sink_0^eps over every later block, and the next-token loss. The attention
of the *sink heads* (alpha_0 > ``eps`` in the clean run) of the ``window`` blocks from the first block after the onset
that holds one (:func:`first_readers`) is read as a
*kept share* of its excess over uniform attention (``(a - u) / (a_clean - u)``, ``u`` what uniform causal
attention gives position 0), and the same over the sink heads of every later block. :func:`reads_of` turns the
two shares that separate norm from direction into the answer: **the direction** (the rescaled state keeps the
attention, the direction-replaced state loses it), **the norm** (the reverse), **both** (each edit loses it) or
**neither alone** (each keeps it), with :data:`KEEPS` as the line.
"""

import math
from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import entry_point
from p0circuit.core.defaults import KEEPS, SINK_EPS
from p0circuit.core.errors import BadInputError
from p0circuit.studies.findings import Edit, SinkReads
from p0circuit.measures.attention import attention_to_position
from p0circuit.measures.loss import next_token_loss
from p0circuit.models.checks import check_block, check_dims, check_model
from p0circuit.models.tokens import check_tokens

READ_BLOCKS = 1
"""Blocks whose sink heads the edits are read on first (``window``), counted from the first block after the onset that
holds a sink head (the first to read the state: :func:`first_readers`); their attention is also the sink circuit's
metric (:mod:`p0circuit.studies.analysis.sink_circuit`)."""


def first_readers(alpha: Sequence[Sequence[float]], layer: int, eps: float = SINK_EPS,
                  window: int = READ_BLOCKS) -> list[tuple[int, int]]:
    """The sink heads (mean alpha_0 above ``eps``; ``alpha`` per [block][head]) of the ``window`` blocks from the first
    block after ``layer`` that holds one: the first heads to read the state the onset wrote."""
    blocks = [l for l in range(layer + 1, len(alpha)) if any(a > eps for a in alpha[l])]
    chosen = set(range(blocks[0], blocks[0] + window)) if blocks else set()
    return [(l, h) for l in sorted(chosen) if l < len(alpha) for h, a in enumerate(alpha[l]) if a > eps]
MIN_EXCESS = 0.05
"""Excess attention to position 0 over uniform (clean run) below which a share of it is not read: the sink heads
of the window need at least this much (else the study does not apply), and a prompt with less is left out of the
per-prompt shares."""
READS = ("the direction", "the norm", "both", "neither alone")
"""The answers of :func:`reads_of`."""


def _others(h: Tensor) -> Tensor:
    return h[:, 1:]  # (B, T-1, d): every position after P0


def _rescaled(h: Tensor, dims: Sequence[int], gen: torch.Generator) -> Tensor:
    """P0 scaled to the mean norm of the other positions, direction kept."""
    return h[:, 0] * (_others(h).norm(dim=-1).mean(1) / h[:, 0].norm(dim=-1)).unsqueeze(-1)


def _massive_removed(h: Tensor, dims: Sequence[int], gen: torch.Generator) -> Tensor:
    """P0 with its massive dimensions set to the other positions' mean there."""
    out = h[:, 0].clone()
    out[:, list(dims)] = _others(h)[:, :, list(dims)].mean(1)
    return out


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _direction_replaced(h: Tensor, dims: Sequence[int], gen: torch.Generator) -> Tensor:
    """P0's norm, in the direction of the mean of the other positions."""
    return _unit(_others(h).mean(1)) * h[:, 0].norm(dim=-1, keepdim=True)


def _random_direction(h: Tensor, dims: Sequence[int], gen: torch.Generator) -> Tensor:
    """P0's norm, in a random direction (one per prompt, from the study's seed)."""
    r = torch.randn(h.shape[0], h.shape[-1], generator=gen, dtype=torch.float32).to(h.device, h.dtype)
    return _unit(r) * h[:, 0].norm(dim=-1, keepdim=True)


def _state_replaced(h: Tensor, dims: Sequence[int], gen: torch.Generator) -> Tensor:
    """The mean of the other positions' states."""
    return _others(h).mean(1)


EDITS: dict[str, Callable[[Tensor, Sequence[int], torch.Generator], Tensor]] = {
    "rescaled": _rescaled, "massive_removed": _massive_removed, "direction_replaced": _direction_replaced,
    "random_direction": _random_direction, "state_replaced": _state_replaced,
}
"""Each edit of the P0 state after the onset: ``edit(resid [batch, pos, d], massive dims, generator)`` -> the new
P0 state ``[batch, d]`` (the module docstring says what each does and why)."""
CONTROL = "random_direction"
"""The positive control among :data:`EDITS`."""


def _edited(edit: Callable[[Tensor, Sequence[int], torch.Generator], Tensor], dims: Sequence[int],
            gen: torch.Generator, act: Tensor, hook: Any) -> Tensor:
    """The block output ``act`` with its P0 state replaced by ``edit``'s (a forward hook)."""
    act = act.clone()
    act[:, 0] = edit(act, dims, gen)
    return act


def reads_of(rescaled: Optional[float], replaced: Optional[float], keep: float = KEEPS) -> str:
    """What the heads read, from the kept shares of the rescaled state (norm removed, direction kept) and of the
    direction-replaced state (direction removed, norm kept): one of :data:`READS`."""
    if rescaled is None or replaced is None:
        return "not applicable (no sink head to read)"
    norm, direction = rescaled < keep, replaced < keep
    return READS[0] if direction and not norm else READS[1] if norm and not direction else \
        READS[2] if norm and direction else READS[3]


def uniform_alpha0(seq: int) -> float:
    """alpha_0 of uniform causal attention over ``seq`` positions: the mean over queries t of 1 / (t + 1)."""
    return sum(1.0 / (t + 1) for t in range(seq)) / seq


def _share(a: Tensor, clean: Tensor, u: float) -> tuple[float, Tensor]:
    """(the ratio of the means' excesses, the per-prompt shares with the prompts of too little clean excess NaN)."""
    whole = (float(a.mean()) - u) / (float(clean.mean()) - u)
    excess = clean - u
    per = torch.where(excess >= MIN_EXCESS, (a - u) / excess, torch.full_like(a, math.nan))
    return whole, per


def _edit_record(alpha: Tensor, clean: Tensor, heads: Tensor, later: Tensor, u: float, eps: float, keep: float,
                 loss: Tensor) -> Edit:
    """One run's record: ``alpha`` [B, later blocks, H]; ``heads``/``later`` masks [later blocks, H]."""
    later_kept = _share(alpha[:, later].mean(-1), clean[:, later].mean(-1), u)[0] if bool(later.any()) else None
    attention = kept = None  # no sink head in the window: nothing to average, no share
    per = torch.zeros(0)
    if bool(heads.any()):
        a, c = alpha[:, heads].mean(-1), clean[:, heads].mean(-1)  # (B,)
        attention = float(a.mean())
        kept, per = _share(a, c, u)
        per = per[~torch.isnan(per)]
    return Edit(attention=attention, kept=kept, kept_min=float(per.min()) if len(per) else None,
                prompts_kept=float((per >= keep).float().mean()) if len(per) else None, later_kept=later_kept,
                per_block=[float(x) for x in alpha.mean((0, 2))], sink_rate=float((alpha > eps).float().mean()),
                loss=float(loss.mean()))


@entry_point
def sink_reads(model: Any, tokens: Tensor, layer: int, *, bos: bool, dims: Sequence[int] = (),
               eps: float = SINK_EPS, keep: float = KEEPS, window: int = READ_BLOCKS, seed: int = 0) -> SinkReads:
    """Edit the P0 state after block ``layer`` in each way of :data:`EDITS` and measure what later heads read (the
    module docstring says how). ``dims``: the massive dimensions ``massive_removed`` removes (none: that edit is
    left out); ``bos``: the prompts' BOS choice; ``eps``: alpha_0 above which a head sinks; ``keep``: the line of the
    answers; ``window``: blocks read first (from the first after the onset that holds a sink head); ``seed``: the random
    directions. One forward of the prompts unedited, and per edit one of the blocks after ``layer`` (from the unedited
    run's state there).

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> reads = p0.sink_reads(pm.model, tokens, 1, bos=False)
        >>> reads.reads, reads.scale_blind
        ('the direction', True)
    """
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    check_block(model, layer, "sink_reads", later=1)
    dims = check_dims(model, dims, "sink_reads")
    if not 0 < keep < 1:
        raise BadInputError(f"sink_reads: keep={keep!r} must lie strictly between 0 and 1 (a kept share's line)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise BadInputError(f"sink_reads: window={window!r} must be a whole number of blocks >= 1")
    names = [n for n in EDITS if dims or n != "massive_removed"]
    batch, seq = tokens.shape
    gen = torch.Generator().manual_seed(seed)
    later_layers = list(range(layer + 1, model.cfg.n_layers))
    resid = hooks.resid_post(layer)

    wanted = {hooks.pattern(l) for l in later_layers}
    alphas, losses = [], []
    state: Optional[Tensor] = None  # the blocks up to the onset run once: each edit runs on from its output
    whole = model.cfg.positional_embedding_type == "shortformer"  # positions enter every block: whole forwards
    for name in ["clean"] + names:  # one forward each: a model's logits over a large vocabulary are the memory
        with torch.no_grad():
            if state is None or whole:
                fwd = [] if name == "clean" else [(resid, partial(_edited, EDITS[name], dims, gen))]
                with model.hooks(fwd_hooks=fwd):
                    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted or n == resid)
                state = cache[resid]
            else:
                logits, cache = model.run_with_cache(_edited(EDITS[name], dims, gen, state, None),
                                                     names_filter=lambda n: n in wanted, start_at_layer=layer + 1)
        patterns = torch.stack([cache[hooks.pattern(l)] for l in later_layers])  # (Llater, B, H, T, T)
        alphas.append(attention_to_position(patterns.float(), 0))  # (B, Llater, H)
        losses.append(next_token_loss(logits, tokens))
        del logits, cache, patterns
    alpha, loss = torch.cat(alphas), torch.cat(losses)
    runs = {name: slice(i * batch, (i + 1) * batch) for i, name in enumerate(["clean"] + names)}
    clean = alpha[runs["clean"]]
    mean = clean.mean(0)  # (Llater, H)
    readers = set(first_readers([[0.0]] * (layer + 1) + mean.tolist(), layer, eps, window))
    heads = torch.tensor([[(l, h) in readers for h in range(mean.shape[1])] for l in later_layers])
    blocks = sorted({l for l, _ in readers}) or [layer + 1]
    # a window of the one block right after the onset, under a pre-norm: blind to the state's scale, so the "later"
    # shares leave it out (else its arithmetic 1.00 would be pooled into what is to tell the norm from the direction)
    blind = bool(readers) and blocks == [layer + 1] and scale_free_attention(model)
    later = (mean > eps) & torch.tensor([not (blind and l == layer + 1) for l in later_layers])[:, None]
    u = uniform_alpha0(seq)
    records = {name: _edit_record(alpha[rows], clean, heads, later, u, eps, keep, loss[rows]) for name, rows in
               runs.items()}
    head_names = [f"A{later_layers[i]}.H{h}" for i, h in torch.nonzero(heads).tolist()]
    excess = records["clean"].attention - u if head_names else 0.0
    if not head_names or excess < MIN_EXCESS:
        why = (f"no head after block {layer} gives position 0 an alpha_0 above {eps:g}" if not head_names
               else f"the sink heads of {_blocks_said(blocks)} give position 0 only {excess:.3f} more than "
                    f"uniform attention ({u:.3f})")
        answer = later_answer = f"not applicable ({why})"
        control = False
        evidence = why
    else:
        edits = {n: records[n] for n in names}
        control = edits[CONTROL].kept < keep
        answer = reads_of(edits["rescaled"].kept, edits["direction_replaced"].kept, keep)
        later_answer = reads_of(edits["rescaled"].later_kept, edits["direction_replaced"].later_kept, keep)
        if not control:
            answer = later_answer = (f"not measured (the positive control failed: a random direction of the same norm "
                                     f"keeps {edits[CONTROL].kept:.2f} of the attention, so the attention cannot tell "
                                     "an edited state from the clean one)")
        evidence = _evidence(records, names, head_names, blocks, u, keep) + (BLIND if blind else "")
    return SinkReads(layer=layer, window=blocks, sink_heads=head_names, later_heads=int(later.sum()), uniform=u,
                     dims=list(dims), eps=eps, keep=keep, clean=records["clean"],
                     edits={n: records[n] for n in names}, reads=answer, reads_later=later_answer, control=control,
                     evidence=evidence, scale_blind=blind)


BLIND = ("; the window's heads sit in the block right after the onset and read the state through their "
         "normalization, which ignores its scale: there the rescaled state keeps their attention by arithmetic and the "
         "direction-replaced and replaced states point the same way, so only the later blocks' shares tell the norm from "
         "the direction")
"""Said of a window that cannot see the norm (:attr:`SinkReads.scale_blind`)."""


def _blocks_said(blocks: list[int]) -> str:
    return f"block {blocks[0]}" if len(blocks) == 1 else f"blocks {blocks[0]}-{blocks[-1]}"


def scale_free_attention(model: Any) -> bool:
    """Whether every block's attention reads the residual stream through a normalization that ignores the state's
    scale (LayerNorm or RMSNorm before the sublayer: ``norm(c * h) == norm(h)`` up to its epsilon)."""
    return model.cfg.normalization_type in ("LN", "LNPre", "RMS", "RMSPre")


LABELS = {"rescaled": "scaled to an ordinary norm (direction kept)",
          "massive_removed": "without its massive dimensions",
          "direction_replaced": "with an ordinary direction (norm kept)",
          "random_direction": "with a random direction (norm kept; the positive control)",
          "state_replaced": "replaced by an ordinary state"}
"""Each edit, in words."""


def _evidence(records: dict[str, Edit], names: list[str], heads: list[str], blocks: list[int], u: float,
              keep: float) -> str:
    clean = records["clean"]
    parts = [f"{LABELS[n]} keeps {records[n].kept:.2f} (later blocks "
             f"{'n/a' if records[n].later_kept is None else format(records[n].later_kept, '.2f')}; loss "
             f"{records[n].loss:.2f})" for n in names]
    return (f"the P0 state edited after the onset, the sink heads of {_blocks_said(blocks)} ({', '.join(heads[:6])}"
            f"{'...' if len(heads) > 6 else ''}; alpha_0 {clean.attention:.2f} clean, {u:.2f} under uniform attention) "
            f"keep this share of their excess attention to position 0: " + "; ".join(parts)
            + f" (clean loss {clean.loss:.2f} nats; a share of {keep:g} or more counts as kept)")
