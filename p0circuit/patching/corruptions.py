"""Corruptions: how the "corrupted" value of every component is obtained.

Ordinary patching resamples another prompt of the same length. A circuit whose only job is to
know "this is position 0" is then identical in the clean and corrupted runs, and patching calls
it irrelevant (docs/science.md). The corruptions here can see it:

* ``shift`` (:class:`Shift`): the corrupted run is the same prompt with ``k`` tokens prepended,
  so the clean first token sits at position ``k``. Positions are aligned *by token*: clean
  position ``p`` corresponds to corrupted position ``p + k`` (the prepended tokens correspond
  to nothing), and sink metrics are measured at the clean first token in both runs.
* ``pos_mean`` (:class:`PosMean`): a component's output at position 0 is replaced by its mean
  over positions ``t > 0`` of the same prompt ("what if this component did not know it was at
  position 0"). Other positions are left as they are. Its fully corrupted reference is the
  clean run with every candidate node ablated at once.
* ``swap`` (:class:`Swap`): the token at one position (default 0) is replaced by another token,
  every position keeping its index. With a BOS token at position 0 this is BOS ablation as a
  patch: it finds what makes the *BOS token* a sink, which ``shift`` cannot (it moves BOS along with
  the prompt, so a BOS-driven sink is identical in both runs).
* ``resample`` (:class:`Resample`) and ``zero`` (:class:`Zero`): controls. Resampling keeps
  every position's index, so it cannot see a position-only circuit: on the planted model it is
  reported as "no signal" (a tested negative control).

Every corruption is a subclass of :class:`Corruption` with a class attribute ``name``; defining
the class registers it in :data:`CORRUPTIONS`, so the command line, sweep configs and
:func:`p0circuit.discover` accept the name at once. A corruption says two things:

* :meth:`Corruption.prepare` turns the clean prompts into a :class:`Prepared` record: the
  corrupted prompts (or none, for an ablation computed from the clean run) and the *alignment*,
  the corrupted index of every clean position (``offset=k`` for a shift by ``k``; ``align=(...)``
  for any other map, e.g. ``(1, 0, 2, 3, ...)`` when the first two tokens trade places).
  :meth:`Prepared.aligned` is the one place a clean position becomes a corrupted one: both
  directions of every method, and the default corrupted value, go through it;
* :meth:`Corruption.corrupted_value` gives a component's corrupted activation at clean-frame
  positions. The default reads the corrupted run, token-aligned; ablations override it.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Union

import torch
from torch import Tensor

from p0circuit.core import names
from p0circuit.core.errors import BadInputError, ConfigError, already_registered, check_key, nearest, source_of
from p0circuit.core.io import describe
from p0circuit.core.args import entry_point
from p0circuit.core.args import at_least
from p0circuit.measures.positions import check_position_spec, find_positions
from p0circuit.models.tokens import bos_id, check_tokens, token_array

CORRUPTIONS: dict[str, type["Corruption"]] = {}
"""Registry: corruption name -> class, filled by defining a :class:`Corruption` subclass."""


def room(n_ctx: int, k: int, length: int) -> str:
    """The fix when ``k`` tokens put before prompts of ``length`` pass ``n_ctx``: shorter prompts where a prompt of
    two tokens still fits, else a smaller ``k``."""
    if n_ctx - k >= 2:
        return f"use prompts of at most {n_ctx - k} tokens (or k <= {n_ctx - length})"
    return f"use k <= {max(n_ctx - length, 1)} (k={k} leaves no room for a prompt in n_ctx {n_ctx})"


class Corruption:
    """Base class: how a corrupted value is obtained for every component (see the module docstring).

    A subclass that sets ``name`` in its own class body is registered in :data:`CORRUPTIONS` when it
    is defined, and must define ``prepare(model, tokens) -> Prepared`` (its own or a parent's). The
    name is an identifier-like string (letters, digits, ``_``) that no other class holds: a built-in's
    name or another plugin's is refused, naming both classes; the same class defined again (its module
    imported again: a sweep worker, a notebook reload) replaces itself quietly, a class being known
    by its ``module.qualname``. A subclass that does not set ``name`` itself is not registered: an
    abstract base (it may lack ``prepare``), or a variant of a registered corruption
    (``class MyShift(Shift): ...``), usable as an instance (``corruption=MyShift(k=2)``) and recorded
    under the name it inherits.
    """

    name: ClassVar[str] = ""
    """Registry name; a subclass that sets it in its own body is registered when it is defined."""
    summary: ClassVar[str] = ""
    """What the corrupted run changes, in a few words (the advice a "no signal" result gives)."""
    sees_position: ClassVar[bool] = False
    """Whether it changes what a circuit keyed on position 0 alone computes (a run without BOS)."""
    sees_bos_token: ClassVar[bool] = False
    """Whether it changes what a sink built on the BOS token at position 0 computes."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name", "") == "":
            return  # an abstract base, or a variant of a registered corruption (the class docstring)
        me = source_of(cls)
        name = check_key("corruption", cls.__dict__["name"], me)
        if cls.prepare is Corruption.prepare:
            raise ConfigError(f"corruption {name!r} ({me}) does not define prepare(model, tokens) -> Prepared: define "
                              "it to return the corrupted prompts and their alignment; see p0circuit.Corruption's docstring")
        if name in CORRUPTIONS and source_of(CORRUPTIONS[name]) != me:
            raise already_registered("corruption", name, f"by {source_of(CORRUPTIONS[name])}", me)
        CORRUPTIONS[name] = cls

    def prepare(self, model: Any, tokens: Tensor) -> "Prepared":
        """The corrupted inputs for one batch of clean prompts."""
        raise NotImplementedError(f"{source_of(type(self))} does not define prepare(model, tokens) -> Prepared; see "
                                  "p0circuit.Corruption's docstring")

    def params(self) -> dict[str, Any]:
        """Every setting, for the record (JSON-able, :func:`p0circuit.core.io.describe`: a tensor by its
        digest): the public fields of a dataclass corruption, else its instance attributes. Results
        carry it, and a comparison of results (a faithfulness curve) matches on all of it."""
        fields = describe(self) if dataclasses.is_dataclass(self) else describe(vars(self))
        return fields if isinstance(fields, dict) else {}

    def corrupted_value(self, prep: "Prepared", clean_act: Tensor, corr_act: Optional[Tensor],
                        positions: list[int]) -> Tensor:
        """Corrupted activation at clean ``positions`` (``[batch, len(positions), ...]``): by
        default the corrupted run's, at the aligned positions (:meth:`Prepared.aligned`)."""
        if corr_act is None:
            raise ConfigError(f"corruption {self.name!r} made no corrupted run; it must override corrupted_value")
        return corr_act[:, prep.aligned(positions)]


@dataclass(frozen=True)
class Prepared:
    """The inputs a corruption produces for one batch of clean prompts."""

    corruption: Corruption
    """The corruption that made it (and that computes corrupted values)."""
    clean_tokens: Tensor
    """Clean prompts ``[batch, T]``."""
    corrupt_tokens: Optional[Tensor]
    """Corrupted prompts (``None`` for ablations computed from the clean run)."""
    offset: int = 0
    """Clean position ``p`` is corrupted position ``p + offset`` (``k`` for a shift by ``k``), unless
    ``align`` is given."""
    align: Optional[tuple[int, ...]] = None
    """The corrupted index of each clean position, one per clean position (instead of ``offset``)."""

    def __post_init__(self) -> None:
        t = int(self.clean_tokens.shape[1])
        t_corr = t if self.corrupt_tokens is None else int(self.corrupt_tokens.shape[1])
        where = self.align if self.align is not None else tuple(p + self.offset for p in range(t))
        if self.align is not None and self.offset:
            raise ConfigError(f"corruption {self.name!r}: give Prepared either offset= or align=, not both")
        if (len(where) != t or len(set(where)) != t or any(isinstance(p, bool) or not isinstance(p, int)
                                                          or not 0 <= p < t_corr for p in where)):
            raise ConfigError(f"corruption {self.name!r}: its alignment must give each of the {t} clean positions "
                              f"its own corrupted index in 0..{t_corr - 1}, got {list(where)[:12]}")
        object.__setattr__(self, "align", tuple(where))

    def aligned(self, positions: Any) -> list[int]:
        """The corrupted index of each clean position in ``positions``: the one alignment every
        direction and method uses."""
        return [self.align[p] for p in positions]  # type: ignore[index]

    @property
    def p0(self) -> int:
        """Where the clean first token sits in the corrupted run (sink metrics are read there)."""
        return self.aligned([0])[0]

    @property
    def name(self) -> str:
        """The corruption's registry name."""
        return self.corruption.name

    @property
    def is_ablation(self) -> bool:
        """True when corrupted values come from the clean run itself (no corrupted run)."""
        return self.corrupt_tokens is None

    def corrupted_value(self, clean_act: Tensor, corr_act: Optional[Tensor], positions: list[int]) -> Tensor:
        """Corrupted activation at clean ``positions``; see :meth:`Corruption.corrupted_value`."""
        return self.corruption.corrupted_value(self, clean_act, corr_act, positions)


@entry_point  # parameters are checked in prepare() with messages that name the fix
@dataclass(frozen=True)
class Shift(Corruption):
    """Prepend ``k`` filler tokens (random, seeded) so the clean first token sits at position k.

    Example::

        >>> import p0circuit as p0
        >>> p0.Shift(2)                    # two random tokens put in front: P0 moves to index 2
        Shift(k=2, seed=0, filler=None)
    """

    k: int = 1
    """Number of prepended tokens."""
    seed: int = 0
    """Seed of the random filler tokens."""
    filler: Optional[tuple[int, ...]] = None
    """Explicit filler token ids (length ``k``) instead of random ones."""
    name: ClassVar[str] = names.SHIFT
    summary: ClassVar[str] = 'prepends tokens, so the first token no longer sits at position 0'
    sees_position: ClassVar[bool] = True
    sees_bos_token: ClassVar[bool] = False

    def __post_init__(self) -> None:
        at_least("Shift", "k", self.k, 1, "the number of filler tokens put before each prompt")

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"Shift.k must be an int >= 1 (prepended tokens), got {self.k!r}")
        if self.filler is not None:
            ids = list(self.filler) if isinstance(self.filler, (tuple, list)) else None
            if ids is None or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < model.cfg.d_vocab
                                  for i in ids):
                raise ConfigError(f"Shift.filler must be a tuple of token ids in 0..{model.cfg.d_vocab - 1}, got "
                                  f"{self.filler!r}")
        b, t = tokens.shape
        if t + self.k > model.cfg.n_ctx:
            raise BadInputError(
                f"shifting prompts of length {t} by k={self.k} needs n_ctx >= {t + self.k}, but the "
                f"model's n_ctx is {model.cfg.n_ctx}: " + room(model.cfg.n_ctx, self.k, t)
            )
        if self.filler is not None:
            if len(self.filler) != self.k:
                raise ConfigError(f"shift filler has {len(self.filler)} tokens but k={self.k}")
            fill = torch.tensor(self.filler, dtype=torch.long).expand(b, self.k)
        else:
            fill = _fillers(model, tokens, self.k, self.seed)
        corrupt = torch.cat([fill.to(tokens.device), tokens], dim=1)
        return Prepared(self, tokens, corrupt, offset=self.k)


def _fillers(model: Any, tokens: Tensor, k: int, seed: int) -> Tensor:
    """``k`` random filler ids per prompt (seeded), never the prompt's own first token (a filler equal to it would
    leave that token with nothing but copies of itself before it, which under rotary or no position encoding is
    position 0 again) and never the BOS id."""
    gen = torch.Generator().manual_seed(seed)
    b = tokens.shape[0]
    fill = torch.randint(0, model.cfg.d_vocab, (b, k), generator=gen)
    banned = {bos_id(model)} - {None}
    for _ in range(64):
        bad = (fill == tokens[:, :1].cpu()) | torch.isin(fill, torch.tensor(sorted(banned), dtype=fill.dtype))
        if not bool(bad.any()):
            return fill
        fill[bad] = torch.randint(0, model.cfg.d_vocab, (int(bad.sum()),), generator=gen)
    raise BadInputError(f"no filler token differs from the prompts' first tokens and the BOS id in a vocabulary of "
                        f"{model.cfg.d_vocab}; pass Shift(filler=...)")


@entry_point
@dataclass(frozen=True)
class PosMean(Corruption):
    """Replace a component's output at ``position`` by its mean over the other positions."""

    position: int = 0
    """The ablated position."""
    name: ClassVar[str] = names.POS_MEAN
    summary: ClassVar[str] = "replaces P0's output by the other positions' mean"
    sees_position: ClassVar[bool] = True
    sees_bos_token: ClassVar[bool] = True

    def __post_init__(self) -> None:
        at_least("PosMean", "position", self.position, 0, "positions count from 0")

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if tokens.shape[1] < 2 or not 0 <= self.position < tokens.shape[1]:
            raise BadInputError(
                f"pos_mean at position {self.position} needs prompts with that position and at "
                f"least one other; got length {tokens.shape[1]}"
            )
        return Prepared(self, tokens, None)

    def corrupted_value(self, prep: Prepared, clean_act: Tensor, corr_act: Optional[Tensor],
                        positions: list[int]) -> Tensor:
        out = clean_act[:, positions].clone()
        at = self.position
        rest = torch.cat([clean_act[:, :at], clean_act[:, at + 1:]], 1).mean(1)
        for i, p in enumerate(positions):
            if p == at:
                out[:, i] = rest
        return out


@entry_point  # parameters are checked in prepare() with messages that name the fix
@dataclass(frozen=True)
class Copies(Corruption):
    """Prepend ``k`` copies of each prompt's first token, so the clean first token sits at position k with nothing but
    copies of itself before it: a *control*. Under rotary or no position encoding positions 0..k then compute exactly
    what position 0 computes (each attends to copies of one value), so a state keyed on "no other token before it"
    is the same at position k as at position 0 and this corruption shows no signal; a state keyed on the absolute
    position (a learned position embedding) is lost, and it does."""

    k: int = 3
    """Number of prepended copies."""
    name: ClassVar[str] = names.COPIES
    summary: ClassVar[str] = ("prepends copies of the first token (a control: a state keyed on having no other token "
                              "before it stays)")
    sees_position: ClassVar[bool] = False
    sees_bos_token: ClassVar[bool] = False

    def __post_init__(self) -> None:
        at_least("Copies", "k", self.k, 1, "the number of copies put before each prompt")

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        b, t = tokens.shape
        if t + self.k > model.cfg.n_ctx:
            raise BadInputError(f"putting {self.k} copies before prompts of length {t} needs n_ctx >= {t + self.k}, but "
                                f"the model's n_ctx is {model.cfg.n_ctx}: " + room(model.cfg.n_ctx, self.k, t))
        return Prepared(self, tokens, torch.cat([tokens[:, :1].expand(b, self.k), tokens], dim=1), offset=self.k)


@entry_point
@dataclass(frozen=True)
class Swap(Corruption):
    """Replace the token at ``position`` by ``token`` (or, when None, a random token per prompt,
    seeded, never the token it replaces): the token's identity changes, its position does not.
    ``position`` may name a position class, one per prompt (``"first:,"``: each prompt's first
    comma; see :func:`p0circuit.measures.positions.find_positions`)."""

    position: Union[int, str] = 0
    """The position whose token is replaced: an index or a position class."""
    token: Optional[int] = None
    """The replacement id; None: random ids (``seed``)."""
    seed: int = 0
    """Seed of the random replacements."""
    name: ClassVar[str] = names.SWAP
    summary: ClassVar[str] = 'replaces one token in place (position 0 by default), every position kept'
    sees_position: ClassVar[bool] = False
    sees_bos_token: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.position, str):
            at_least("Swap", "position", self.position, 0, "positions count from 0")
        else:
            check_position_spec("Swap", self.position)
        if self.token is not None:
            at_least("Swap", "token", self.token, 0, "token ids count from 0")

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        vocab = model.cfg.d_vocab
        if self.token is not None and (isinstance(self.token, bool) or not isinstance(self.token, int)
                                       or not 0 <= self.token < vocab):
            raise ConfigError(f"Swap.token must be a token id in 0..{vocab - 1}, got {self.token!r}")
        if isinstance(self.position, int) and not self.position < tokens.shape[1]:
            raise BadInputError(f"swap at position {self.position} needs prompts longer than {self.position} tokens; "
                                f"got length {tokens.shape[1]}")
        at = torch.tensor(find_positions(model, tokens, self.position, bos_id(model)), device=tokens.device)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        corrupt = tokens.clone()
        old = tokens[rows, at]
        if self.token is not None:
            if bool((old == self.token).all()):
                raise ConfigError(f"Swap.token {self.token} is the token already at position {self.position!r} in every "
                                  "prompt: the corruption would change nothing; choose another id")
            new = torch.full_like(old, self.token)
        else:
            gen = torch.Generator().manual_seed(self.seed)
            new = torch.randint(0, vocab - 1, (tokens.shape[0],), generator=gen).to(tokens.device)
            new = new + (new >= old).long()  # uniform over the ids other than the one replaced
        corrupt[rows, at] = new
        return Prepared(self, tokens, corrupt)


@entry_point
@dataclass(frozen=True)
class Resample(Corruption):
    """Other prompts of the same length: ``tokens`` if given, else prompts the batch does not hold, drawn with
    ``seed`` from the model's own source (the shipped English passages for a model with a tokenizer, none equal to
    a clean prompt; regular random ids for one without), with the BOS token first when every clean prompt starts
    with it.

    Not the batch rolled by one: that is a permutation of the same prompts, so every metric that is a mean over
    prompts is the same on both sides and the control shows no signal by construction, whatever the circuit. On
    other prompts a metric that depends on what the prompts say moves; one that depends only on the position
    (a P0 sink) does not, and that is then a measurement."""

    tokens: Optional[Tensor] = None
    """Explicit corrupted prompts, shaped like the clean ones."""
    seed: int = 0
    """Seed of the drawn prompts."""
    name: ClassVar[str] = names.RESAMPLE

    def __post_init__(self) -> None:
        if self.tokens is not None:  # what holds whatever the model: ids in its vocabulary are checked with it
            token_array(self.tokens, "Resample.tokens", min_len=1, error=ConfigError)
    summary: ClassVar[str] = 'other prompts of the same length (a control)'
    sees_position: ClassVar[bool] = False
    sees_bos_token: ClassVar[bool] = False

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if self.tokens is not None:
            corrupt = check_tokens(model, self.tokens, what="Resample(tokens=...)")  # ids in the vocabulary, integer
            if corrupt.shape != tokens.shape:
                raise BadInputError(
                    f"clean tokens {tuple(tokens.shape)} and corrupted tokens {tuple(corrupt.shape)} "
                    "cannot be aligned position by position: resample needs the same [batch, pos] "
                    "shape (use shift to compare prompts of different lengths)"
                )
        else:
            corrupt = _other_prompts(model, tokens, self.seed)
        return Prepared(self, tokens, corrupt)


def _other_prompts(model: Any, tokens: Tensor, seed: int) -> Tensor:
    """Prompts shaped like ``tokens`` that the batch does not hold, from the model's own source (see
    :class:`Resample`), with the BOS token first when every clean prompt has it: for a model with a tokenizer, the
    shipped passages' prompts in an order shuffled by ``seed``, those equal to a clean prompt left out; for one
    without, random regular ids. Refused, saying what to do, when the source cannot give enough."""
    from p0circuit.models.tokens import english_lines, english_prompts, probe_tokens

    batch, length = tokens.shape
    bid = bos_id(model)
    bos = bid is not None and bool((tokens[:, 0] == bid).all())
    clean = {tuple(r) for r in tokens.tolist()}
    if getattr(model, "tokenizer", None) is None:
        out = probe_tokens(model, batch, length - int(bos), seed=1 + seed, regular=length - int(bos) >= 2)
        if bos:
            out = torch.cat([torch.full((batch, 1), bid, dtype=out.dtype), out], 1)
        out = out.to(tokens.device)
        if clean & {tuple(r) for r in out.tolist()}:
            raise BadInputError("resample drew a random prompt equal to a clean one (a very short prompt?); pass "
                                "Resample(tokens=...) with the prompts to patch from")
        return out
    every = english_prompts(model, len(english_lines()), length, prepend_bos=bos, seed=1 + seed).to(tokens.device)
    others = [r for r in every if tuple(r.tolist()) not in clean]
    if len(others) < batch:
        raise BadInputError(f"resample draws other prompts from the {len(english_lines())} shipped passages, and "
                            f"{len(others)} of them differ from the {batch} clean prompts: too few; pass "
                            "Resample(tokens=...) with prompts of your own, shaped like the clean ones")
    return torch.stack(others[:batch])


@entry_point
@dataclass(frozen=True)
class Zero(Corruption):
    """Zero-ablate the component (a control)."""

    name: ClassVar[str] = names.ZERO
    summary: ClassVar[str] = "removes a component's output"
    sees_position: ClassVar[bool] = True
    sees_bos_token: ClassVar[bool] = True

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        return Prepared(self, tokens, None)

    def corrupted_value(self, prep: Prepared, clean_act: Tensor, corr_act: Optional[Tensor],
                        positions: list[int]) -> Tensor:
        return torch.zeros_like(clean_act[:, positions])


def fitting(bos_at_p0: bool) -> list[str]:
    """Every registered corruption (a plugin's included) that can see the run's P0 mechanism: one
    that changes a BOS-token sink when the prompts start with BOS, else one that changes a
    position-keyed circuit. Those that see only that mechanism come first (``swap`` with BOS, ``shift``
    without), then those that see both; registry order within each."""
    fits = [n for n, c in CORRUPTIONS.items() if (c.sees_bos_token if bos_at_p0 else c.sees_position)]
    return sorted(fits, key=lambda n: CORRUPTIONS[n].sees_position and CORRUPTIONS[n].sees_bos_token)


def advice(used: str, bos_at_p0: bool) -> str:
    """Why corruption ``used`` may see nothing, and which registered corruptions fit the run instead
    (never ``used``), from each corruption's own traits."""
    if bos_at_p0:
        why = f"the prompts start with the BOS token; a sink built on that token may be the same in both runs of {used!r}"
    else:
        why = f"a circuit that reads only the position, not the token, may be the same in both runs of {used!r}"
    names = [f"{n!r} ({CORRUPTIONS[n].summary or CORRUPTIONS[n].__doc__ or n})" for n in fitting(bos_at_p0) if n != used]
    return f"{why}; try " + " or ".join(names[:2])


@entry_point
def get_corruption(spec: Any, **params: Any) -> Corruption:
    """A corruption from its registry name (with parameters) or an instance."""
    if isinstance(spec, str):
        if spec not in CORRUPTIONS:
            raise ConfigError(f"unknown corruption {spec!r}{nearest(spec, CORRUPTIONS)}; choose one of {sorted(CORRUPTIONS)}")
        return CORRUPTIONS[spec](**params)
    if not isinstance(spec, Corruption):
        raise ConfigError(
            f"a corruption is a name or a Corruption, got {spec!r:.60} ({type(spec).__name__}); pass a name from {sorted(CORRUPTIONS)} or an instance of a "
            "p0circuit.Corruption subclass (Shift(k=2), PosMean(), ...)"
        )
    return spec
