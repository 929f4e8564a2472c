"""Turning text into tokens with an explicit BOS choice, and checking token tensors.

TransformerLens prepends BOS by default. The P0 sink is about what sits at position 0, so in
p0circuit no entry point decides that silently: ``prepend_bos`` is a required keyword.
"""

from typing import Any, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.errors import BadInputError


def to_tokens(model: HookedTransformer, text: Union[str, Sequence[str]], *, prepend_bos: Any) -> Tensor:
    """Tokenize ``text`` with the model's tokenizer; ``prepend_bos`` must be given.

    ``prepend_bos`` must be a bool; it is annotated loosely so that a wrong value gets the message
    below rather than a type-checker error. The tokenizer's own special tokens are never added: with ``prepend_bos=True`` exactly one
    BOS id is put at position 0, with ``False`` position 0 holds the first token of the text.
    """
    if not isinstance(prepend_bos, bool):
        raise BadInputError(
            f"prepend_bos must be True or False, got {prepend_bos!r}: p0circuit never picks the "
            "BOS choice for you, since it decides what sits at position 0"
        )
    if model.tokenizer is None:
        raise BadInputError(
            "this model has no tokenizer (built from a spec or planted weights): pass token ids "
            "as a LongTensor [batch, pos] instead of text"
        )
    if isinstance(text, str):
        text = [text]
    if len(text) == 0:
        raise BadInputError("no text given: pass at least one non-empty string")
    if any(len(t) == 0 for t in text):
        raise BadInputError("empty string in the prompts: every prompt needs at least one token")
    tok = model.tokenizer
    ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in text]
    if prepend_bos:
        if tok.bos_token_id is None:
            raise BadInputError("this tokenizer has no BOS token; use prepend_bos=False")
        ids = [[tok.bos_token_id] + row for row in ids]
    lengths = sorted({len(row) for row in ids})
    if len(lengths) > 1:
        raise BadInputError(
            f"prompts tokenize to different lengths {lengths}; sink metrics need prompts of equal "
            "length (padding would change what sits at each position): group prompts by length "
            "or truncate them"
        )
    if lengths[0] == 0:
        raise BadInputError("a prompt tokenized to no tokens; every prompt needs at least one token")
    tokens = torch.tensor(ids, dtype=torch.long, device=model.cfg.device)
    return tokens


def check_tokens(
    model: HookedTransformer, tokens: Any, *, min_len: int = 1, what: str = "tokens"
) -> Int[Tensor, "batch pos"]:
    """Validate a token tensor for ``model`` and return it as ``[batch, pos]`` on its device."""
    if not isinstance(tokens, Tensor):
        raise BadInputError(
            f"{what} must be a torch LongTensor [batch, pos], got {type(tokens).__name__}; "
            "use p0circuit.to_tokens(model, text, prepend_bos=...) for text"
        )
    if tokens.dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.bool):
        raise BadInputError(f"{what} must hold integer token ids, got dtype {tokens.dtype}; use .long()")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise BadInputError(f"{what} must be 2-D [batch, pos], got shape {tuple(tokens.shape)}")
    if tokens.shape[0] == 0:
        raise BadInputError(f"{what} is an empty batch (shape {tuple(tokens.shape)}): pass at least one prompt")
    if tokens.shape[1] < min_len:
        raise BadInputError(
            f"{what} has sequence length {tokens.shape[1]} but this needs at least {min_len} "
            f"positions (position 0 is compared with positions t > 0); use longer prompts"
        )
    n_ctx = model.cfg.n_ctx
    if tokens.shape[1] > n_ctx:
        raise BadInputError(f"{what} has length {tokens.shape[1]} > the model's n_ctx={n_ctx}; truncate the prompts")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.d_vocab:
        raise BadInputError(
            f"{what} holds ids out of the vocabulary: range [{lo}, {hi}] but d_vocab="
            f"{model.cfg.d_vocab} allows 0..{model.cfg.d_vocab - 1}; check the tokenizer matches the model"
        )
    return tokens.long().to(model.cfg.device)
