"""Turning text into tokens with an explicit BOS choice, and checking token tensors.

TransformerLens prepends BOS by default. The P0 sink is about what sits at position 0, so in
p0circuit no entry point decides that silently: ``prepend_bos`` is a required keyword.
"""

from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple, Optional, Sequence, Union

import torch
from jaxtyping import Bool, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core.entries import PROMPT_SOURCES
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point

BOS_ATTR = "p0circuit_bos_id"
"""Attribute set on models that have a BOS id but no tokenizer (BOS-keyed plants, models trained
with a BOS token); :func:`bos_id` reads it before the tokenizer's."""


def bos_id(model: HookedTransformer) -> Optional[int]:
    """The model's BOS token id: the ``p0circuit_bos_id`` attribute, else the tokenizer's, else None."""
    value = getattr(model, BOS_ATTR, None)
    if value is None and getattr(model, "tokenizer", None) is not None:
        value = model.tokenizer.bos_token_id
    return None if value is None else int(value)


START_OF_TEXT = ("<s>", "<bos>", "<|begin_of_text|>", "<|endoftext|>", "<|startoftext|>", "<BOS>", "[BOS]")
"""Tokenizer BOS strings p0circuit accepts as a start-of-text token without being told."""


def _token_id(model: HookedTransformer, token: Union[str, int], where: str) -> int:
    """The id of ``token`` (a token string of the model's tokenizer, or an id inside its vocabulary)."""
    if isinstance(token, bool) or not isinstance(token, (str, int)):
        raise BadInputError(f"{where}: token must be a token string or id, got {token!r}")
    if isinstance(token, str):
        if model.tokenizer is None:
            raise BadInputError(f"{where}: this model has no tokenizer; pass the token id instead of a string")
        ids = model.tokenizer.convert_tokens_to_ids([token])
        if not ids or ids[0] is None or (model.tokenizer.unk_token_id is not None and ids[0] == model.tokenizer.unk_token_id
                                         and token != model.tokenizer.unk_token):
            raise BadInputError(f"{where}: {token!r} is not a token of this tokenizer")
        token = int(ids[0])
    if not 0 <= token < model.cfg.d_vocab:
        raise BadInputError(f"{where}: id {token} is outside the vocabulary 0..{model.cfg.d_vocab - 1}")
    return int(token)


@entry_point
def set_bos(model: HookedTransformer, token: Union[str, int]) -> int:
    """Say which token ``prepend_bos=True`` puts at position 0 of ``model`` (a token string or id);
    returns its id. Needed when the tokenizer's ``bos_token`` is not a start-of-text token, e.g.
    SmolLM2's ``<|im_start|>`` (a chat-turn marker; its documents were separated by
    ``<|endoftext|>``), or to choose another start token on purpose."""
    token = _token_id(model, token, "set_bos")
    setattr(model, BOS_ATTR, token)
    return token


@entry_point
def bos_label(model: HookedTransformer, token: Optional[Union[str, int]] = None) -> str:
    """The BOS token in words, e.g. ``"BOS '<|endoftext|>' (id 0)"``: ``token`` (a token string or id) when
    given, else what ``prepend_bos=True`` prepends (:func:`set_bos`'s choice, else the tokenizer's BOS);
    ``"no BOS id"`` when there is none.

    Without ``token`` it describes the model as it stands. A run that prepends another token names that
    one: :func:`p0circuit.analyze` on a model entry prepends the entry's start token when the
    tokenizer's BOS is not a start-of-text token (``real:smollm2``: ``'<|endoftext|>'``, id 0, while its
    tokenizer's ``bos_token`` is the chat marker ``'<|im_start|>'``, id 1), so its with-BOS run is named
    by ``bos_label(model, "<|endoftext|>")`` (the analysis' record names the token it actually
    prepends). A tokenizer BOS that ``prepend_bos=True`` would refuse (no start-of-text token, and no
    :func:`set_bos`) is labelled as such."""
    if token is not None:
        bid = _token_id(model, token, "bos_label")
    else:
        bid = bos_id(model)
        if bid is None:
            return "no BOS id"
    tok = getattr(model, "tokenizer", None)
    text = tok.convert_ids_to_tokens([bid])[0] if tok is not None else None
    label = f"BOS {text!r} (id {bid})" if text is not None else f"BOS id {bid}"
    if token is None and getattr(model, BOS_ATTR, None) is None and tok is not None and tok.bos_token not in START_OF_TEXT:
        label += (" (the tokenizer's bos_token, not a start-of-text token: prepend_bos=True refuses it until "
                  "p0circuit.set_bos(model, token) chooses one)")
    return label


def prepend_id(model: HookedTransformer) -> int:
    """The id ``prepend_bos=True`` / ``bos=True`` puts at position 0, refusing a tokenizer BOS that
    is not a start-of-text token (see :data:`START_OF_TEXT`) unless :func:`set_bos` chose it."""
    bid = bos_id(model)
    if bid is None:
        raise BadInputError("this model has no BOS token (no tokenizer BOS, no set_bos); use prepend_bos=False, "
                            "or choose one with p0circuit.set_bos(model, token)")
    if getattr(model, BOS_ATTR, None) is None:
        text = model.tokenizer.bos_token
        if text not in START_OF_TEXT:
            raise BadInputError(
                f"this tokenizer's bos_token is {text!r} (id {bid}), which is not a start-of-text token "
                f"(accepted: {', '.join(START_OF_TEXT)}); prepending it would measure a sink on that marker. "
                f"Say which token to prepend: p0circuit.set_bos(model, {text!r}) to use it anyway, or another "
                "start token, e.g. p0circuit.set_bos(model, '<|endoftext|>')")
    return bid


def special_ids(model: HookedTransformer) -> list[int]:
    """The ids the model's tokenizer treats as special (its BOS, end-of-text, padding and chat tokens, and any
    added special token), within the vocabulary, in id order; none without a tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return []
    ids = set(getattr(tok, "all_special_ids", None) or [])
    ids |= {i for i, t in (getattr(tok, "added_tokens_decoder", None) or {}).items() if getattr(t, "special", False)}
    return sorted(int(i) for i in ids if 0 <= int(i) < model.cfg.d_vocab)


def avoid_ids(tokens: Tensor, ids: Sequence[int], vocab: int) -> Tensor:
    """Replace every occurrence of ``ids`` (e.g. a BOS id) in random probe tokens by the next id that is none of
    them, in place."""
    banned = {int(i) for i in ids}
    if len(banned) >= vocab:
        raise BadInputError(f"avoid_ids: every id of the vocabulary of {vocab} is to be avoided; nothing is left")
    for i in banned:
        j = (i + 1) % vocab
        while j in banned:
            j = (j + 1) % vocab
        tokens[tokens == i] = j
    return tokens


@entry_point
def p0_like_positions(tokens: Int[Tensor, "batch pos"], theta: float = 0.85) -> Bool[Tensor, "batch pos"]:
    """Positions that look like a start: some token makes up more than ``theta`` of the prefix.

    Position 0 is always flagged. Without absolute positions a position whose prefix is one repeated
    token (``x_0 = ... = x_t``) is a copy of position 0 in every layer of any model, so nothing can
    tell them apart; the planted model's detector flags exactly this set.
    """
    b, t = tokens.shape
    if tokens.numel() == 0 or int(tokens.min()) < 0:
        raise BadInputError(f"p0_like_positions: tokens of shape {tuple(tokens.shape)} must hold at least one "
                            "non-negative token id per row")
    onehot = torch.nn.functional.one_hot(tokens.long(), int(tokens.max()) + 1).float()
    freq = onehot.cumsum(1) / torch.arange(1, t + 1, dtype=torch.float32, device=tokens.device)[None, :, None]
    return freq.max(-1).values > theta


@entry_point
def regular_prompts(tokens: Int[Tensor, "batch pos"], theta: float = 0.85) -> Int[Tensor, "batch pos"]:
    """The rows of ``tokens`` that are *regular*: only position 0 is flagged by :func:`p0_like_positions`."""
    return tokens[p0_like_positions(tokens, theta)[:, 1:].sum(1) == 0]


@entry_point
def probe_tokens(
    model: HookedTransformer, n: int, length: int, *, seed: Union[int, torch.Generator] = 0, regular: bool = False,
    bos: bool = False,
) -> Int[Tensor, "batch pos"]:
    """``n`` random probe prompts of ``length`` uniform token ids, reproducible from ``seed``.

    The model's BOS id never appears in them, except at position 0 with ``bos=True``. With
    ``regular=True`` every row is regular (see :func:`regular_prompts`): a second token equal to the
    first is moved to the next id, and the rare row with a longer run is drawn again, so ``n`` rows
    always come back. These are random ids, not text: sweeps, the tracker, the survey, the report
    and the planted model's calibration all draw their probes here.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()
        >>> p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True).shape   # 8 prompts of 16 ids, never the BOS id
        torch.Size([8, 16])
    """
    vocab, bid = model.cfg.d_vocab, bos_id(model)
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    allowed = torch.arange(vocab)
    if bid is not None:
        allowed = allowed[allowed != bid]
    if n < 1 or length < 1 or len(allowed) < 2:
        raise BadInputError(f"probe prompts need n >= 1, length >= 1 and 2 usable ids; got n={n}, length={length}")
    if length > model.cfg.n_ctx:
        raise BadInputError(f"probe_tokens: length={length} exceeds the model's context n_ctx={model.cfg.n_ctx}; "
                            f"ask for at most {model.cfg.n_ctx} tokens")

    def draw(rows: int) -> Tensor:
        t = allowed[torch.randint(0, len(allowed), (rows, length), generator=gen)]
        if regular and length > 1:
            same = t[:, 1] == t[:, 0]
            t[same, 1] = allowed[(torch.searchsorted(allowed, t[same, 0]) + 1) % len(allowed)]
        return t

    tokens = draw(n)
    while regular and length > 1:
        flagged = p0_like_positions(tokens)[:, 1:].any(1).nonzero().flatten()
        if not len(flagged):
            break
        tokens[flagged] = draw(len(flagged))
    if bos:
        tokens = torch.cat([torch.full((n, 1), prepend_id(model)), tokens[:, : length - 1]], dim=1)
    return tokens.to(model.cfg.device)


def check_bos(model: HookedTransformer, tokens: Tensor, bos: Any, what: str = "tokens") -> None:
    """Raise when ``tokens`` contradict the run's BOS choice ``bos`` (True, False, or None: no claim).

    ``bos=False`` but some row starts with the BOS id: a sink measured there is a BOS sink, not a
    position-0 sink. ``bos=True`` but a row does not start with it, or has it twice (a text that
    already began with the BOS string). ``bos=True`` on a model with no known BOS id is refused: the
    claim cannot be checked, and a reader would take the run for one with a BOS token.
    """
    if bos is None:
        return
    if not isinstance(bos, bool):
        raise BadInputError(f"bos must be True, False or None (no claim), got {bos!r}")
    bid = bos_id(model)
    if bid is None:
        if bos:
            raise BadInputError(
                f"{what}: this run says BOS, but the model has no BOS token (no tokenizer BOS, no set_bos), so "
                "nothing says which id position 0 should hold: say which with p0circuit.set_bos(model, token), or "
                "say bos=False (or None: no claim)")
        return
    first = tokens[:, 0] == bid
    rows = first.nonzero().flatten().tolist()
    if not bos and rows:
        raise BadInputError(
            f"{what}: this run says no BOS, but {len(rows)} of {tokens.shape[0]} rows start with the BOS id "
            f"{bid} (rows {rows[:5]}); a sink there would be a BOS sink, not a position-0 one. Remove the "
            "BOS token (text must not begin with the BOS string) or say bos=True / prepend_bos=True"
        )
    if bos:
        missing = (~first).nonzero().flatten().tolist()
        if missing:
            raise BadInputError(
                f"{what}: this run says BOS, but {len(missing)} of {tokens.shape[0]} rows do not start with the "
                f"BOS id {bid} (rows {missing[:5]}); prepend it (to_tokens(..., prepend_bos=True)) or say bos=False"
            )
        if tokens.shape[1] > 1:
            twice = (tokens[:, 1] == bid).nonzero().flatten().tolist()
            if twice:
                raise BadInputError(
                    f"{what}: rows {twice[:5]} start with the BOS id {bid} twice (the text already began with "
                    "the BOS string); remove it from the text or use prepend_bos=False"
                )


@entry_point
def to_tokens(model: HookedTransformer, text: Union[str, Sequence[str]], *, prepend_bos: Any) -> Tensor:
    """Tokenize ``text`` with the model's tokenizer; ``prepend_bos`` must be given.

    ``prepend_bos`` must be a bool; it is annotated loosely so that a wrong value gets the message
    below rather than a type-checker error. The tokenizer's own special tokens are never added: with
    ``prepend_bos=True`` exactly one BOS id is put at position 0 (:func:`bos_label` says which: the
    tokenizer's ``bos_token`` when it is a start-of-text token, else the one :func:`set_bos`
    chose), with ``False`` position 0 holds the first token of the text.
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
    wrong = [t for t in text if not isinstance(t, str)]
    if wrong:
        raise BadInputError(f"to_tokens: text holds {wrong[0]!r:.40} ({type(wrong[0]).__name__}); pass a string or a "
                            "list of strings")
    if any(len(t) == 0 for t in text):
        raise BadInputError("empty string in the prompts: every prompt needs at least one token")
    tok = model.tokenizer
    ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in text]
    if prepend_bos:
        bid = prepend_id(model)
        ids = [[bid] + row for row in ids]
    lengths = sorted({len(row) for row in ids})
    if len(lengths) > 1:
        raise BadInputError(
            f"to_tokens: the prompts in text tokenize to different lengths {lengths}; sink metrics need prompts of equal "
            "length (padding would change what sits at each position): group prompts by length "
            "or truncate them"
        )
    if lengths[0] == 0:
        raise BadInputError("a prompt tokenized to no tokens; every prompt needs at least one token")
    if lengths[0] > model.cfg.n_ctx:
        raise BadInputError(f"to_tokens: the text is {lengths[0]} tokens, more than the model's context "
                            f"n_ctx={model.cfg.n_ctx}; shorten it, or cut windows of it with text_windows")
    tokens = torch.tensor(ids, dtype=torch.long, device=model.cfg.device)
    check_bos(model, tokens, prepend_bos, what="text")
    return tokens


@entry_point
def text_windows(
    model: HookedTransformer, text: str, n: int, length: int, *, prepend_bos: Any
) -> Int[Tensor, "batch pos"]:
    """``n`` prompts of exactly ``length`` tokens from natural text: ``text`` is tokenized once
    (no special tokens) and cut into consecutive, non-overlapping windows; with ``prepend_bos=True``
    each window holds the BOS id and ``length - 1`` text tokens. Sink metrics need prompts of equal
    length, and windows give them without padding."""
    if not isinstance(prepend_bos, bool):
        raise BadInputError(f"prepend_bos must be True or False, got {prepend_bos!r}: p0circuit never picks the BOS choice")
    if model.tokenizer is None:
        raise BadInputError("this model has no tokenizer: text cannot be tokenized; pass token ids instead")
    if not isinstance(text, str) or not text.strip():
        raise BadInputError("text must be a non-empty string")
    if n < 1 or length < 2:
        raise BadInputError(f"text windows need n >= 1 and length >= 2, got n={n}, length={length}")
    ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    per = length - int(prepend_bos)
    if len(ids) < n * per:
        raise BadInputError(
            f"the text holds {len(ids)} tokens, fewer than {n} windows of {per} need ({n * per}); pass more text, "
            "fewer prompts or shorter ones"
        )
    rows = [ids[i * per:(i + 1) * per] for i in range(n)]
    return _rows_to_tokens(model, rows, prepend_bos, "text windows")


def _rows_to_tokens(model: HookedTransformer, rows: list[list[int]], prepend_bos: bool, what: str) -> Tensor:
    """Equal-length id rows as a token tensor on the model's device, with the BOS id (see
    :func:`prepend_id`) in front when ``prepend_bos``; checked against that choice."""
    if prepend_bos:
        bid = prepend_id(model)
        rows = [[bid] + r for r in rows]
    tokens = torch.tensor(rows, dtype=torch.long, device=model.cfg.device)
    check_bos(model, tokens, prepend_bos, what=what)
    return tokens


TOKEN_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
"""Dtypes accepted for token ids (the integer dtypes torch indexes and reduces on every device)."""


def token_array(tokens: Any, what: str = "tokens", min_len: int = 1, error: type = BadInputError) -> Tensor:
    """``tokens`` as ``[batch, pos]`` after what holds whatever the model (:func:`check_tokens` adds what depends on
    it: the context, the vocabulary, the BOS claim): a torch tensor of integer ids, none negative, on a device with
    data, 1-D (one prompt) or 2-D, at least one prompt of at least ``min_len`` positions. ``error``: the error class
    (a spec's field: :class:`~p0circuit.core.errors.ConfigError`)."""
    if not isinstance(tokens, Tensor):
        raise error(
            f"{what} must be a torch LongTensor [batch, pos], got {type(tokens).__name__}; "
            "use p0circuit.to_tokens(model, text, prepend_bos=...) for text"
        )
    if tokens.dtype not in TOKEN_DTYPES:
        raise error(f"{what} must hold integer token ids ({', '.join(str(d)[6:] for d in TOKEN_DTYPES)}), got "
                    f"dtype {tokens.dtype}; convert with .long() (round float ids first, if they are ids at all)")
    if tokens.device.type == "meta":
        raise error(f"{what} are on the meta device and hold no data; create them on the CPU or the model's device")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise error(f"{what} must be 2-D [batch, pos], got shape {tuple(tokens.shape)}")
    if tokens.shape[0] == 0:
        raise error(f"{what} is an empty batch (shape {tuple(tokens.shape)}): pass at least one prompt")
    if tokens.shape[1] < min_len:
        raise error(
            f"{what} has sequence length {tokens.shape[1]} but this needs at least {min_len} "
            f"positions (position 0 is compared with positions t > 0); use longer prompts"
        )
    if tokens.numel() and int(tokens.min()) < 0:
        raise error(f"{what} holds negative ids (down to {int(tokens.min())}); token ids count from 0: check the "
                    "tokenizer matches the model")
    return tokens


@entry_point
def check_tokens(
    model: HookedTransformer, tokens: Any, *, min_len: int = 1, what: str = "tokens", bos: Any = None,
) -> Int[Tensor, "batch pos"]:
    """Validate a token tensor for ``model`` and return it as ``[batch, pos]`` on its device.

    ``bos``: the run's BOS choice (True / False), checked against the tokens by :func:`check_bos`;
    None makes no claim. Tokens on another real device are moved to the model's; tokens on the
    ``meta`` device (no data) are rejected.
    """
    tokens = token_array(tokens, what, min_len)
    n_ctx = model.cfg.n_ctx
    if tokens.shape[1] > n_ctx:
        raise BadInputError(f"{what} has length {tokens.shape[1]} > the model's n_ctx={n_ctx}; truncate the prompts")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.d_vocab:
        raise BadInputError(
            f"{what} holds ids out of the vocabulary: range [{lo}, {hi}] but d_vocab="
            f"{model.cfg.d_vocab} allows 0..{model.cfg.d_vocab - 1}; check the tokenizer matches the model"
        )
    tokens = tokens.long().to(model.cfg.device)
    check_bos(model, tokens, bos, what)
    return tokens


@lru_cache(maxsize=1)
def english_lines() -> tuple[str, ...]:
    """The shipped natural-English passages (``p0circuit/data/english.txt``): 201 lines of plain
    prose written for p0circuit, one or two sentences each, on everyday subjects. They need no
    download and make the default prompts for models with a tokenizer."""
    text = resources.files("p0circuit").joinpath("data/english.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@entry_point
def english_prompts(
    model: HookedTransformer, n: int, length: int, *, prepend_bos: Any, seed: int = 0,
) -> Int[Tensor, "batch pos"]:
    """``n`` natural-English prompts of exactly ``length`` tokens: each starts at the beginning of
    a different shipped passage (:func:`english_lines`; a passage shorter than ``length`` runs on
    into the passages after it), tokenized without special tokens and cut to length, so every
    prompt begins where a text begins. With ``prepend_bos=True`` position 0 holds the BOS id (see
    :func:`prepend_id`) and ``length - 1`` text tokens follow. The passages are picked in an order
    shuffled by ``seed``; at most as many prompts as passages (201)."""
    if not isinstance(prepend_bos, bool):
        raise BadInputError(f"prepend_bos must be True or False, got {prepend_bos!r}: p0circuit never picks the BOS choice")
    if model.tokenizer is None:
        raise BadInputError("english prompts need a tokenizer; this model has none (use probe_tokens for random ids)")
    for name, value, low in (("n", n, 1), ("length", length, 1 + int(prepend_bos))):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BadInputError(f"english_prompts: {name} must be an int >= {low}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise BadInputError(f"english_prompts: seed must be an int, got {seed!r}")
    per = length - int(prepend_bos)
    lines = english_lines()
    if n > len(lines):
        raise BadInputError(f"english_prompts: n={n} but {len(lines)} passages ship; ask for at most {len(lines)} "
                            "prompts, or pass your own text (text_windows)")
    if per > model.cfg.n_ctx:
        raise BadInputError(f"english_prompts: length {length} exceeds the model's n_ctx={model.cfg.n_ctx}")
    order = torch.randperm(len(lines), generator=torch.Generator().manual_seed(seed)).tolist()[:n]
    rows = []
    for i in order:
        text, j = lines[i], i
        ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
        while len(ids) < per:  # a short passage continues with the ones after it
            j += 1
            text += " " + lines[j % len(lines)]
            ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
        rows.append(ids[:per])
    return _rows_to_tokens(model, rows, prepend_bos, "english prompts")



class Prompts(NamedTuple):
    """Prompts and what they are."""

    tokens: Tensor
    source: str
    """``english``, ``random`` or ``regular`` (never ``auto``: what was used)."""

    def describe(self) -> str:
        """E.g. ``"8 english prompts x 24 tokens"``."""
        kind = {"english": "natural-English", "random": "random-id", "regular": "regular random-id"}[self.source]
        return f"{self.tokens.shape[0]} {kind} prompts x {self.tokens.shape[1]} tokens"


@entry_point
def make_prompts(
    model: HookedTransformer, n: int, length: int, *, source: str = "auto", seed: int = 0, bos: bool = False,
) -> Prompts:
    """Prompts from ``source`` (see :data:`PROMPT_SOURCES`), with the run's BOS choice ``bos``."""
    if source not in PROMPT_SOURCES:
        raise BadInputError(f"prompt source {source!r} is not one of {', '.join(PROMPT_SOURCES)}")
    if source == "auto":
        source = "english" if getattr(model, "tokenizer", None) is not None else "regular"
    if source == "english":
        return Prompts(english_prompts(model, n, length, prepend_bos=bos, seed=seed), source)
    return Prompts(probe_tokens(model, n, length, seed=seed, regular=source == "regular", bos=bos), source)
