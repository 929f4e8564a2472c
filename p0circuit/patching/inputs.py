"""A patching call's inputs, checked once where they enter: the model, the tokens (against the
run's BOS claim), the metric (by name or object, against the model), the prepared corruption and
the options. Every later step (:class:`~p0circuit.patching.job.PatchJob`, the methods) takes this
checked value and checks nothing again."""

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from p0circuit.core.errors import BadInputError, ConfigError
from p0circuit.models.checks import check_model
from p0circuit.models.tokens import check_tokens
from p0circuit.patching.corruptions import Prepared, get_corruption
from p0circuit.patching.hooking import user_hooks
from p0circuit.patching.metrics import PatchMetric, check_metric, default_metric, resolve_metric
from p0circuit.patching.options import PatchOptions


@dataclass(frozen=True)
class PatchInputs:
    """What one patching call runs on, checked (make it with :meth:`check`)."""

    model: Any
    tokens: Tensor
    """The clean prompts ``[batch, pos]``, checked against the model and ``options.bos``."""
    metric: PatchMetric
    """The metric object (a name resolved; None replaced by the default), checked against the model."""
    prep: Prepared
    """The corruption's prepared runs and alignment."""
    options: PatchOptions

    @classmethod
    def check(cls, model: Any, tokens: Any, options: PatchOptions) -> "PatchInputs":
        """Check everything a patching call is given, before any forward runs."""
        if not isinstance(options, PatchOptions):
            raise ConfigError(f"a patching call takes a PatchOptions, got {type(options).__name__}")
        check_model(model)
        tokens = check_tokens(model, tokens, min_len=2, bos=options.bos)
        metric = resolve_metric(options.metric, model)  # a metric by name, as corruptions are: "norm_ratio:2"
        metric = metric if metric is not None else default_metric(model.cfg.n_layers)
        check_metric(metric, model)
        left = user_hooks(model)
        if left and not options.reference:
            raise BadInputError(
                f"the model carries hooks of its own at {', '.join(left[:5])}{' and more' if len(left) > 5 else ''}: the "
                "fast path runs only the blocks and positions a patch can change and reuses cached activations, so "
                "those hooks would fire on other tensors than in a full forward. Remove them (model.reset_hooks("
                "including_permanent=True)), or pass reference=True, which runs every patch as a full forward with them")
        prep = get_corruption(options.corruption).prepare(model, tokens)
        if options.direction == "denoise" and prep.is_ablation:
            raise ConfigError(
                f"direction='denoise' needs a corrupted run, but {prep.name!r} is an ablation of the clean "
                "run; use direction='noise' or corruption 'shift'/'resample'"
            )
        return cls(model, tokens, metric, prep, options)
