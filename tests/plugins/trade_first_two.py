"""A user's corruption, loaded as a plugin (p0circuit.core.plugins.load_plugin) by the differential test:
the first two tokens trade places, so clean position 0 is corrupted position 1 and back."""

from dataclasses import dataclass
from typing import ClassVar

from p0circuit.patching.corruptions import Corruption, Prepared


@dataclass(frozen=True)
class TradeFirstTwo(Corruption):
    """Tokens 0 and 1 trade places; every other position keeps its token."""

    name: ClassVar[str] = "trade_first_two"

    def prepare(self, model, tokens):
        corrupt = tokens.clone()
        corrupt[:, [0, 1]] = tokens[:, [1, 0]]
        return Prepared(self, tokens, corrupt, align=(1, 0, *range(2, tokens.shape[1])))
