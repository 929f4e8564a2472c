"""Sinks wherever they sit: which positions of a prompt become high-norm, high-attention states.

A model trained with a BOS token can build its sink on that token rather than on position 0, and
without the token it may put the high norm somewhere else entirely (Gemma 3 270M puts it on the
prompt's first comma after block 0). So the sink report names, per layer, every position whose
residual norm stands out from its own prompt, by *position class*:

* ``"P0"`` (the first position; ``"P0 (BOS)"`` when it holds the model's BOS token),
* ``"BOS"`` (a BOS token later in the prompt),
* ``"first ','"``, ``"later ','"`` for delimiters (comma, full stop, newline, colon, semicolon,
  question and exclamation marks, ...), by their first and later occurrences in the prompt,
* ``"other"`` for anything else.

A position is a sink state at a layer when ``||h_t|| / median_s ||h_s||`` of its prompt (the
*position norm ratio*) is at least the report's threshold. Each class is summarised by the share
of prompts where it is one, its mean ratio there, and the mean attention it receives from the
queries after it (over every head), and the strongest head's mean attention to it.

:func:`find_positions` turns a class name (``"p0"``, ``"bos"``, ``"first:,"``, ``"first:\\n"`` or an
index) into one position per prompt, so metrics can be read there (``NormRatio(layer, pos=...)``).
"""

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from p0circuit.core.defaults import SINK_EPS
from p0circuit.core.errors import BadInputError, ConfigError

DELIMITERS = (",", ".", "\n", ";", ":", "?", "!", "-", "(", ")", '"', "'")
"""Characters whose tokens are classed as delimiters (a token counts when, stripped of spaces and
tokenizer markers, it is one of them)."""

_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}


def token_text(model: Any) -> Callable[[int], str]:
    """``id -> text`` for ``model``'s tokenizer (byte-level and sentencepiece markers read as the
    characters they stand for); ids shown as ``"#id"`` when the model has none."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return lambda i: f"#{i}"
    cache: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in cache:
            raw = tok.convert_ids_to_tokens([int(i)])[0] or ""
            cache[i] = "".join(_MARKERS.get(c, c) for c in str(raw))
        return cache[i]

    return text


def delimiter(text: str) -> Optional[str]:
    """The delimiter a token's text stands for (``" ,"`` -> ``","``, ``"\\n\\n"`` -> ``"\\n"``), or None."""
    core = text.strip(" \t")
    if not core:
        return None
    if set(core) == {"\n"}:
        return "\n"
    return core if core in DELIMITERS else None


def classify(tokens: Tensor, text: Callable[[int], str], bos: Optional[int]) -> list[list[str]]:
    """The position class of every position of every prompt (see the module docstring)."""
    out = []
    for row in tokens.tolist():
        seen: set[str] = set()
        classes = []
        for t, tok in enumerate(row):
            if t == 0:
                classes.append("P0 (BOS)" if bos is not None and tok == bos else "P0")
                continue
            if bos is not None and tok == bos:
                classes.append("BOS")
                continue
            d = delimiter(text(tok))
            if d is None:
                classes.append("other")
            else:
                classes.append(("later " if d in seen else "first ") + repr(d))
                seen.add(d)
        out.append(classes)
    return out


@dataclass(frozen=True)
class SinkPosition:
    """One position class that is a sink state at one layer."""

    layer: int
    """Block whose output is measured."""
    where: str
    """The position class (``"P0"``, ``"first ','"``, ...)."""
    share: float
    """Share of prompts in which a position of this class is a sink state."""
    ratio: float
    """Mean position norm ratio of those positions."""
    attention: float
    """Mean attention they receive from the queries after them in the next block, the first to read the state (all
    heads, all prompts with one; the last block's own heads for a state after the last block)."""
    max_head_attention: float
    """The strongest head's mean attention to them (the same block)."""
    positions: tuple[int, ...]
    """The indices at which they sat (distinct, sorted)."""
    tokens: tuple[tuple[str, int], ...] = ()
    """The commonest tokens at those positions, with their counts (most common first, at most 5)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {"layer": self.layer, "where": self.where, "share": self.share, "ratio": self.ratio,
                "attention": self.attention, "max_head_attention": self.max_head_attention,
                "positions": list(self.positions), "tokens": [list(t) for t in self.tokens]}


MIN_SHARE = 0.25
"""Share of the prompts in which a position class must be a sink state for the sink report to list it."""


def state_name(max_head_attention: float, eps: float = SINK_EPS) -> str:
    """What a high-norm state is called: a *sink* where some head gives it a mean attention above ``eps`` (it is
    attended to), a *massive-norm state* otherwise (large, but nothing attends to it)."""
    return "sink" if max_head_attention > eps else "massive-norm state"


def position_ratios(resid: Tensor) -> Tensor:
    """``||h_t|| / median_s ||h_s||`` per (layer, prompt, position) of ``resid`` ``[L, B, T, d]``."""
    norms = resid.float().norm(dim=-1)
    med = norms.median(dim=-1, keepdim=True).values
    return norms / med.clamp_min(1e-12)


def sink_positions(
    resid: Tensor, patterns: Tensor, classes: Sequence[Sequence[str]], threshold: float, min_share: float = MIN_SHARE,
    texts: Optional[Sequence[Sequence[str]]] = None,
) -> list[SinkPosition]:
    """Every (layer, position class) that is a sink state in at least ``min_share`` of the prompts.

    ``resid``: ``[L, B, T, d]`` block outputs; ``patterns``: ``[L, B, H, T, T]``; ``classes`` (and
    optionally the token ``texts``): per prompt, per position (:func:`classify`)."""
    ratios = position_ratios(resid)  # (L, B, T)
    n_layers, batch, seq = ratios.shape
    # attention received by each key position from the queries after it, per head: (L, B, H, T)
    later = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=patterns.device), -1)  # q > k
    counts = later.sum(0).clamp_min(1)  # queries after each key
    received = (patterns.float() * later).sum(-2) / counts
    names = sorted({c for row in classes for c in row})
    found = []
    for layer in range(n_layers):
        hit = ratios[layer] >= threshold  # (B, T)
        for name in names:
            mask = torch.tensor([[c == name for c in row] for row in classes], device=hit.device)
            rows_with = mask.any(1)
            sink = hit & mask & (torch.arange(seq, device=hit.device) < seq - 1)  # a last position receives nothing
            rows_hit = sink.any(1)
            if not rows_with.any() or float(rows_hit.sum()) < min_share * batch:
                continue
            reader = min(layer + 1, n_layers - 1)  # block L's output is first read by block L + 1's attention
            att = received[reader].permute(0, 2, 1)[sink]  # (n, H)
            where_hit = torch.nonzero(sink).tolist()
            common = Counter(texts[b][t] for b, t in where_hit).most_common(5) if texts is not None else []
            found.append(SinkPosition(
                layer=layer, where=name, share=float(rows_hit.float().mean()), ratio=float(ratios[layer][sink].mean()),
                attention=float(att.mean()), max_head_attention=float(att.mean(0).max()),
                positions=tuple(sorted({int(t) for _, t in where_hit})), tokens=tuple(common)))
    return found


PositionSpec = Union[int, str]
"""A position: an index, or ``"p0"``, ``"bos"``, ``"first:<delimiter>"`` (e.g. ``"first:,"``)."""


def check_position_spec(owner: str, where: str) -> str:
    """``where`` when it is one of the position classes :data:`PositionSpec` names (``"p0"``, ``"bos"``,
    ``"first:<delimiter>"``), else a :class:`~p0circuit.core.errors.ConfigError` naming ``owner`` and the choices."""
    if where in ("p0", "bos") or (where.startswith("first:") and len(where) > len("first:")):
        return where
    raise ConfigError(f"{owner}.position={where!r} is not a position: use an index, 'p0', 'bos' or 'first:<delimiter>' "
                      "(e.g. 'first:,' for each prompt's first comma)")


def find_positions(model: Any, tokens: Tensor, where: PositionSpec, bos: Optional[int] = None) -> tuple[int, ...]:
    """One position per prompt of ``tokens`` for ``where`` (see :data:`PositionSpec`), or a clear
    error naming the prompts that lack it."""
    batch, seq = tokens.shape
    if isinstance(where, int) and not isinstance(where, bool):
        if not 0 <= where < seq:
            raise BadInputError(f"position {where} is outside prompts of length {seq}")
        return (where,) * batch
    if not isinstance(where, str):
        raise BadInputError(f"a position is an index or 'p0', 'bos', 'first:<delimiter>'; got {where!r}")
    if where == "p0":
        return (0,) * batch
    if where == "bos":
        if bos is None:
            raise BadInputError("position 'bos' needs the model's BOS id (p0circuit.set_bos or a tokenizer BOS)")
        target: Callable[[int], bool] = lambda tok: tok == bos  # noqa: E731
    elif where.startswith("first:") and len(where) > len("first:"):
        want = where[len("first:"):].replace("\\n", "\n")
        text = token_text(model)
        target = lambda tok: delimiter(text(tok)) == want  # noqa: E731
    else:
        raise BadInputError(f"position {where!r} not understood; use an index, 'p0', 'bos' or 'first:<delimiter>' "
                            "(e.g. 'first:,' for each prompt's first comma)")
    out, missing = [], []
    for b, row in enumerate(tokens.tolist()):
        first = 0 if where == "bos" else 1  # a delimiter class starts after P0; a BOS may stand at P0
        hits = [t for t, tok in enumerate(row) if t >= first and target(tok)]
        if not hits:
            missing.append(b)
        else:
            out.append(hits[0])
    if missing:
        raise BadInputError(f"{len(missing)} of {batch} prompts (e.g. row {missing[0]}) have no {where!r} position; "
                            "choose prompts that all have one")
    return tuple(out)
