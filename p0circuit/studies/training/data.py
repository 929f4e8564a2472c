"""Token sources for training, each deterministic by step: ``batch(step, n, length)`` always
returns the same tokens for the same step, so a resumed run sees exactly the data it would have
seen (no lost or repeated steps).

* :class:`MarkovSource`: a sparse random Markov chain (each token has ``k`` possible successors);
* :class:`BigramBackcopy`: the Bigram-Backcopy task of Guo et al. (2024, "Active-dormant attention
  heads"): a bigram chain, except that after a *trigger* token the next token copies the token
  just before the trigger, a task with a real need for a no-op for most heads;
* :class:`TextSource`: a local text file as bytes (vocabulary 256), documents split on blank
  lines, either packed (windows of the concatenated stream) or one document start per row;
* :func:`hf_dataset_source`: a Hugging Face dataset as bytes, for users with a hub.

``bos``: when set, every row starts with that token id (it must lie outside the source's own
vocabulary range or be chosen deliberately); when None, rows start with data. The choice is
always explicit.
"""

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError, ConfigError


def _gen(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


@functools.lru_cache(maxsize=16)
def _transitions(vocab: int, k: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    probs = torch.zeros(vocab, vocab)
    for i in range(vocab):
        succ = torch.randperm(vocab, generator=g)[:k]
        w = torch.rand(k, generator=g) + 0.1
        probs[i, succ] = w / w.sum()
    return probs


def _sample(cdf: Tensor, prev: Tensor, u: Tensor) -> Tensor:
    """Next tokens by inverse-CDF sampling: the first index whose cumulative probability exceeds u."""
    rows = cdf[prev]  # (n, vocab)
    return torch.searchsorted(rows, (u * rows[:, -1]).unsqueeze(1), right=True).squeeze(1).clamp_max(cdf.shape[1] - 1)


def _with_bos(rows: Tensor, bos_id: Optional[int]) -> Tensor:
    """``rows`` with the token ``bos_id`` put at position 0 (the last token dropped; None: as they are)."""
    if bos_id is None:
        return rows
    return torch.cat([torch.full_like(rows[:, :1], bos_id), rows[:, :-1]], dim=1)


@entry_point
@dataclass(frozen=True)
class MarkovSource:
    """A sparse Markov chain over ``vocab`` tokens with ``k`` successors per token."""

    vocab: int = 64
    """Number of tokens."""
    k: int = 4
    """Successors per token."""
    seed: int = 0
    """Seed of the chain and of the samples."""
    bos: Optional[int] = None
    """Token id put at position 0 of every row, or None."""

    def __post_init__(self) -> None:
        if self.vocab < 2 or not 1 <= self.k <= self.vocab:
            raise ConfigError(f"MarkovSource needs vocab >= 2 and 1 <= k <= vocab, got vocab={self.vocab}, k={self.k}")
        _check_bos("MarkovSource", self.bos)

    def transitions(self) -> Tensor:
        """Row-stochastic ``[vocab, vocab]`` matrix with ``k`` non-zeros per row."""
        return _transitions(self.vocab, self.k, self.seed).clone()

    def batch(self, step: int, n: int, length: int) -> Tensor:
        """``[n, length]`` tokens for training step ``step``."""
        g = _gen(self.seed, step)
        cdf = _transitions(self.vocab, self.k, self.seed).cumsum(1)
        rows = torch.empty(n, length, dtype=torch.long)
        rows[:, 0] = torch.randint(0, self.vocab, (n,), generator=g)
        u = torch.rand(n, length, generator=g)
        for t in range(1, length):
            rows[:, t] = _sample(cdf, rows[:, t - 1], u[:, t])
        return _with_bos(rows, self.bos)


@entry_point
@dataclass(frozen=True)
class BigramBackcopy:
    """Bigram chain with trigger tokens: after a trigger, copy the token before the trigger."""

    vocab: int = 64
    """Number of tokens."""
    n_triggers: int = 3
    """Tokens ``0..n_triggers-1`` are triggers."""
    k: int = 4
    """Bigram successors per token."""
    seed: int = 0
    """Seed."""
    bos: Optional[int] = None
    """Token id put at position 0 of every row, or None."""

    def __post_init__(self) -> None:
        if self.vocab < 2 or not 1 <= self.n_triggers < self.vocab or not 1 <= self.k <= self.vocab:
            raise ConfigError(f"BigramBackcopy needs vocab >= 2, 1 <= n_triggers < vocab and 1 <= k <= vocab, got "
                              f"vocab={self.vocab}, n_triggers={self.n_triggers}, k={self.k}")
        _check_bos("BigramBackcopy", self.bos)

    def batch(self, step: int, n: int, length: int) -> Tensor:
        """``[n, length]`` tokens for training step ``step``."""
        cdf = _transitions(self.vocab, self.k, self.seed).cumsum(1)
        g = _gen(self.seed, step)
        rows = torch.empty(n, length, dtype=torch.long)
        rows[:, 0] = torch.randint(self.n_triggers, self.vocab, (n,), generator=g)
        u = torch.rand(n, length, generator=g)
        for t in range(1, length):
            nxt = _sample(cdf, rows[:, t - 1], u[:, t])
            if t >= 2:
                copy = rows[:, t - 1] < self.n_triggers
                nxt = torch.where(copy, rows[:, t - 2], nxt)
            rows[:, t] = nxt
        return _with_bos(rows, self.bos)


@entry_point
@dataclass(frozen=True)
class TextSource:
    """A local text file as bytes; documents are separated by blank lines."""

    path: Union[str, Path]
    """The text file (kept as a string)."""
    pack: bool = True
    """True: windows of the concatenated stream; False: every row starts at a document start."""
    seed: int = 0
    """Seed of the window positions."""
    bos: Optional[int] = None
    """Token id put at position 0 of every row (e.g. 256 with a vocabulary of 257), or None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(self.path))  # one spelling: a resumed run compares the source's repr
        if not Path(self.path).is_file():
            raise ConfigError(f"TextSource.path={self.path!r} is not a file; pass the path of a UTF-8 text file")
        _check_bos("TextSource", self.bos)

    @property
    def vocab(self) -> int:
        """256 bytes, plus one when ``bos`` is 256."""
        return 257 if self.bos == 256 else 256

    def _data(self) -> tuple[Tensor, list[int]]:
        p = Path(self.path)
        if not p.is_file():
            raise BadInputError(f"text file {self.path!r} does not exist")
        raw = p.read_bytes()
        docs = [d for d in raw.split(b"\n\n") if d.strip()]
        if not docs:
            raise BadInputError(f"{self.path!r} holds no text")
        stream = b"\n\n".join(docs)
        starts, pos = [], 0
        for d in docs:
            starts.append(pos)
            pos += len(d) + 2
        return torch.tensor(list(stream), dtype=torch.long), starts

    def batch(self, step: int, n: int, length: int) -> Tensor:
        """``[n, length]`` byte tokens for training step ``step``."""
        data, starts = self._data()
        if len(data) <= length:
            raise BadInputError(f"{self.path!r} has {len(data)} bytes, fewer than one row of {length + 1}")
        g = _gen(self.seed, step)
        if self.pack:
            offsets = torch.randint(0, len(data) - length, (n,), generator=g)
        else:
            ok = torch.tensor([s for s in starts if s + length <= len(data)])
            if len(ok) == 0:
                raise BadInputError(f"no document in {self.path!r} has room for a row of {length} bytes: use pack=True")
            offsets = ok[torch.randint(0, len(ok), (n,), generator=g)]
        rows = torch.stack([data[o:o + length] for o in offsets.tolist()])
        return _with_bos(rows, self.bos)


@entry_point
def hf_dataset_source(name: str, split: str = "train", field: str = "text", limit: int = 10_000,
                      **kwargs: Any) -> TextSource:
    """Write ``limit`` documents of a Hugging Face dataset to a local text file and read it as bytes
    (needs a hub or the datasets cache; raises a clear error without)."""
    for key, value in (("name", name), ("split", split), ("field", field)):
        if not value:
            raise BadInputError(f"hf_dataset_source: {key}='' is empty; pass the dataset's {key}")
    if limit < 1:
        raise BadInputError(f"hf_dataset_source: limit={limit!r} must be >= 1 (documents to write)")
    try:
        import datasets  # optional: only this function needs it (pip install datasets)

        ds = datasets.load_dataset(name, split=split, streaming=True)
        docs = [row[field] for _, row in zip(range(limit), ds)]
    except Exception as e:  # datasets raises many types when offline
        raise BadInputError(
            f"could not load dataset {name!r} ({type(e).__name__}: {str(e)[:200]}); without network access "
            "use TextSource(path) on a local text file"
        ) from None
    path = Path(tempfile.mkdtemp()) / "data.txt"
    path.write_text("\n\n".join(docs))
    return TextSource(str(path), **kwargs)


def _check_bos(where: str, bos_id: Optional[int]) -> None:
    """Refuse a source's ``bos`` field (a token id, or None) below 0."""
    if bos_id is not None and bos_id < 0:
        raise ConfigError(f"{where}.bos={bos_id!r} must be None or a token id >= 0")


Source = Union[MarkovSource, BigramBackcopy, TextSource]
