"""Special tokens in the middle of a prompt: do a model's own start, end-of-text and chat tokens become sinks there?

A model trained with a start token at position 0 may make that token a high-norm state wherever it stands; a
model trained on documents joined by an end-of-text token sees that token mid-sequence in training, and an
instruction-tuned model sees its chat tokens there. :func:`special_tokens` puts each of the tokenizer's start,
end-of-text and chat tokens (:func:`candidates`) at one index in the middle of every prompt (in place of the
token there) and reads, after every block, its position norm ratio (its norm over the prompt's median norm) and,
at its peak, the attention the queries after it give it in the next block (the first to read that state): a high-norm state that some head attends to above
``eps`` is called a *sink*, one that none does a *massive-norm state*
(:func:`p0circuit.measures.positions.state_name`).
"""

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import above_one, entry_point
from p0circuit.core.defaults import NORM_THRESHOLD, SINK_EPS
from p0circuit.core.errors import BadInputError
from p0circuit.measures.positions import position_ratios, state_name, token_text
from p0circuit.models.checks import check_model
from p0circuit.models.tokens import BOS_ATTR, check_tokens
from p0circuit.studies.findings import SpecialToken

NAMED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<|begin_of_text|>",
         "<|eot_id|>", "<|end_of_text|>")
"""Start, end-of-text and chat tokens by name (GPT-2 and Qwen, ChatML, Gemma, Llama 3), tested where the vocabulary
holds them."""
MOST = 6
"""Special tokens tested at most."""


def candidates(model: Any) -> list[int]:
    """The token the analysis prepends as BOS (where set), the tokenizer's start and end tokens, the tokens of
    :data:`NAMED` its vocabulary holds, then its unknown and padding tokens: at most :data:`MOST`, each once."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return []
    start = getattr(model, BOS_ATTR, None)
    ids = [start] + [getattr(tok, f"{k}_token_id", None) for k in ("bos", "eos")]
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    ids += [vocab.get(name) for name in NAMED]
    ids += [getattr(tok, f"{k}_token_id", None) for k in ("unk", "pad")]
    out: list[int] = []
    for i in ids:
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < model.cfg.d_vocab and i not in out:
            out.append(i)
    return out[:MOST]


@entry_point
def special_tokens(model: Any, tokens: Tensor, *, bos: bool, ids: Optional[Sequence[int]] = None,
                   at: Optional[int] = None, threshold: float = NORM_THRESHOLD, eps: float = SINK_EPS
                   ) -> list[SpecialToken]:
    """Each of ``ids`` (default: :func:`candidates`) at index ``at`` (default: the middle) of every prompt, as the
    module docstring says; ``bos``: the prompts' BOS choice. One forward of the prompts per token, stacked."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=3, bos=bos)
    batch, seq = tokens.shape
    at = seq // 2 if at is None else at
    if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at < seq - 1:
        raise BadInputError(f"special_tokens: at={at!r} must lie in 1..{seq - 2} (inside the prompt, with queries after "
                            "it)")
    above_one("special_tokens", "threshold", threshold)
    ids = candidates(model) if ids is None else list(ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < model.cfg.d_vocab]
    if bad:
        raise BadInputError(f"special_tokens: ids {bad[:3]} are not ids of this model's vocabulary (0..{model.cfg.d_vocab - 1})")
    if not ids:
        return []
    edited = tokens.repeat(len(ids), 1)
    edited[:, at] = torch.tensor(ids, device=tokens.device).repeat_interleave(batch)
    names = {hooks.resid_post(l) for l in range(model.cfg.n_layers)} | {hooks.pattern(l) for l in range(model.cfg.n_layers)}
    with torch.no_grad():
        _, cache = model.run_with_cache(edited, names_filter=lambda n: n in names,
                                        stop_at_layer=model.cfg.n_layers)  # every block, no logits
    resid = torch.stack([cache[hooks.resid_post(l)] for l in range(model.cfg.n_layers)])  # (L, k*B, T, d)
    ratios = position_ratios(resid)[:, :, at].reshape(model.cfg.n_layers, len(ids), batch).mean(-1)  # (L, k)
    text = token_text(model)
    out = []
    for i, token in enumerate(ids):
        peak = int(ratios[:, i].argmax())
        rows = slice(i * batch, (i + 1) * batch)
        reader = min(peak + 1, model.cfg.n_layers - 1)  # the block that first reads the state at the peak
        pat = cache[hooks.pattern(reader)][rows, :, at + 1:, at].float()  # (B, H, queries after it)
        heads = pat.mean((0, 2))  # (H,)
        first = next((l for l in range(model.cfg.n_layers) if float(ratios[l, i]) >= threshold), None)
        out.append(SpecialToken(id=token, text=text(token), at=at, first_block=first, peak=float(ratios[peak, i]),
                                peak_block=peak, attention=float(heads.mean()), max_head_attention=float(heads.max()),
                                called=state_name(float(heads.max()), eps) if first is not None else "ordinary"))
    return out
