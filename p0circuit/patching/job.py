"""One patching job: validated arguments, the prepared corruption, and the clean and corrupted
runs cached once and shared by every patch of the call.

Every method (:mod:`p0circuit.patching.methods`) follows the same three steps::

    job = PatchJob(model, tokens, options)                # options: PatchOptions (patching.options)
    live = [n for n in nodes if job.reaches(site_of(n, model).hook)]
    job.cache(hooks the live patches read)               # two cached forwards, stopped at the metric
    ops = [node_op(job, ...) or edge_op(job, ...)]       # p0circuit.patching.ops
    job.result(method, level, raw=job.patch_each(ops), corrupted=job.corrupted_metric(...), candidates=...)

so a new method is one file that builds its patch ops. A patch that cannot reach anything the
metric reads (a node in a block after the metric's, say) changes nothing, by causality: it is not
run, and :meth:`PatchJob.result` gives it the base run's metric exactly (effect 0). The reference
path (``reference=True``) runs every patch, so the tests can check that this is exact.
"""

import math
from contextlib import contextmanager
from functools import partial
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import Tensor
from p0circuit.core.progress import tqdm

from p0circuit.core.errors import NonFiniteError, non_finite_fix
from p0circuit.core.hooks import HookRef
from p0circuit.patching.setup import Setup
from p0circuit.patching.engine import (
    BaseRun, PatchOp, apply_ops, base_hooks, cache_run, reaches, run_groups, run_groups_reference, stop_layer,
)
from p0circuit.patching.hooking import attached
from p0circuit.patching.options import PatchOptions
from p0circuit.patching.metrics import RunView
from p0circuit.patching.result import PatchResult, make_result
from p0circuit.patching.shape import BlockShape


def _check_finite_run(model: Any, run: str, cache: dict[str, Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming the first cached hook (in forward order: the model's
    hook points are registered module by module) with NaN or inf."""
    order = {name: i for i, name in enumerate(model.hook_dict)}
    names = sorted(cache, key=lambda n: order.get(n, len(order)))
    for name in names:
        if cache[name].is_floating_point() and not bool(torch.isfinite(cache[name]).all()):
            raise NonFiniteError(non_finite_fix(model.cfg.dtype, f"NaN or inf first appears at {name!r} in the {run} "
                                                                 "run (the hooks before it are finite)"))


class PatchJob:
    """Clean and corrupted caches for one (model, tokens, corruption, metric), built once.

    The constructor checks the model, the tokens (against ``options.bos``) and the metric against
    the model (:class:`PatchOptions` checked the rest when it was made); :meth:`cache` runs the
    two forwards. ``cache`` may be called again with more hooks; hooks already cached are not rerun.
    """

    def __init__(self, model: Any, tokens: Any, options: PatchOptions) -> None:
        self._start(Setup.check(model, tokens, options))  # every check, once, before any forward

    @classmethod
    def of(cls, setup: Setup) -> "PatchJob":
        """The job of a checked :class:`Setup` (a result's: nothing is checked again)."""
        job = cls.__new__(cls)
        job._start(setup)
        return job

    @classmethod
    def start(cls, model: Any, tokens: Any, options: PatchOptions, setup: Optional[Setup]) -> "PatchJob":
        """A method's job: of its ``setup=`` when it was given one (checked already), else of its model, tokens and
        options, checked here."""
        return cls.of(setup) if setup is not None else cls(model, tokens, options)

    def _start(self, setup: Setup) -> None:
        model, options = setup.model, setup.options
        self.setup = setup
        self.model, self.tokens, self.metric, self.prep, self.options = (
            setup.model, setup.tokens, setup.metric, setup.prep, setup.options)
        self.direction = options.direction
        rows = options.rows_per_forward
        self.rows_per_forward = 8 * self.tokens.shape[0] if rows is None else rows
        self.min_signal = options.min_signal
        self.reference = options.reference
        self.progress = options.progress
        self._bar: Optional[tqdm] = None
        self._values: dict[tuple[str, str, tuple[int, ...]], Tensor] = {}  # corrupted_value, clean_value
        self.stop = None if self.reference else stop_layer(model, self.metric)
        self.clean: dict[str, Tensor] = {}
        self.corr: Optional[dict[str, Tensor]] = None
        self.clean_logits: Optional[Tensor] = None
        self.corr_logits: Optional[Tensor] = None
        self.clean_metric = float("nan")
        self.base_metric = float("nan")
        self._cached: set[str] = set()

    @property
    def receiver_layers(self) -> Optional[int]:
        """How many blocks, from block 0, hold receivers that can change the metric: what the default
        candidates span, the same on the reference path (``reference`` changes only how)."""
        return stop_layer(self.model, self.metric)

    def reaches(self, hook: HookRef) -> bool:
        """Whether a patch at ``hook`` can change the metric (always, on the reference path)."""
        return self.reference or reaches(self.model, hook, self.metric)

    def cache(self, extra: set[str]) -> "PatchJob":
        """Run the clean (and corrupted) prompts once, up to the last block the metric reads,
        keeping the engine's hooks and ``extra`` (nothing is rerun when those are cached already)."""
        names = base_hooks(self.model.cfg.n_layers, self.metric, [], self.stop, BlockShape.of(self.model).attn_only) | extra
        if names <= self._cached:
            return self
        names |= self._cached
        self._cached = names
        with torch.no_grad():
            kv = not self.reference  # the fast path's suffix forwards attend to these keys and values
            store = self.setup.clean  # inside sharing_clean: the same clean run under another corruption
            kept = None if store is None else store.take(names, self.stop, kv)
            if kept is None:
                self.clean, self.clean_logits = cache_run(self.model, self.prep.clean_tokens, names, self.stop, kv)
                if store is not None:
                    store.keep(names, self.stop, kv, self.clean, self.clean_logits)
            else:
                held, self.clean, self.clean_logits = kept
                self._cached = names = set(held)
            if self.prep.corrupt_tokens is not None:
                self.corr, self.corr_logits = cache_run(self.model, self.prep.corrupt_tokens, names, self.stop, kv)
        for run, cache in (("clean", self.clean), ("corrupted", self.corr)):
            _check_finite_run(self.model, run, cache or {})
        self._baseline()
        return self

    def _baseline(self) -> None:
        """The clean and base runs' metric, from the cached runs (refused where the metric makes them non-finite)."""
        self.clean_metric = self.metric_of(self.clean, self.clean_logits, 0)
        base = self.base()
        self.base_metric = self.clean_metric if base.cache is self.clean else self.metric_of(base.cache, base.logits,
                                                                                           base.p0)
        for run, value in (("clean", self.clean_metric), ("base", self.base_metric)):
            if not math.isfinite(value):
                raise NonFiniteError(f"the metric {self.metric.name} is {value} on the {run} run although every cached "
                                     "activation is finite: the metric itself produces it (e.g. 0/0); fix the metric")

    def measuring(self, metric: Any) -> "PatchJob":
        """This job's runs read by another ``metric`` (:meth:`Setup.measuring`, checked there): the cached clean and
        corrupted activations are shared, not run again, where the new metric's runs stop at the same block and read
        nothing this job did not cache; otherwise the new job caches its own runs. Its values are the numbers a fresh
        job of that setup gives (the same forwards, run once)."""
        job = PatchJob.of(self.setup.measuring(metric))
        names = base_hooks(self.model.cfg.n_layers, job.metric, [], job.stop, BlockShape.of(self.model).attn_only)
        if job.stop != self.stop or job.direction != self.direction or not self._cached or not names <= self._cached:
            return job.cache(self._cached)
        job.clean, job.corr, job.clean_logits, job.corr_logits = self.clean, self.corr, self.clean_logits, self.corr_logits
        job._cached, job._values = set(self._cached), self._values  # the prepared corrupted values too: metric-free
        job._baseline()
        return job

    @property
    def offset(self) -> int:
        """Corrupted index of clean position 0 (:attr:`Prepared.p0`)."""
        return self.prep.p0

    @property
    def seq_len(self) -> int:
        """Length of the clean prompts."""
        return int(self.prep.clean_tokens.shape[1])

    def metric_of(self, cache: dict[str, Tensor], logits: Optional[Tensor], p0: int) -> float:
        """The metric of a cached run."""
        names = [h.name for h in self.metric.needs(self.model.cfg.n_layers)]
        return float(self.metric(RunView({n: cache[n] for n in names}, logits, p0)))

    def corrupted_value(self, hook: str, positions: list[int]) -> Tensor:
        """The corrupted activation of ``hook`` at clean-frame ``positions``, computed once per hook and
        positions: the ops of one hook's heads or neurons take views of it, so 32,768 neuron ops at one
        position hold one ``[batch, 1, d_mlp]`` tensor per MLP, not one each (8.6 GB at Llama-3.2-1B's width)."""
        key = ("corrupted", hook, tuple(positions))
        if key not in self._values:
            self._values[key] = self.prep.corrupted_value(self.clean[hook], None if self.corr is None else self.corr[hook],
                                                          positions)
        return self._values[key]

    def clean_value(self, hook: str, positions: list[int]) -> Tensor:
        """The clean activation of ``hook`` at ``positions``, once per hook and positions (as :meth:`corrupted_value`)."""
        key = ("clean", hook, tuple(positions))
        if key not in self._values:
            self._values[key] = self.clean[hook][:, positions]
        return self._values[key]

    def base(self) -> BaseRun:
        """The run patches go into: clean for ``noise``, corrupted for ``denoise``."""
        if self.direction == "noise":
            return BaseRun(self.model, self.clean, self.metric, 0, self.clean_logits, self.prep.clean_tokens)
        return BaseRun(self.model, self.corr, self.metric, self.offset, self.corr_logits,  # type: ignore[arg-type]
                       self.prep.corrupt_tokens)

    def clean_base(self, patched: Sequence[PatchOp] = ()) -> BaseRun:
        """The clean run as a base for ablations applied all at once (the fully corrupted reference of
        an ablation, faithfulness curves); without logits, so every forward runs whole prompts.

        With ``patched`` ops, the base is a new clean run with those applied (cached like the clean
        run, keys and values included): a later group then runs only from its own first block, the
        blocks before it taken from this run (the circuit search fixes the nodes it dropped in bulk)."""
        if not patched:
            return BaseRun(self.model, self.clean, self.metric, 0, None, self.prep.clean_tokens)
        by_hook: dict[str, list[tuple[slice, PatchOp]]] = {}
        for op in patched:
            by_hook.setdefault(op.hook.name, []).append((slice(None), op))
        with torch.no_grad(), attached(self.model, [(name, partial(apply_ops, ops)) for name, ops in by_hook.items()]):
            cache, _ = cache_run(self.model, self.prep.clean_tokens, set(self._cached), self.stop, kv=True)
        return BaseRun(self.model, cache, self.metric, 0, None, self.prep.clean_tokens)

    @contextmanager
    def tracking(self, total: int, what: str) -> Iterator[None]:
        """A progress bar (with an ETA) over ``total`` patches while the block runs, when the job
        was made with ``progress=True``; :meth:`patch_each` advances it."""
        self._bar = tqdm(total=total, desc=what, unit="patch", disable=not self.progress, mininterval=0.5)
        try:
            yield
        finally:
            self._bar.close()
            self._bar = None

    def advance(self, n: int) -> None:
        """Move the progress bar of :meth:`tracking` on by ``n``."""
        if self._bar is not None:
            self._bar.update(n)

    def patch_each(self, ops: Sequence[PatchOp]) -> list[float]:
        """Metric of the base run with each op applied alone (the slow path with ``reference``)."""
        base = self.base()
        groups = [[op] for op in ops]
        if self.reference:
            values = run_groups_reference(self.model, base.tokens, groups, self.metric, base.p0)
            self.advance(len(groups))
            return values
        return run_groups(base, groups, self.rows_per_forward, self.advance)

    def corrupted_metric(self, full: Sequence[PatchOp]) -> float:
        """Metric of the fully corrupted reference: the corrupted run, or for an ablation the clean
        run with every op of ``full`` (each candidate ablated) applied at once."""
        if not self.prep.is_ablation:
            return self.metric_of(self.corr, self.corr_logits, self.offset)  # type: ignore[arg-type]
        if self.reference:  # the slow path's own reference: one ordinary hooked forward
            return run_groups_reference(self.model, self.prep.clean_tokens, [list(full)], self.metric, 0)[0]
        return run_groups(self.clean_base(), [list(full)], self.rows_per_forward)[0]

    def result(self, method: str, level: str, raw: dict[str, float], corrupted: float,
               candidates: Optional[Sequence[str]] = None, min_signal: Optional[float] = None,
               **settings: Any) -> PatchResult:
        """Normalize ``raw`` against this job's clean and base runs (:func:`p0circuit.patching.result.make_result`)."""
        return make_result(self.setup, self.clean_metric, self.base_metric, method, level, raw, corrupted,
                           candidates, self.min_signal if min_signal is None else min_signal, **settings)
