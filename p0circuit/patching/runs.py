"""Clean and corrupted runs of one patching job, cached once and shared by every method."""

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.errors import ConfigError
from p0circuit.patching.corruptions import Prepared, get_corruption
from p0circuit.patching.engine import base_hooks, cache_run
from p0circuit.patching.metrics import PatchMetric, RunView, default_metric
from p0circuit.tokens import check_tokens
from p0circuit.validation import check_metric, check_model


class Runs:
    """Clean and corrupted caches for one (model, tokens, corruption, metric), built once."""

    def __init__(self, model: Any, prep: Prepared, metric: PatchMetric, extra: set[str]) -> None:
        self.model, self.prep, self.metric = model, prep, metric
        names = base_hooks(model.cfg.n_layers, metric, []) | extra
        with torch.no_grad():
            self.clean, self.clean_logits = cache_run(model, prep.clean_tokens, names)
            self.corr: Optional[dict[str, Tensor]] = None
            self.corr_logits: Optional[Tensor] = None
            if prep.corrupt_tokens is not None:
                self.corr, self.corr_logits = cache_run(model, prep.corrupt_tokens, names)
        self.clean_metric = self.metric_of(self.clean, self.clean_logits, 0)

    def metric_of(self, cache: dict[str, Tensor], logits: Tensor, p0: int) -> float:
        names = [h.name for h in self.metric.needs(self.model.cfg.n_layers)]
        return float(self.metric(RunView({n: cache[n] for n in names}, logits, p0)))

    def corrupted_value(self, hook: str, positions: list[int]) -> Tensor:
        """The corrupted activation of ``hook`` at clean-frame ``positions``."""
        return self.prep.corrupted_value(self.clean[hook], None if self.corr is None else self.corr[hook], positions)


def rows_per(rows_per_forward: Optional[int], tokens: Tensor) -> int:
    """Rows of one patched forward: ``rows_per_forward``, or 8 copies of the prompts by default."""
    if rows_per_forward is None:
        return 8 * tokens.shape[0]
    if rows_per_forward < 1:
        raise ConfigError(f"rows_per_forward must be >= 1, got {rows_per_forward}")
    return rows_per_forward




def setup(
    model: Any, tokens: Any, corruption: Any, metric: Any, direction: str, bos: Any = None,
) -> tuple[Tensor, PatchMetric, Prepared]:
    """Validate the common arguments of every patching method (``bos``: the run's BOS choice,
    checked against the clean tokens; None makes no claim)."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    metric = metric if metric is not None else default_metric(model.cfg.n_layers)
    check_metric(metric, model)
    if direction not in ("noise", "denoise"):
        raise ConfigError(f"direction must be 'noise' or 'denoise', got {direction!r}")
    prep = get_corruption(corruption).prepare(model, tokens)
    if direction == "denoise" and prep.ablation is not None:
        raise ConfigError(
            f"direction='denoise' needs a corrupted run, but {prep.name!r} is an ablation of the clean "
            "run; use direction='noise' or corruption 'shift'/'resample'"
        )
    return tokens, metric, prep


def corrupted_metric(runs: Runs, full: Sequence[Any], rows_per_forward: Optional[int]) -> float:
    """Metric of the fully corrupted reference: the corrupted run, or the clean run with every
    op of ``full`` (each candidate ablated) applied at once."""
    from p0circuit.patching.engine import run_groups

    prep = runs.prep
    if prep.ablation is None:
        return runs.metric_of(runs.corr, runs.corr_logits, prep.offset)  # type: ignore[arg-type]
    return run_groups(runs.model, runs.clean, [list(full)], runs.metric, 0, rows_per(rows_per_forward, prep.clean_tokens))[0]


def patch_each(runs: Runs, ops: Sequence[Any], direction: str, rows_per_forward: Optional[int], reference: bool) -> list[float]:
    """Metric of the base run (clean for ``noise``, corrupted for ``denoise``) with each op alone."""
    from p0circuit.patching.engine import run_groups, run_groups_reference

    prep = runs.prep
    groups = [[op] for op in ops]
    if direction == "noise":
        base_cache, base_tokens, base_logits, p0 = runs.clean, prep.clean_tokens, runs.clean_logits, 0
    else:
        base_cache, base_tokens, base_logits, p0 = runs.corr, prep.corrupt_tokens, runs.corr_logits, prep.offset  # type: ignore[assignment]
    if reference:
        return run_groups_reference(runs.model, base_tokens, groups, runs.metric, p0)
    return run_groups(runs.model, base_cache, groups, runs.metric, p0, rows_per(rows_per_forward, prep.clean_tokens),
                      base_logits)


def make_result(
    method: str, runs: Runs, raw: dict[str, float], corrupted: float, direction: str, min_signal: float,
    **settings: Any,
) -> Any:
    """Normalize ``raw`` and wrap everything in a :class:`PatchResult`."""
    from p0circuit.patching.result import PatchResult, normalize

    prep, tokens = runs.prep, runs.prep.clean_tokens
    norm, signal, msg = normalize(runs.clean_metric, corrupted, raw, direction, min_signal)
    return PatchResult(
        method=method, corruption=prep.name, metric=runs.metric.name, direction=direction,
        clean_metric=runs.clean_metric, corrupted_metric=corrupted, raw=raw, normalized=norm, signal=signal,
        message=msg, settings={**settings, "corruption_params": dict(prep.params), "n_prompts": int(tokens.shape[0]),
                               "seq_len": int(tokens.shape[1])},
    )
