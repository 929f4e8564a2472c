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
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import Tensor
from p0circuit.core.progress import tqdm

from p0circuit.core.errors import BadInputError, ConfigError, NonFiniteError
from p0circuit.core.hooks import HookRef
from p0circuit.models.checks import check_model
from p0circuit.patching.corruptions import Prepared, advice, get_corruption
from p0circuit.patching.hooking import user_hooks
from p0circuit.patching.engine import BaseRun, PatchOp, base_hooks, cache_run, reaches, run_groups, run_groups_reference, stop_layer
from p0circuit.patching.options import PatchOptions
from p0circuit.patching.metrics import PatchMetric, RunView, check_metric, default_metric, resolve_metric
from p0circuit.patching.result import PatchResult, normalize
from p0circuit.models.tokens import bos_id, check_tokens


def _check_finite_run(model: Any, run: str, cache: dict[str, Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming the first cached hook (in forward order: the model's
    hook points are registered module by module) with NaN or inf."""
    order = {name: i for i, name in enumerate(model.hook_dict)}
    names = sorted(cache, key=lambda n: order.get(n, len(order)))
    for name in names:
        if cache[name].is_floating_point() and not bool(torch.isfinite(cache[name]).all()):
            raise NonFiniteError(
                f"NaN or inf first appears at {name!r} in the {run} run (the hooks before it are finite): check "
                "that block's weights (torch.isfinite(p).all() for its parameters) and the dtype (float16 overflows "
                "on large P0 norms: use float32)")


class PatchJob:
    """Clean and corrupted caches for one (model, tokens, corruption, metric), built once.

    The constructor checks the model, the tokens (against ``options.bos``) and the metric against
    the model (:class:`PatchOptions` checked the rest when it was made); :meth:`cache` runs the
    two forwards. ``cache`` may be called again with more hooks; hooks already cached are not rerun.
    """

    def __init__(self, model: Any, tokens: Any, options: PatchOptions) -> None:
        if not isinstance(options, PatchOptions):
            raise ConfigError(f"PatchJob takes a PatchOptions, got {type(options).__name__}")
        check_model(model)
        self.model = model
        self.options = options
        self.tokens: Tensor = check_tokens(model, tokens, min_len=2, bos=options.bos)
        metric = resolve_metric(options.metric, model)  # a metric by name, as corruptions are: "norm_ratio:2"
        self.metric: PatchMetric = metric if metric is not None else default_metric(model.cfg.n_layers)
        check_metric(self.metric, model)
        self.direction = options.direction
        rows = options.rows_per_forward
        self.rows_per_forward = 8 * self.tokens.shape[0] if rows is None else rows
        self.min_signal = options.min_signal
        self.reference = reference = options.reference
        left = user_hooks(model)
        if left and not reference:
            raise BadInputError(
                f"the model carries hooks of its own at {', '.join(left[:5])}{' and more' if len(left) > 5 else ''}: the "
                "fast path runs only the blocks and positions a patch can change and reuses cached activations, so "
                "those hooks would fire on other tensors than in a full forward. Remove them (model.reset_hooks("
                "including_permanent=True)), or pass reference=True, which runs every patch as a full forward with them")
        self.progress = options.progress
        self._bar: Optional[tqdm] = None
        self.stop = None if reference else stop_layer(model, self.metric)
        self.prep: Prepared = get_corruption(options.corruption).prepare(model, self.tokens)
        if self.direction == "denoise" and self.prep.is_ablation:
            raise ConfigError(
                f"direction='denoise' needs a corrupted run, but {self.prep.name!r} is an ablation of the clean "
                "run; use direction='noise' or corruption 'shift'/'resample'"
            )
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
        names = base_hooks(self.model.cfg.n_layers, self.metric, [], self.stop, bool(self.model.cfg.attn_only)) | extra
        if names <= self._cached:
            return self
        names |= self._cached
        self._cached = names
        with torch.no_grad():
            kv = not self.reference  # the fast path's suffix forwards attend to these keys and values
            self.clean, self.clean_logits = cache_run(self.model, self.prep.clean_tokens, names, self.stop, kv)
            if self.prep.corrupt_tokens is not None:
                self.corr, self.corr_logits = cache_run(self.model, self.prep.corrupt_tokens, names, self.stop, kv)
        for run, cache in (("clean", self.clean), ("corrupted", self.corr)):
            _check_finite_run(self.model, run, cache or {})
        self.clean_metric = self.metric_of(self.clean, self.clean_logits, 0)
        base = self.base()
        self.base_metric = self.clean_metric if base.cache is self.clean else self.metric_of(base.cache, base.logits,
                                                                                           base.p0)
        for run, value in (("clean", self.clean_metric), ("base", self.base_metric)):
            if not math.isfinite(value):
                raise NonFiniteError(f"the metric {self.metric.name} is {value} on the {run} run although every cached "
                                     "activation is finite: the metric itself produces it (e.g. 0/0); fix the metric")
        return self

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
        """The corrupted activation of ``hook`` at clean-frame ``positions``."""
        return self.prep.corrupted_value(self.clean[hook], None if self.corr is None else self.corr[hook], positions)

    def base(self) -> BaseRun:
        """The run patches go into: clean for ``noise``, corrupted for ``denoise``."""
        if self.direction == "noise":
            return BaseRun(self.model, self.clean, self.metric, 0, self.clean_logits, self.prep.clean_tokens)
        return BaseRun(self.model, self.corr, self.metric, self.offset, self.corr_logits,  # type: ignore[arg-type]
                       self.prep.corrupt_tokens)

    def clean_base(self) -> BaseRun:
        """The clean run as a base for ablations applied all at once (the fully corrupted reference of
        an ablation, faithfulness curves); without logits, so every forward runs whole prompts."""
        return BaseRun(self.model, self.clean, self.metric, 0, None, self.prep.clean_tokens)

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
        """Normalize ``raw`` and wrap everything in a :class:`PatchResult` of ``level`` node or edge.

        ``candidates`` (default: the names in ``raw``) fixes the order; a candidate missing from
        ``raw`` was not run because it cannot reach the metric, and gets the base run's metric.
        ``min_signal`` overrides the options' (a screen that wants every estimate passes 0)."""
        names = list(raw) if candidates is None else list(candidates)
        bad = [n for n, v in raw.items() if not math.isfinite(v)]
        if bad or not math.isfinite(corrupted):
            where = f"patching {bad[0]} ({len(bad)} of {len(raw)} patches)" if bad else "the fully corrupted run"
            raise NonFiniteError(f"the metric {self.metric.name} is NaN or inf after {where}: a patched value overflows "
                                 "or the metric divides by zero there; check the metric and the model's dtype "
                                 "(float16 overflows on large P0 norms: use float32)")
        unreachable = [n for n in names if n not in raw]
        raw = {n: raw.get(n, self.base_metric) for n in names}
        settings = {**settings, "unreachable": len(unreachable)}
        bos = bos_id(self.model)
        at_p0 = bos is not None and bool((self.prep.clean_tokens[:, 0] == bos).all())
        norm, signal, msg = normalize(self.clean_metric, corrupted, raw, self.direction,
                                        self.min_signal if min_signal is None else min_signal,
                                      advice(self.prep.name, at_p0))
        tokens = self.prep.clean_tokens
        return PatchResult(
            method=method, level=level, corruption=self.prep.name, metric=self.metric.name,
            direction=self.direction, clean_metric=self.clean_metric, corrupted_metric=corrupted, raw=raw,
            normalized=norm, signal=signal, message=msg,
            settings={**settings, "corruption_params": self.prep.corruption.params(), "metric_params": self.metric.params(),
                      "n_prompts": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
                      "n_layers": int(self.model.cfg.n_layers), "n_heads": int(self.model.cfg.n_heads)},
        )
