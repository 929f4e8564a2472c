"""Corruptions: how the "corrupted" value of every component is obtained.

Ordinary patching resamples another prompt of the same length. A circuit whose only job is to
know "this is position 0" is then identical in the clean and corrupted runs, and patching calls
it irrelevant (science.md). The corruptions here can see it:

* ``shift`` (:class:`Shift`): the corrupted run is the same prompt with ``k`` tokens prepended,
  so the clean first token sits at position ``k``. Positions are aligned *by token*: clean
  position ``p`` corresponds to corrupted position ``p + k`` (the prepended tokens correspond
  to nothing), and sink metrics are measured at the clean first token in both runs.
* ``pos_mean`` (:class:`PosMean`): a component's output at position 0 is replaced by its mean
  over positions ``t > 0`` of the same prompt ("what if this component did not know it was at
  position 0"). Other positions are left as they are. Its fully corrupted reference is the
  clean run with every candidate node ablated at once.
* ``resample`` (:class:`Resample`) and ``zero`` (:class:`Zero`): controls. Resampling keeps
  every position's index, so it cannot see a position-only circuit: on the planted model it is
  reported as "no signal" (a tested negative control).

All corruptions share one signature, ``prepare(model, tokens) -> Prepared``, and are registered
by name in :data:`CORRUPTIONS`.
"""

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor

from p0circuit.errors import BadInputError, ConfigError


@dataclass(frozen=True)
class Prepared:
    """The inputs a corruption produces for one batch of clean prompts."""

    name: str
    """Corruption name."""
    clean_tokens: Tensor
    """Clean prompts ``[batch, T]``."""
    corrupt_tokens: Optional[Tensor]
    """Corrupted prompts (``None`` for ablations computed from the clean run)."""
    offset: int = 0
    """Corrupted index of clean position 0 (``k`` for a shift by ``k``)."""
    ablation: Optional[str] = None
    """``"pos_mean"`` or ``"zero"`` for ablations; ``None`` when values come from a corrupted run."""
    position: int = 0
    """The position a ``pos_mean`` ablation replaces."""
    params: tuple[tuple[str, Any], ...] = ()
    """Settings, for the record."""

    def corrupted_value(self, clean_act: Tensor, corr_act: Optional[Tensor], positions: list[int]) -> Tensor:
        """Corrupted activation at clean ``positions`` (``[batch, len(positions), ...]``)."""
        if self.ablation == "zero":
            return torch.zeros_like(clean_act[:, positions])
        if self.ablation == "pos_mean":
            out = clean_act[:, positions].clone()
            rest = torch.cat([clean_act[:, : self.position], clean_act[:, self.position + 1:]], 1).mean(1)
            for i, p in enumerate(positions):
                if p == self.position:
                    out[:, i] = rest
            return out
        assert corr_act is not None
        return corr_act[:, [p + self.offset for p in positions]]


@dataclass(frozen=True)
class Shift:
    """Prepend ``k`` filler tokens (random, seeded) so the clean first token sits at position k."""

    k: int = 1
    """Number of prepended tokens."""
    seed: int = 0
    """Seed of the random filler tokens."""
    filler: Optional[tuple[int, ...]] = None
    """Explicit filler token ids (length ``k``) instead of random ones."""
    name = "shift"

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if self.k < 1:
            raise ConfigError(f"shift needs k >= 1 prepended tokens, got k={self.k}")
        b, t = tokens.shape
        if t + self.k > model.cfg.n_ctx:
            raise BadInputError(
                f"shifting prompts of length {t} by k={self.k} needs n_ctx >= {t + self.k}, but the "
                f"model's n_ctx is {model.cfg.n_ctx}: use prompts of at most {model.cfg.n_ctx - self.k} tokens"
            )
        if self.filler is not None:
            if len(self.filler) != self.k:
                raise ConfigError(f"shift filler has {len(self.filler)} tokens but k={self.k}")
            fill = torch.tensor(self.filler, dtype=torch.long).expand(b, self.k)
        else:
            gen = torch.Generator().manual_seed(self.seed)
            fill = torch.randint(0, model.cfg.d_vocab, (b, self.k), generator=gen)
        corrupt = torch.cat([fill.to(tokens.device), tokens], dim=1)
        return Prepared("shift", tokens, corrupt, offset=self.k, params=(("k", self.k), ("seed", self.seed)))


@dataclass(frozen=True)
class PosMean:
    """Replace a component's output at ``position`` by its mean over the other positions."""

    position: int = 0
    """The ablated position."""
    name = "pos_mean"

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if tokens.shape[1] < 2 or not 0 <= self.position < tokens.shape[1]:
            raise BadInputError(
                f"pos_mean at position {self.position} needs prompts with that position and at "
                f"least one other; got length {tokens.shape[1]}"
            )
        return Prepared("pos_mean", tokens, None, ablation="pos_mean", position=self.position,
                        params=(("position", self.position),))


@dataclass(frozen=True)
class Resample:
    """Another prompt of the same length: ``tokens`` if given, else the batch rolled by one row."""

    tokens: Optional[Tensor] = None
    """Explicit corrupted prompts, shaped like the clean ones."""
    seed: int = 0
    """Seed for random prompts when the batch has a single row."""
    name = "resample"

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        if self.tokens is not None:
            corrupt = self.tokens.to(tokens.device).long()
            if corrupt.shape != tokens.shape:
                raise BadInputError(
                    f"clean tokens {tuple(tokens.shape)} and corrupted tokens {tuple(corrupt.shape)} "
                    "cannot be aligned position by position: resample needs the same [batch, pos] "
                    "shape (use shift to compare prompts of different lengths)"
                )
        elif tokens.shape[0] >= 2:
            corrupt = tokens.roll(1, dims=0)
        else:
            gen = torch.Generator().manual_seed(self.seed)
            corrupt = torch.randint(0, model.cfg.d_vocab, tuple(tokens.shape), generator=gen).to(tokens.device)
        return Prepared("resample", tokens, corrupt)


@dataclass(frozen=True)
class Zero:
    """Zero-ablate the component (a control)."""

    name = "zero"

    def prepare(self, model: Any, tokens: Tensor) -> Prepared:
        return Prepared("zero", tokens, None, ablation="zero")


Corruption = Union[Shift, PosMean, Resample, Zero]
CORRUPTIONS: dict[str, type] = {"shift": Shift, "pos_mean": PosMean, "resample": Resample, "zero": Zero}
"""Registry: corruption name -> class (all with ``prepare(model, tokens) -> Prepared``)."""


def get_corruption(spec: Union[str, Corruption], **params: Any) -> Corruption:
    """A corruption from its registry name (with parameters) or an instance."""
    if isinstance(spec, str):
        if spec not in CORRUPTIONS:
            raise ConfigError(f"unknown corruption {spec!r}; choose one of {sorted(CORRUPTIONS)}")
        return CORRUPTIONS[spec](**params)
    if not hasattr(spec, "prepare"):
        raise ConfigError(f"{spec!r} is not a corruption; choose one of {sorted(CORRUPTIONS)}")
    return spec
