"""Attention-pattern views with circuitsvis that work offline.

circuitsvis' rendered objects decide between a CDN script and the bundled one by probing the
network (``internet_on()`` opens http://google.com) whenever a notebook displays them. p0circuit
always uses the self-contained form (``local_src``): nothing is fetched and nothing is probed.
"""

import re
from typing import Any, Optional, Sequence

import circuitsvis as cv
import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.models.tokens import check_tokens
from p0circuit.core.args import entry_point


@entry_point
def attention_html(
    model: Any, tokens: Tensor, layer: int, prompt: int = 0, labels: Optional[Sequence[str]] = None
) -> str:
    """Self-contained HTML of every head's attention pattern in ``layer`` for one prompt."""
    tokens = check_tokens(model, tokens)
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer {layer} is outside 0..{model.cfg.n_layers - 1}")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[prompt : prompt + 1], names_filter=hooks.pattern(layer))
    pattern = cache[hooks.pattern(layer)][0]  # (H, T, T)
    if labels is None:
        ids = tokens[prompt].tolist()
        if model.tokenizer is not None:
            labels = [f"{i}:{model.tokenizer.decode([t])}" for i, t in enumerate(ids)]
        else:
            labels = [f"{i}:{t}" for i, t in enumerate(ids)]
    rendered = cv.attention.attention_patterns(
        tokens=list(labels), attention=pattern
    )
    # circuitsvis writes its mount point as a self-closing <div .../>, which HTML parses as an
    # open div: the component would then replace everything after it on a page. Close it.
    return re.sub(r"^(\s*<div [^>]*?)\s*/>", r"\1></div>", rendered.local_src, count=1)


@entry_point
def show_attention(model: Any, tokens: Tensor, layer: int, prompt: int = 0) -> Any:
    """An ``IPython.display.HTML`` of :func:`attention_html`, for notebooks."""
    from IPython.display import HTML  # only notebooks have IPython; attention_html needs none

    return HTML(attention_html(model, tokens, layer, prompt))


@entry_point
def save_attention_html(path: str, model: Any, tokens: Tensor, layer: int, prompt: int = 0) -> None:
    """Write :func:`attention_html` to ``path`` (opens with no network)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{attention_html(model, tokens, layer, prompt)}</body></html>")
