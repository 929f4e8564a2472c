"""Work counted, not timed: how many forwards of a prompt batch a piece of code ran.

:class:`Count` puts forward pre-hooks on every block's attention and MLP and on the unembedding
while it is open, and adds up the token rows each call processes, weighted by that module's share of
a forward's multiply-adds (from the model's shapes). Divided by one forward of the batch (every
block and the unembedding over ``batch x positions`` tokens) that is the work in *forwards of the
batch*, the same whatever else the machine is doing: two identical runs count the same.

What it counts: each attention call by its query rows (a suffix forward over cached keys counts its
suffix), each MLP call by its rows (a mixture of experts as its chosen experts' share), the
unembedding by its rows. Work done with a graph recorded (attribution, integrated gradients) is also
counted apart (``with_grad``): its backward, about twice it, is not seen by forward hooks and is not
counted. A call of a few rows costs about the read of its weights, not its rows' products, so each call
is also counted once whatever its rows (:meth:`Count.passes`: a forward of any batch reads every weight
once): a trace of tiny forwards (``patching/order.py``) is small in rows and large in passes. What it
leaves out: work done outside these modules (the engine's own sums of a head's output, the norms, the
embeddings), which is small against them.
"""

from typing import Any

import torch
from torch import Tensor

from p0circuit.core.hooks import OBSERVES
from p0circuit.patching.shape import BlockShape


def shares(model: Any) -> dict[str, float]:
    """Multiply-adds per token of one block's attention (``attn``), one block's MLP (``mlp``) and the
    unembedding (``unembed``), from ``model.cfg``'s shapes."""
    cfg, shape = model.cfg, BlockShape.of(model)
    d, heads, kv = cfg.d_model, cfg.n_heads, shape.kv_weights
    mlp = 0 if shape.attn_only else d * cfg.d_mlp * (3 if shape.gated else 2) * shape.experts_per_token
    return {"attn": float(d * cfg.d_head * (2 * heads + 2 * kv)), "mlp": float(mlp), "unembed": float(d * cfg.d_vocab)}


def forward_work(model: Any, rows: int) -> float:
    """The weighted work of one forward of ``rows`` token rows (every block and the unembedding)."""
    s = shares(model)
    return rows * (model.cfg.n_layers * (s["attn"] + s["mlp"]) + s["unembed"])


class Count:
    """``with Count(model) as c: ...`` then ``c.forwards(rows)``: the work done inside, in forwards of
    ``rows`` token rows (a batch of ``B`` prompts of ``P`` positions: ``B * P``); ``c.work`` by module kind.
    Counts nest (each open count sees every call)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.work = {"attn": 0.0, "mlp": 0.0, "unembed": 0.0, "with_grad": 0.0}
        self.reads = 0.0  # each call's weight once (its share per token), whatever its rows
        self._handles: list[Any] = []

    def _hook(self, kind: str, weight: float):
        def pre(_module: Any, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else next(iter(kwargs.values()), None)  # attention takes query_input=... by keyword
            if not isinstance(x, Tensor) or x.dim() < 2:
                return
            w = weight * x.shape[0] * x.shape[1]
            self.work[kind] += w
            self.reads += weight
            if torch.is_grad_enabled() and x.requires_grad:  # a graph is recorded: a backward may follow
                self.work["with_grad"] += w
        setattr(pre, OBSERVES, True)  # reads shapes only: the fast path's check of the user's hooks passes it
        return pre

    def __enter__(self) -> "Count":
        s = shares(self.model)
        for block in self.model.blocks:
            self._handles.append(block.attn.register_forward_pre_hook(self._hook("attn", s["attn"]), with_kwargs=True))
            if BlockShape.of(self.model).has_mlp:
                self._handles.append(block.mlp.register_forward_pre_hook(self._hook("mlp", s["mlp"]), with_kwargs=True))
        self._handles.append(self.model.unembed.register_forward_pre_hook(self._hook("unembed", s["unembed"]), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def forwards(self, rows: int) -> float:
        """The forward work counted, in forwards of ``rows`` token rows."""
        return sum(self.work[k] for k in ("attn", "mlp", "unembed")) / forward_work(self.model, rows)

    def passes(self) -> float:
        """The calls counted once each, whatever their rows, in forwards (one forward reads every block and the
        unembedding once): what the calls cost where the weights' reads, not the rows, dominate."""
        return self.reads / forward_work(self.model, 1)

    def with_grad(self, rows: int) -> float:
        """Of :meth:`forwards`, the work done with a graph recorded (a backward, about twice it, usually follows;
        it is not counted)."""
        return self.work["with_grad"] / forward_work(self.model, rows)
