"""Clean and corrupted runs of one patching job, cached once and shared by every method."""

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from p0circuit.errors import BadInputError, ConfigError
from p0circuit.patching.corruptions import Corruption, Prepared, get_corruption
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
    model: Any, tokens: Tensor, corruption: Union[str, Corruption], metric: Optional[PatchMetric], direction: str
) -> tuple[Tensor, PatchMetric, Prepared]:
    """Validate the common arguments of every patching method."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2)
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
