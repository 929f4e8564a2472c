"""One BOS setting of an analysis, held once: the checked model, the analysis' settings and whether position 0 of
its prompts holds the start token, with the prompts and setups that setting makes.

An analysis measures each BOS setting (without, and with the model's start token) apart; every step of a setting reads
the same three values. A :class:`Setting` carries them, so the steps take it and what varies (an onset, a prompt
length), not the BOS choice by hand.
"""

import typing
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from p0circuit.core.errors import BadInputError
from p0circuit.models.checks import check_model
from p0circuit.models.tokens import english_prompts, prepend_id, probe_tokens
from p0circuit.patching.setup import Setup
from p0circuit.studies.analysis.settings import AnalysisSettings
from p0circuit.studies.analysis.records import SETTINGS


@typing.no_type_check  # checks its own fields in __post_init__, and its methods' arguments
@dataclass(frozen=True)
class Setting:
    """One BOS setting: ``model`` (the checked ``HookedTransformer``), ``s`` (the analysis' settings), ``bos`` (whether
    the prompts start with the model's start token)."""

    model: Any
    """The checked ``HookedTransformer`` (its start token set by the analysis when ``bos``)."""
    s: AnalysisSettings
    """The analysis' settings (prompt count, length, seed, lines)."""
    bos: bool
    """Whether position 0 of the prompts holds the start token."""

    def __post_init__(self) -> None:
        check_model(self.model)
        if not isinstance(self.s, AnalysisSettings):
            raise BadInputError(f"Setting: s={self.s!r:.40} must be an AnalysisSettings (the analysis' settings)")
        if not isinstance(self.bos, bool):
            raise BadInputError(f"Setting: bos={self.bos!r:.40} must be True or False (whether the prompts start with "
                                "the model's start token)")

    @property
    def tag(self) -> str:
        """The setting's key in the record (``without_bos``, ``with_bos``)."""
        return SETTINGS[self.bos]

    def prompts(self, n: Any = None, length: Any = None, seed: Any = None) -> Tensor:  # (checked here)
        """``n`` prompts (default ``s.n_prompts``) of ``length`` text tokens (default ``s.length``), drawn with ``seed``
        (default ``s.seed``), the start token first when :attr:`bos`: passages of the shipped English text for a model
        with a tokenizer, regular random-id prompts otherwise."""
        n, length, seed = self._or_default(n, length, seed)
        if getattr(self.model, "tokenizer", None) is not None:
            return english_prompts(self.model, n, length + int(self.bos), prepend_bos=self.bos, seed=seed)
        toks = probe_tokens(self.model, n, length, seed=seed, regular=True)
        if self.bos:
            toks = torch.cat([torch.full((n, 1), prepend_id(self.model), dtype=toks.dtype), toks], 1)
        return toks

    def describe(self, n: Any = None, length: Any = None) -> str:  # (checked here)
        """What :meth:`prompts` makes, in words (every row of the record names its prompts)."""
        n, length, _ = self._or_default(n, length, None)
        source = ("passages of natural English" if getattr(self.model, "tokenizer", None) is not None
                  else "regular random-id prompts")
        return f"{n} {source} x {length} tokens" + (", a BOS token first" if self.bos else ", no BOS")

    def setup(self, tokens: Tensor, corruption: Any, metric: Any) -> Setup:
        """The checked :class:`~p0circuit.Setup` of a study of this setting on ``tokens``."""
        return Setup.of(self.model, tokens, corruption=corruption, metric=metric, bos=self.bos)

    def _or_default(self, n: Any, length: Any, seed: Any) -> tuple[int, int, int]:  # (checked here)
        n, length, seed = (self.s.n_prompts if n is None else n, self.s.length if length is None else length,
                           self.s.seed if seed is None else seed)
        for name, value, least in (("n", n, 1), ("length", length, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise BadInputError(f"Setting: {name}={value!r:.40} must be a whole number >= {least}")
        if length + int(self.bos) > self.model.cfg.n_ctx:
            raise BadInputError(f"Setting: {length} tokens" + (" and the start token" if self.bos else "")
                                + f" exceed the model's context of {self.model.cfg.n_ctx} positions; pass a shorter length")
        return n, length, seed
