"""Keyed on what: is a sink state made by its *position*, its *token*, or the *context* before it?

A high-norm state at some position can be built three ways. A model may recognise the position
itself (position 0 has nothing before it: the P0 circuit of Peng et al. 2026), the token that
stands there (a BOS token, or an ordinary token that a middle-layer MLP turns into a *secondary
sink*: "On the Existence and Behavior of Secondary Attention Sinks", ICLR 2026), or what comes
before it (the first comma after a clause). Patching one corruption cannot tell these apart: the
token swap removes a token-keyed state and a context-keyed one alike. :func:`keyed_on` separates
them with edits of prompts in which the state sits at one index ``at`` in every prompt, and
reads the state's *position norm ratio* (its residual norm over its prompt's median norm, after
block ``layer``) in each:

* **swapped**: the token at ``at`` replaced in place by a token drawn from the other positions of
  the prompts (position and context kept; never the token itself, its neighbours' tokens, which would
  make a position a copy of another, or the BOS token);
* **moved**: ``MOVE`` tokens of another prompt put in front (after a BOS token, which stays first,
  unless the state is the BOS token's own), so the token and everything before it move ``MOVE``
  places later; read at the token's new index (*follows*) and at the old index, which now holds
  another token (*stays*);
* **context replaced**: every position before ``at`` (a BOS token at 0 excepted) taken from a prompt
  that does *not* hold the state (``contexts``: the analysis passes windows of the passages where the
  class stands at ``at`` without being a sink state; taking them from prompts that hold it would bias
  the edit towards "kept"), the token and its index kept (not defined at position 0, which has no context);
* **copies** (at position 0 only, the control of what "position" means): ``MOVE`` copies of the first
  token put in front, read at the token's new index. Under rotary or no position encoding a position
  whose prefix is copies of one token computes exactly what position 0 computes, so a position-keyed
  state is kept there: *position* then means "no other token before it". A state keyed on an absolute
  position (a learned position embedding) is lost.

Each is a *kept share*, ``(ratio - 1) / (clean ratio - 1)`` prompt by prompt (an edit is compared with the same
prompt unedited: a mean over the batch would hide a state that moves from prompt to prompt with its context),
over the prompts where ``at`` is a sink state: its mean, its lowest prompt and the share of prompts that keep
it (:class:`Kept`). 1 keeps the whole excess norm, 0 none. An edit that changes nothing in a prompt (a
context equal to the prompt's own) is not counted for that prompt; an edit that changes nothing anywhere is
not measured. The verdict, with the keep line (:data:`~p0circuit.core.defaults.KEEPS` by default): **position**
when the state stays at its index with another token there and does not follow the token; **token** when it
follows the token, a swapped token loses it, and another context keeps it; **context** when another context
loses it and another token keeps it; **token and context** when either edit loses it; otherwise **mixed**, with
the numbers. With a BOS token at position 0 the swap is the no-BOS case again (a text token at position 0); what
the record says there is whether the state *follows BOS when moved*.
"""

import ast
import random
from typing import Any, Optional

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import above_one, entry_point
from p0circuit.core.defaults import KEEPS, NORM_THRESHOLD
from p0circuit.core.errors import BadInputError
from p0circuit.studies.findings import Kept, KeyedOn
from p0circuit.core.shares import share
from p0circuit.measures.positions import delimiter, position_ratios, token_text
from p0circuit.measures.spread import interval
from p0circuit.models.checks import check_block, check_model
from p0circuit.models.tokens import (
    bos_id, check_tokens, english_lines, p0_like_positions, prepend_id, probe_tokens, special_ids,
)

MOVE = 3
"""Tokens put in front of the prompt by the *moved* and *copies* edits."""
VERDICTS = ("position", "token", "context", "token and context", "mixed")
"""What a state can be keyed on (:func:`keyed_on`)."""
ABSOLUTE = ("standard", "learned")
"""TransformerLens' names of learned absolute position embeddings: where "position" can mean an absolute index."""


def sink_rows(model: Any, tokens: Tensor, at: int, layer: int, threshold: float = NORM_THRESHOLD) -> Tensor:
    """Which prompts of ``tokens`` hold a sink state at index ``at`` after block ``layer`` (position norm ratio at
    least ``threshold``): a boolean per prompt, from one forward up to ``layer``."""
    (ratio,) = _ratios(model, tokens, layer, torch.full((tokens.shape[0],), at))
    return ratio >= threshold


def _ratios(model: Any, tokens: Tensor, layer: int, *indices: Tensor, state: Optional[Tensor] = None) -> list[Tensor]:
    """Per prompt, the position norm ratio after block ``layer`` at each of ``indices`` (one index per prompt each),
    from one forward (``state``: that block's output for ``tokens``, held already: no forward)."""
    name = hooks.resid_post(layer)
    if state is None or tuple(state.shape[:2]) != tuple(tokens.shape):
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name, stop_at_layer=layer + 1)
        state = cache[name]
    ratios = position_ratios(state[None])[0]  # (B, T)
    rows = torch.arange(tokens.shape[0])
    return [ratios[rows, at].double() for at in indices]


def verdict_of(swapped: Optional[float], follows: Optional[float], stays: Optional[float], context: Optional[float],
               keep: float = KEEPS) -> str:
    """The verdict from the four kept shares (see the module docstring), with ``keep`` as the line."""
    keeps = lambda v: v is not None and v >= keep  # noqa: E731
    if keeps(stays) and not keeps(follows) and keeps(swapped):
        return "position"
    if keeps(follows) and not keeps(swapped) and (context is None or keeps(context)):
        return "token"
    if context is not None and not keeps(context) and keeps(swapped):
        return "context"
    if context is not None and not keeps(context) and not keeps(swapped):
        return "token and context"
    return "mixed"


def means_of(copies: Optional[float], pos_type: str, keep: float = KEEPS) -> str:
    """What *position* means, from the copies control's kept share (see :attr:`KeyedOn.means`)."""
    if copies is None:
        return ""
    if copies >= keep:
        return "no other token before it"
    return "the absolute position" if pos_type in ABSOLUTE else "position 0 itself"


def reading_of(verdict: str, means: str, bos_at_p0: bool, follows: float, keep: float = KEEPS) -> str:
    """The verdict in words: what a reader should take from it for this state."""
    if bos_at_p0:
        return (f"follows BOS when moved (keeps {follows:.2f} at BOS's new index)" if follows >= keep else
                f"stays at position 0 when BOS moves (keeps only {follows:.2f} at BOS's new index)")
    if verdict == "position" and means:
        return f"keyed on position ({means})"
    return f"keyed on {verdict}"


def _kept(value: Tensor, clean: Tensor, rows: Tensor, keep: float) -> Optional[Kept]:
    """The kept shares ``(value - 1) / (clean - 1)`` over ``rows`` (a boolean per prompt), or None for no row."""
    if not bool(rows.any()):
        return None
    per = ((value - 1) / (clean - 1))[rows]
    mean = float(per.mean())
    return Kept(mean=mean, min=float(per.min()), prompts_kept=float((per >= keep).double().mean()),
                n=int(rows.sum()), interval=list(interval([per])) if len(per) >= 2 else [mean, mean])


def _replacements(tokens: Tensor, at: int, avoid: set[int], seed: int) -> list[int]:
    """A token for index ``at`` of each prompt: drawn from the prompts' other positions, never the token there, its
    neighbours' tokens or the ids in ``avoid`` (a BOS id); refused when no such token exists."""
    pool = sorted({int(t) for t in tokens[:, 1:].flatten().tolist()} - avoid)
    pick = random.Random(seed)
    out = []
    for row in tokens.tolist():
        near = {row[i] for i in (at - 1, at, at + 1) if 0 <= i < len(row)}
        choices = [t for t in pool if t not in near]
        if not choices:
            raise BadInputError(f"keyed_on: the prompts hold no token to put at index {at} other than the one there and "
                                "its neighbours'; pass prompts with more distinct tokens")
        out.append(pick.choice(choices))
    return out


@entry_point
def keyed_on(model: Any, tokens: Tensor, at: int, layer: int, *, bos: bool, seed: int = 0,
             threshold: float = NORM_THRESHOLD, keep: float = KEEPS, contexts: Optional[Tensor] = None) -> KeyedOn:
    """Whether the sink state at index ``at`` of the prompts ``tokens`` (after block ``layer``) is keyed on its
    position, its token or the context before it (the module docstring says how), judged on the prompts where it
    is a sink state (position norm ratio at least ``threshold``, which must exceed 1; at least 2 needed), with
    ``keep`` as the line. ``bos``: whether the prompts start with a BOS token (it stays at position 0 when the
    context is replaced). ``contexts``: prompts of the same length that do not hold the state, whose positions
    before ``at`` replace the prompts' (None: the context edit is not measured). Up to five forwards up to
    ``layer``.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> p0.keyed_on(pm.model, tokens, 0, 1, bos=False).verdict   # the plant's P0 state, after block 1
        'position'
    """
    return _keyed_on(model, tokens, at, layer, bos=bos, seed=seed, threshold=threshold, keep=keep, contexts=contexts)


def _keyed_on(model: Any, tokens: Tensor, at: int, layer: int, *, bos: bool, seed: int = 0,
              threshold: float = NORM_THRESHOLD, keep: float = KEEPS, contexts: Optional[Tensor] = None,
              state: Optional[Tensor] = None) -> KeyedOn:
    """:func:`keyed_on`, with ``state``: the clean prompts' residual stream after block ``layer`` when the caller holds
    it already (the spread's cached clean run), so its forward is not run again."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    batch, seq = tokens.shape
    check_block(model, layer, "keyed_on")
    if batch < 2:
        raise BadInputError("keyed_on takes the moved and replaced tokens from other prompts: pass at least 2 prompts")
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < seq - 1:
        raise BadInputError(f"keyed_on: at={at!r} must index a position in 0..{seq - 2} (before the prompts' last, "
                            f"{seq - 1})")
    if seq < MOVE + 2:
        raise BadInputError(f"keyed_on puts {MOVE} tokens of another prompt in front: prompts of {seq} tokens hold fewer; "
                            f"pass prompts of at least {MOVE + 2} tokens")
    if at + MOVE >= model.cfg.n_ctx:
        raise BadInputError(f"keyed_on moves the token {MOVE} places later: at={at} needs a context of more than "
                            f"{at + MOVE} positions, and this model's is {model.cfg.n_ctx}")
    above_one("keyed_on", "threshold", threshold)
    if not 0 < keep < 1:
        raise BadInputError(f"keyed_on: keep={keep!r} must lie strictly between 0 and 1 (a kept share's line)")
    start = 1 if bos else 0
    if contexts is not None:
        contexts = check_tokens(model, contexts, min_len=2, bos=bos, what="contexts")
        if contexts.shape[1] != seq:
            raise BadInputError(f"keyed_on: contexts have {contexts.shape[1]} tokens, the prompts {seq}: pass windows of "
                                "the same length")
    here = torch.full((batch,), at)
    (clean,) = _ratios(model, tokens, layer, here, state=state)
    sink = clean >= threshold
    if int(sink.sum()) < 2:
        raise BadInputError(f"keyed_on: position {at} is a sink state (position norm ratio >= {threshold:g}) after block "
                            f"{layer} in {int(sink.sum())} of {batch} prompts (ratios "
                            f"{[round(float(c), 2) for c in clean]}); at least 2 are needed")
    other = tokens.roll(1, dims=0)  # another prompt for each prompt (its values are compared prompt by prompt)
    avoid = set(special_ids(model)) | ({prepend_id(model)} if bos else set()) | ({bos_id(model)} - {None})
    swapped_tokens = tokens.clone()
    swapped_tokens[:, at] = torch.tensor(_replacements(tokens, at, avoid, seed), device=tokens.device)
    swapped = _kept(*_ratios(model, swapped_tokens, layer, here), clean, sink & (swapped_tokens[:, at] != tokens[:, at]),
                    keep)

    # the tokens go in after a BOS token (it stays first, as the context edit keeps it), unless the state is the BOS's
    cut = 1 if bos and at > 0 else 0
    inserted = other[:, 1:1 + MOVE]
    moved_tokens = torch.cat([tokens[:, :cut], inserted, tokens[:, cut:]], dim=1)[:, :model.cfg.n_ctx]
    follows_r, stays_r = _ratios(model, moved_tokens, layer, here + MOVE, here)
    # each read counts only where the edit did what it claims: the token at its new index, another token at the old
    follows = _kept(follows_r, clean, sink & (moved_tokens[:, at + MOVE] == tokens[:, at]), keep)
    stays = _kept(stays_r, clean, sink & (moved_tokens[:, at] != tokens[:, at]), keep)

    context, note = None, ""
    if at <= start:
        note = "not defined: " + ("only the BOS token stands" if at == start == 1 else "nothing stands") + \
            " before the state"
    elif contexts is None:
        note = "not measured: no prompts without the state were given to take contexts from"
    else:
        pool = contexts[torch.arange(batch) % contexts.shape[0]]
        ctx_tokens = tokens.clone()
        ctx_tokens[:, start:at] = pool[:, start:at]
        changed = (ctx_tokens != tokens).any(1)
        context = _kept(*_ratios(model, ctx_tokens, layer, here), clean, sink & changed, keep)
        note = (f"from {contexts.shape[0]} prompt(s) without the state" + (
            "" if context is not None else "; not measured: every context taken equals the prompt's own"))

    copies = None
    if at == 0:
        copy_tokens = torch.cat([tokens[:, :1].expand(batch, MOVE), tokens], dim=1)[:, :model.cfg.n_ctx]
        (copies_r,) = _ratios(model, copy_tokens, layer, here + MOVE)
        copies = _kept(copies_r, clean, sink, keep)
    if swapped is None or follows is None or stays is None:  # no prompt where both the state and the edit hold
        raise BadInputError(f"keyed_on: in the prompts where position {at} is a sink state, the edits change nothing "
                            f"at index {at} (another prompt's tokens put in front leave the same token there): pass "
                            "prompts that differ from each other")
    verdict = verdict_of(swapped.mean, follows.mean, stays.mean, None if context is None else context.mean, keep)
    means = means_of(None if copies is None else copies.mean, str(model.cfg.positional_embedding_type), keep) \
        if verdict == "position" else ""
    reading = reading_of(verdict, means, bos and at == 0, follows.mean, keep)
    n = int(sink.sum())

    def said(k: Kept) -> str:
        return f"{share(k.mean)} (lowest prompt {k.min:.2f}, {k.prompts_kept:.0%} of prompts keep it)"

    evidence = (f"after block {layer}, in the {n} of {batch} prompts where position {at} is a sink state (position "
                f"norm ratio, its norm over the prompt's median norm, {float(clean[sink].mean()):.3g} there, lowest "
                f"{float(clean[sink].min()):.3g}, at least {threshold:g}), the state keeps {said(swapped)} of its excess "
                f"norm with its token replaced in place, {said(follows)} at the token's new place when {MOVE} tokens "
                "are put in front of it" + (" (after the BOS token)" if cut else "") + f" (and {said(stays)} at the old "
                "place, another token there)" + ("" if context is None else f", {said(context)} with the context before "
                f"it from a prompt without the state") + ("" if copies is None else f", and {said(copies)} after {MOVE} "
                "copies of its own token") + f" (a share of {keep:g} or more counts as kept)")
    return KeyedOn(at=at, layer=layer, prompts=n, of=batch, clean=float(clean[sink].mean()),
                   clean_min=float(clean[sink].min()), swapped=swapped, follows=follows, stays=stays, context=context,
                   context_note=note, copies=copies, keep=keep, verdict=verdict, means=means, reading=reading,
                   evidence=evidence)


def target_of(where: str, tokens: tuple = ()) -> Optional[tuple[str, str]]:
    """A sink class of the sink report (``where``, with its commonest ``tokens``) as what :func:`aligned_prompts`
    looks for: ``("first", ",")``, ``("later", ",")`` or ``("token", " the")``; None for P0 and a later BOS."""
    if where.startswith(("first ", "later ")):
        kind, quoted = where.split(" ", 1)
        return kind, ast.literal_eval(quoted)  # the class names its delimiter as repr() writes it
    if where == "other" and tokens:
        return "token", tokens[0][0]
    return None


def _planted_aligned(model: Any, want: int, n: int, text: int, index: int, first: Optional[int], seed: int) -> Tensor:
    """``n`` regular random prompts of ``text`` tokens holding ``want`` at ``index`` and nowhere else (every other
    occurrence redrawn from the ids that are neither it nor the BOS id), with the token ``first`` put in front (None:
    none); rows that a redraw made irregular (a position a copy of position 0) are drawn again."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(model.cfg.d_vocab) if i not in {want, bos_id(model)}])
    rows: list[Tensor] = []
    for _ in range(100):
        toks = probe_tokens(model, n, text, seed=gen, regular=True)
        hit = toks == want
        toks[hit] = allowed[torch.randint(0, len(allowed), (int(hit.sum()),), generator=gen)].to(toks.device)
        toks[:, index] = want
        rows += list(toks[~p0_like_positions(toks)[:, 1:].any(1)])
        if len(rows) >= n:
            break
    out = torch.stack(rows[:n])
    if first is not None:
        out = torch.cat([torch.full((n, 1), first, dtype=out.dtype, device=out.device), out], 1)
    return out


def _matches(kind: str, value: str, texts: list[str], i: int, start: int) -> bool:
    """Whether the token at ``i`` of a window beginning at ``start`` is the class (``texts``: the stream's tokens)."""
    if kind == "token":
        return texts[i] == value
    if delimiter(texts[i]) != value:
        return False
    earlier = any(delimiter(texts[j]) == value for j in range(start, i))
    return earlier if kind == "later" else not earlier


@entry_point
def aligned_prompts(model: Any, target: tuple[str, str], n: int, length: int, at: int, *, bos: bool,
                    seed: int = 0) -> Tensor:
    """Up to ``n`` prompts of ``length`` tokens (a BOS token first when ``bos``) in which the sink class ``target``
    (:func:`target_of`) stands at index ``at``: windows of the shipped English passages, run together, that put an
    occurrence there (distinct windows, picked in an order shuffled by ``seed``). A model without a tokenizer
    (a planted one) gets random regular prompts with token ``#id`` put at ``at`` and nowhere else."""
    kind, value = target
    text = length - int(bos)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"aligned_prompts: n must be a whole number >= 1, got {n!r}")
    if length > model.cfg.n_ctx:
        raise BadInputError(f"aligned_prompts: length {length} exceeds the model's context of {model.cfg.n_ctx} positions")
    if not 0 < at < length - 1:
        raise BadInputError(f"aligned_prompts: at={at} must lie inside the prompt, after position 0 and before its "
                            f"last ({length - 1})")
    if getattr(model, "tokenizer", None) is None:
        if kind != "token" or not value.startswith("#") or not value[1:].isdigit():
            raise BadInputError(f"aligned_prompts: a model without a tokenizer knows tokens as '#id', not {target!r}")
        want = int(value[1:])
        if want >= model.cfg.d_vocab or want == bos_id(model):
            raise BadInputError(f"aligned_prompts: token {value!r} is not an ordinary id of this model's vocabulary "
                                f"(0..{model.cfg.d_vocab - 1}, the BOS id excepted)")
        return _planted_aligned(model, want, n, text, at - int(bos), prepend_id(model) if bos else None, seed)
    ids = list(model.tokenizer(" ".join(english_lines()), add_special_tokens=False)["input_ids"])
    read = token_text(model)
    texts = [read(i) for i in ids]
    offset = at - int(bos)  # the target's index among the text tokens
    starts = [i - offset for i in range(offset, len(ids) - (text - offset))
              if _matches(kind, value, texts, i, i - offset + (0 if bos else 1))]
    random.Random(seed).shuffle(starts)
    chosen: list[int] = []
    for s in starts:  # windows that do not overlap
        if all(abs(s - c) >= text for c in chosen):
            chosen.append(s)
        if len(chosen) == n:
            break
    if len(chosen) < min(n, 2):  # every window was tried: the passages hold no more (one is enough when one is asked)
        need = "1 is" if n == 1 else "2 are"
        raise BadInputError(f"aligned_prompts: the shipped passages hold {len(chosen)} window(s) of {length} tokens with "
                            f"{kind} {value!r} at index {at} that do not overlap, and {need} needed (ask for another "
                            "index or length, or pass prompts of your own)")
    rows = [ids[s:s + text] for s in sorted(chosen)]
    if bos:
        rows = [[prepend_id(model)] + r for r in rows]
    return torch.tensor(rows, dtype=torch.long, device=model.cfg.device)
