"""Metrics for patching: sink-native ones and any user callable.

A patching metric maps one (possibly patched) run to a scalar. The run is seen through a
:class:`RunView`: the activations the metric declared in :meth:`PatchMetric.needs`, the logits
when it needs them, and ``p0``, the index at which the clean prompt's first token sits in this run
(0 in the clean run, ``k`` in a run shifted by ``k`` tokens). Sink metrics are measured at ``p0``,
so a shifted run is compared with the clean one token by token, not index by index.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Any, Callable, Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor

from p0circuit.core.entries import METRICS, check_metric_entry
from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError, ConfigError, MissingHookError
from p0circuit.core.args import entry_point
from p0circuit.core.args import METRIC_FIX, at_least
from p0circuit.core.hooks import HookRef
from p0circuit.core.io import describe
from p0circuit.core.names import SINK_HEADS_ATTR
from p0circuit.patching.order import hook_order
from p0circuit.patching.shape import BlockShape


@entry_point
@dataclass
class RunView:
    """What a metric sees of one run: declared activations, logits, and the P0 index."""

    acts: dict[str, Tensor]
    """Hook name -> activation ``[batch, ...]``."""
    logits: Optional[Float[Tensor, "batch pos vocab"]]
    """Logits ``[batch, pos, d_vocab]`` when the metric needs them."""
    p0: int = 0
    """Index of the clean prompt's first token in this run."""

    def __post_init__(self) -> None:
        at_least("RunView", "p0", self.p0, 0, "positions count from 0")


def too_short(needs: str, view: RunView, left: int) -> BadInputError:
    """The error of a metric that finds too few positions from the run's P0 on (``left``): in the clean run the prompts
    are too short; in a run that puts the clean first token later (``view.p0`` > 0: an aligned, corrupted run) the
    prompts may be long enough and the corruption's alignment is what leaves too few."""
    if view.p0:
        return BadInputError(f"{needs}, but this run puts the clean first token at index {view.p0}, leaving {left} "
                             "position(s) from it on: the corruption's alignment (its Prepared offset= or align=) maps "
                             "the clean positions past the run's end; check that alignment, or use a corruption that "
                             "keeps the positions after P0")
    return BadInputError(f"{needs}; the prompts have {left} token(s): use longer prompts")


class PatchMetric:
    """Base class: declare needed hooks, return a 0-dim tensor for a :class:`RunView`."""

    needs_logits: bool = False
    name: str = "metric"
    signal_unit: ClassVar[str] = ""
    """How ``min_signal`` judges this metric's clean-to-corrupted change: empty, relative to the larger of
    |clean| and |corrupted| (ratios and shares, whose scale is their size); a unit (``"logits"``), an
    absolute change in that unit (a logit difference can sit near 0 while a change of 0.45 is plain signal)."""

    def needs(self, n_layers: int) -> list[HookRef]:
        """Hooks this metric reads."""
        return []

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        raise NotImplementedError

    def per_prompt(self, view: RunView) -> Optional[Float[Tensor, " batch"]]:
        """The metric of each prompt, where the metric is their mean (the built-in sink metrics), else None: what
        an interval over prompts (:class:`PerPrompt`) is computed from."""
        return None

    def validate(self, n_layers: int, n_heads: int) -> None:
        """Raise a clear error if the metric does not fit the model."""

    def params(self) -> dict[str, Any]:
        """Every setting, for the record (JSON-able, :func:`p0circuit.core.io.describe`: a function by where
        it is defined): the public fields of a dataclass metric, else its instance attributes.
        Results carry it beside the name, and comparisons of results match on it."""
        fields = describe(self) if dataclasses.is_dataclass(self) else describe(vars(self))
        return fields if isinstance(fields, dict) else {}

    def residual_reads(self, n_layers: int) -> list[int]:
        """The blocks whose output (the residual stream, ``resid_post``) this metric reads itself: the
        receivers of the direct edges into the metric (``A1.H2@0->R2@0.resid``), a sender's write
        that reaches the metric bypassing every later component. A metric on the logits reads the
        last block's output (through the final norm and the unembedding)."""
        if self.needs_logits:
            return [n_layers - 1]
        return sorted({h.layer for h in self.needs(n_layers) if h.name == hooks.resid_post(h.layer)})

    def attention_reads(self, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
        """The (layer, head) pairs whose attention pattern this metric reads itself: their query and key inputs
        are what the metric reads, as a block's output is for :meth:`residual_reads`, so a circuit's edges into
        them (``M1@0->A3.H0@0.k``) are candidates of its edge search. None by default."""
        return []

    def last_position(self, p0: int) -> Optional[int]:
        """The last sequence position this metric reads in a run whose clean first token sits at
        ``p0``, or None when it may read any (the default). Under the causal mask no position sees a
        later one, so the fast path runs only positions up to this one and gives a patch of later
        positions its exact effect, 0, without a forward. Positions a forward did not run read as
        NaN, and a metric whose value on the base run changes when the later positions are hidden
        is refused before any patched forward."""
        return None


def _check_layer(layer: int, n_layers: int, what: str) -> None:
    if not 0 <= layer < n_layers:
        raise BadInputError(f"{what}: layer {layer} is outside 0..{n_layers - 1} for this model")


@entry_point
@dataclass
class NormRatio(PatchMetric):
    """``||h_k|| / mean_{t != k} ||h_t||`` of ``resid_post`` at ``layer``, mean over prompts, for
    the position ``k = pos`` (0: P0) counted from the run's P0, over the positions from P0 on.

    ``pos`` may also give one position per prompt (a tuple), e.g. each prompt's first comma from
    :func:`p0circuit.measures.positions.find_positions`; ``where`` names it in results.

    Example::

        >>> import p0circuit as p0
        >>> p0.NormRatio(1).name            # the same as the entry "norm_ratio:1"
        'norm_ratio@L1'
    """

    layer: int
    """Block whose output is measured."""
    pos: Union[int, tuple[int, ...]] = 0
    """Position whose norm is compared (a sink at position 1 during the transition stage: 1), or one per prompt."""
    where: str = ""
    """Name of the position (e.g. ``"first:,"``), shown in the metric's name."""

    def __post_init__(self) -> None:
        at_least("NormRatio", "layer", self.layer, 0, "blocks count from 0")
        if isinstance(self.pos, (list, tuple)):
            self.pos = tuple(self.pos)
            for p in self.pos:
                at_least("NormRatio", "pos", p, 0, "positions count from the run's P0")
        else:
            at_least("NormRatio", "pos", self.pos, 0, "positions count from the run's P0")

    @property
    def name(self) -> str:  # type: ignore[override]
        label = self.where or ("" if self.pos == 0 else str(self.pos) if isinstance(self.pos, int) else "per-prompt")
        return f"norm_ratio@L{self.layer}" + (f"@{label}" if label else "")

    def needs(self, n_layers: int) -> list[HookRef]:
        return [HookRef(self.layer, hooks.resid_post(self.layer))]

    def validate(self, n_layers: int, n_heads: int) -> None:
        _check_layer(self.layer, n_layers, "NormRatio")

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        return self.per_prompt(view).mean()

    def per_prompt(self, view: RunView) -> Float[Tensor, " batch"]:
        h = view.acts[hooks.resid_post(self.layer)].float()
        norms = h.norm(dim=-1)[:, view.p0:]  # (B, T - p0): the run's own positions
        batch, seq = norms.shape
        ks = torch.tensor(self.pos if isinstance(self.pos, tuple) else (self.pos,) * batch, device=norms.device)
        if len(ks) != batch:
            raise BadInputError(f"NormRatio: pos has {len(ks)} positions (one per prompt) but the run has {batch} prompts; give one position per prompt")
        if seq < max(int(ks.max()) + 1, 2):
            raise too_short(f"NormRatio at position {int(ks.max())} needs at least {max(int(ks.max()) + 1, 2)} positions "
                            "from the clean first token on", view, seq)
        at = norms.gather(1, ks[:, None])[:, 0]
        others = (norms.sum(1) - at) / (seq - 1)
        return at / others


@entry_point
@dataclass
class ResidDim(PatchMetric):
    """One residual-stream dimension at P0 (or ``pos`` positions after it) after ``layer``, mean over prompts:
    the size of a massive activation (e.g. SmolLM2-135M's dimension 507, about 660 at P0 after block 2 and a
    few units elsewhere). Patching with it finds the components, and the neurons, that write that dimension."""

    layer: int
    """Block whose output is read."""
    dim: int
    """Residual-stream dimension."""
    pos: int = 0
    """Position read, counted from the run's P0 (a sink state elsewhere: its index)."""

    def __post_init__(self) -> None:
        at_least("ResidDim", "layer", self.layer, 0, "blocks count from 0")
        at_least("ResidDim", "dim", self.dim, 0, "dimensions count from 0")
        at_least("ResidDim", "pos", self.pos, 0, "positions count from the run's P0")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"resid@L{self.layer}[{self.dim}]" + (f"@{self.pos}" if self.pos else "")

    def needs(self, n_layers: int) -> list[HookRef]:
        return [HookRef(self.layer, hooks.resid_post(self.layer))]

    def validate(self, n_layers: int, n_heads: int) -> None:
        _check_layer(self.layer, n_layers, "ResidDim")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise BadInputError(f"ResidDim.dim must be a dimension index >= 0, got {self.dim!r}")

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        return self.per_prompt(view).mean()

    def per_prompt(self, view: RunView) -> Float[Tensor, " batch"]:
        h = view.acts[hooks.resid_post(self.layer)]
        if self.dim >= h.shape[-1]:
            raise BadInputError(f"ResidDim: dimension {self.dim} is outside the residual stream's 0..{h.shape[-1] - 1}")
        if view.p0 + self.pos >= h.shape[1]:
            raise BadInputError(f"ResidDim at position {self.pos} needs prompts of at least {self.pos + 1} tokens")
        return h[:, view.p0 + self.pos, self.dim].float()

    def last_position(self, p0: int) -> Optional[int]:
        return p0 + self.pos  # one position: a patched forward runs the positions up to it


@entry_point
@dataclass
class AttnToP0(PatchMetric):
    """Mean attention to P0 from the queries after it, over the chosen heads and the prompts.

    ``heads`` lists (layer, head) pairs; ``layers`` takes every head of those layers. Queries at
    P0 itself are excluded (their attention to P0 is 1 under the causal mask).

    Example::

        >>> import p0circuit as p0
        >>> p0.AttnToP0(heads=[(2, 0), (3, 0)]).name
        'attn_to_p0@L2H0,L3H0'
    """

    heads: Sequence[tuple[int, int]] = ()
    """(layer, head) pairs to average over."""
    layers: Sequence[int] = ()
    """Layers whose every head is averaged over (added to ``heads``)."""
    _resolved: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for layer in self.layers:
            at_least("AttnToP0", "layers", layer, 0, "blocks count from 0")
        for layer, head in self.heads:
            at_least("AttnToP0", "heads", layer, 0, "blocks count from 0")
            at_least("AttnToP0", "heads", head, 0, "heads count from 0")

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.layers and not self.heads:
            return "attn_to_p0@L" + _ranges(self.layers)
        by_layer: dict[int, list[int]] = {}
        for layer, head in self.heads:
            by_layer.setdefault(layer, []).append(head)
        name = "attn_to_p0@" + ",".join(f"L{l}H{_ranges(h)}" for l, h in sorted(by_layer.items()))
        if self.layers:
            name += "+L" + _ranges(self.layers)
        return name

    def validate(self, n_layers: int, n_heads: int) -> None:
        if not self.heads and not self.layers:
            raise BadInputError("AttnToP0 needs heads=[(layer, head), ...] or layers=[...]")
        for layer in self.layers:
            _check_layer(layer, n_layers, "AttnToP0")
        for layer, head in self.heads:
            _check_layer(layer, n_layers, "AttnToP0")
            if not 0 <= head < n_heads:
                raise BadInputError(f"AttnToP0: head {head} is outside 0..{n_heads - 1}")
        self._resolved[:] = sorted(set(self.heads) | {(l, h) for l in self.layers for h in range(n_heads)})

    def needs(self, n_layers: int) -> list[HookRef]:
        layers = sorted({l for l, _ in self.heads} | set(self.layers))
        return [HookRef(l, hooks.pattern(l)) for l in layers]

    def attention_reads(self, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
        return sorted(set(self.heads) | {(l, h) for l in self.layers for h in range(n_heads)})

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        return self.per_prompt(view).mean()

    def per_prompt(self, view: RunView) -> Float[Tensor, " batch"]:
        vals = []
        for layer, head in self._resolved:
            pat = view.acts[hooks.pattern(layer)][:, head].float()  # (B, Q, K), in float32 whatever the model's dtype
            if pat.shape[-1] <= view.p0 + 1:
                raise too_short("AttnToP0 needs at least one query after P0", view, pat.shape[-1] - view.p0)
            vals.append(pat[:, view.p0 + 1:, view.p0].mean(-1))
        return torch.stack(vals).mean(0)


@entry_point
@dataclass
class SinkRate(PatchMetric):
    """Sink_0^eps of ``layers`` (Gu et al. 2025): the share of their heads whose alpha_0, the mean attention to P0 of
    the queries that can see it (P0's own included), exceeds ``eps``, per prompt, then the mean over prompts. A step
    function of the attention: a circuit is searched with :class:`AttnToP0` and this is read beside it."""

    layers: Sequence[int]
    """Blocks whose heads are counted."""
    eps: float = 0.3
    """alpha_0 above which a head counts as sinking."""

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)
        if not self.layers:
            raise ConfigError("SinkRate needs layers=[...], the blocks whose heads are counted")
        for layer in self.layers:
            at_least("SinkRate", "layers", layer, 0, "blocks count from 0")
        if not 0 <= self.eps < 1:
            raise ConfigError(f"SinkRate.eps={self.eps!r} must lie in [0, 1) (an attention share)")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"sink_rate@L{_ranges(self.layers)}"

    def validate(self, n_layers: int, n_heads: int) -> None:
        for layer in self.layers:
            _check_layer(layer, n_layers, "SinkRate")

    def needs(self, n_layers: int) -> list[HookRef]:
        return [HookRef(l, hooks.pattern(l)) for l in sorted(set(self.layers))]

    def attention_reads(self, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
        return [(l, h) for l in sorted(set(self.layers)) for h in range(n_heads)]

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        return self.per_prompt(view).mean()

    def per_prompt(self, view: RunView) -> Float[Tensor, " batch"]:
        rates = []
        for layer in sorted(set(self.layers)):
            pat = view.acts[hooks.pattern(layer)].float()  # (B, H, Q, K)
            alpha = pat[:, :, view.p0:, view.p0].mean(-1)  # (B, H): the queries from P0 on
            rates.append((alpha > self.eps).float())
        return torch.cat(rates, dim=1).mean(1)


@entry_point
@dataclass
class LogitMetric(PatchMetric):
    """Any callable ``logits [batch, pos, vocab] -> scalar tensor`` (e.g. a logit difference); the logits
    arrive in float32 whatever the model's dtype."""

    fn: Callable[[Tensor], Tensor]
    """The user's metric on logits."""
    label: str = "logit_metric"
    """Name shown in results."""
    signal_unit: str = "logits"
    """The unit ``min_signal`` judges the change in (a logit difference: ``"logits"``); ``""`` for a function whose
    change is better judged relative to its size (a probability, a loss ratio)."""
    needs_logits: bool = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        assert view.logits is not None
        return _scalar(self.fn(view.logits.float()), self.label)  # float32 whatever the model's dtype


@entry_point
@dataclass
class CacheMetric(PatchMetric):
    """Any callable on activations: ``fn(acts: dict[hook name, Tensor], p0: int) -> scalar``; float
    activations arrive in float32 whatever the model's dtype.

    ``hooks_needed`` lists ``(layer, hook name)`` pairs, e.g.
    ``[(2, p0circuit.core.hooks.resid_post(2))]``.
    """

    fn: Callable[[dict[str, Tensor], int], Tensor]
    """The user's metric on the cache."""
    hooks_needed: Sequence[tuple[int, str]]
    """Hooks (with their block index) the function reads."""
    label: str = "cache_metric"
    """Name shown in results."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def needs(self, n_layers: int) -> list[HookRef]:
        return [HookRef(l, n) for l, n in self.hooks_needed]

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        try:
            value = self.fn({k: v.float() if v.is_floating_point() else v for k, v in view.acts.items()}, view.p0)
        except KeyError as err:
            if err.args and err.args[0] in view.acts or not (err.args and isinstance(err.args[0], str)):
                raise
            raise MissingHookError(f"CacheMetric {self.label!r} read {err.args[0]!r}, which is not in its hooks_needed "
                                   f"{[n for _, n in self.hooks_needed]}: add (layer, {err.args[0]!r}) to "
                                   "hooks_needed") from None
        return _scalar(value, self.label)


class PerPrompt(PatchMetric):
    """A built-in metric that also keeps each prompt's value: every time it is read, :attr:`values` gets the
    per-prompt tensor (:meth:`PatchMetric.per_prompt`) and the run gets its mean, the wrapped metric's value to the
    bit. What intervals over prompts are computed from (``values[-1]`` after the one run of interest)."""

    def __init__(self, metric: Any) -> None:  # checked here, with the message below
        if not isinstance(metric, PatchMetric) or type(metric).per_prompt is PatchMetric.per_prompt:
            raise BadInputError(f"PerPrompt needs a metric that is a mean over prompts (NormRatio, ResidDim, AttnToP0, "
                                f"SinkRate), got {metric!r:.60}")
        self.metric = metric
        self.values: list[Tensor] = []
        self.needs_logits = metric.needs_logits
        self.signal_unit = metric.signal_unit  # type: ignore[misc]

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.metric.name

    def params(self) -> dict[str, Any]:
        return self.metric.params()

    def needs(self, n_layers: int) -> list[HookRef]:
        return self.metric.needs(n_layers)

    def validate(self, n_layers: int, n_heads: int) -> None:
        self.metric.validate(n_layers, n_heads)

    def residual_reads(self, n_layers: int) -> list[int]:
        return self.metric.residual_reads(n_layers)

    def attention_reads(self, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
        return self.metric.attention_reads(n_layers, n_heads)

    def last_position(self, p0: int) -> Optional[int]:
        return self.metric.last_position(p0)

    def per_prompt(self, view: RunView) -> Float[Tensor, " batch"]:
        return self.metric.per_prompt(view)  # type: ignore[return-value]

    def __call__(self, view: RunView) -> Float[Tensor, ""]:
        values = self.metric.per_prompt(view)
        assert values is not None  # refused when made
        self.values.append(values.detach().cpu())
        return values.mean()


def _ranges(values: Sequence[int]) -> str:
    """Sorted ints as short ranges: ``[2, 3, 4, 7]`` -> ``"2-4,7"``."""
    out: list[str] = []
    for v in sorted(set(values)):
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = out[-1].split("-")[0] + f"-{v}"
        else:
            out.append(str(v))
    return ",".join(out)


def _scalar(value: Any, label: str) -> Tensor:
    if isinstance(value, bool) or not isinstance(value, (Tensor, int, float)) or (
            isinstance(value, Tensor) and not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64))):
        raise BadInputError(f"metric {label!r} returned {value!r:.60} ({type(value).__name__}); a patching metric must "
                            "return one number, as a float tensor (e.g. logits[:, -1, 0].mean())")
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=torch.float32)
    if value.numel() != 1:
        raise BadInputError(
            f"metric {label!r} returned a tensor of shape {tuple(value.shape)}; a patching metric "
            "must return one number per run (reduce over batch and positions, e.g. .mean())"
        )
    return value.reshape(()).float()


def default_metric(n_layers: int) -> PatchMetric:
    """Attention to P0 of every head in layers >= 2 (>= the last layer in models of <= 2 layers)."""
    first = min(2, n_layers - 1)
    return AttnToP0(layers=list(range(first, n_layers)))


GATED_HOOKS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("attn.hook_result",), "use_attn_result"),
    (("hook_q_input", "hook_k_input", "hook_v_input"), "use_split_qkv_input"),
    (("hook_mlp_in",), "use_hook_mlp_in"),
    (("hook_attn_in",), "use_attn_in"),
    (("hook_tokens",), "use_hook_tokens"),
)
"""TransformerLens hooks that fire only with a config flag on (name suffixes, flag): the rule of its own
``TransformerBridge._gated_hook_reason``. With the flag off the hook exists but never fires, so no cached
run holds it."""

CACHED_KINDS = ("hook_embed", "blocks.L.hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
                "hook_mlp_out", "attn.hook_q/k/v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
                "mlp.hook_pre/post", "ln1/ln2.hook_scale")
"""The hook kinds a patching cache can hold on a model as TransformerLens builds it by default (the
engine caches every hook the metric declares, as long as it fires in the model's forward)."""


def _instead(name: str, model: Any) -> str:
    """What a metric on the gated hook ``name`` can read instead, from hooks that always fire."""
    block = name.split(".")[:2]
    prefix = ".".join(block) + "." if block[0] == "blocks" else ""
    if name.endswith("attn.hook_result"):
        return (f"{prefix}attn.hook_z (per head, before W_O): head h's result is "
                f"acts['{prefix}attn.hook_z'][:, :, h] @ model.W_O[{block[1] if prefix else 'L'}, h]")
    if name.endswith("hook_mlp_in"):
        src = "hook_resid_pre" if BlockShape.of(model).parallel else "hook_resid_mid"
        return f"{prefix}{src}, which holds the same values (the MLP's input before its norm)"
    if name.endswith(("hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in")):
        return f"{prefix}hook_resid_pre, which every head takes as its input (the same values, without the head axis)"
    return "the token ids you pass (they are the input, not an activation)"


def _gated(name: str, model: Any) -> Optional[str]:
    """The config flag that is off and keeps hook ``name`` from firing, or None."""
    for suffixes, flag in GATED_HOOKS:
        if name.endswith(suffixes) and not getattr(model.cfg, flag, False):
            return flag
    return None


def check_metric(metric: Any, model: Any) -> None:
    """Raise unless ``metric`` is a patching metric that fits ``model``: the metric's hooks exist,
    fire in the model's forward as configured (so the patching cache holds them) and sit in the
    blocks it says."""
    if not isinstance(metric, PatchMetric):
        raise BadInputError(f"metric={metric!r:.60} ({type(metric).__name__}) is not a patching metric; "
                            f"{METRIC_FIX}")
    metric.validate(model.cfg.n_layers, model.cfg.n_heads)
    missing = [h.name for h in metric.needs(model.cfg.n_layers) if h.name not in model.hook_dict]
    if missing:
        raise MissingHookError(f"the model has no hook {missing[0]!r} that metric {metric.name!r} reads")
    n_layers = model.cfg.n_layers
    order = hook_order(model)
    for h in metric.needs(n_layers):
        flag = _gated(h.name, model)
        silent = flag is None and h.name not in order.first and ".experts." not in h.name
        if flag is not None or silent:
            why = (f"which TransformerLens computes only with model.cfg.{flag} on (off on this model)" if flag
                   else "which never fires in this model's forward")
            raise MissingHookError(
                f"metric {metric.name!r} reads hook {h.name!r}, {why}, so the patching cache never holds it (p0circuit "
                "patches the model as it is configured and does not switch such hooks on). Read instead: "
                f"{_instead(h.name, model) if flag else 'a hook that fires'}. The cache holds every hook that fires in "
                f"the model's forward: {', '.join(CACHED_KINDS)}")
    owner = {id(point): layer for layer, block in enumerate(model.blocks) for point in block.modules()}
    for h in metric.needs(n_layers):
        actual = owner.get(id(model.hook_dict[h.name]))
        if actual is None:  # outside the blocks: the embeddings before them, ln_final and the unembedding after
            actual = -1 if order.span(h.name)[1] < order.span(hooks.resid_pre(0))[0] else n_layers
        if actual != h.layer:
            where = (f"block {actual}" if 0 <= actual < n_layers else "the embeddings (layer -1)" if actual < 0
                     else f"what runs after the last block (layer {n_layers})")
            raise BadInputError(
                f"metric {metric.name!r} declares hook {h.name!r} at layer {h.layer}, but that hook belongs to "
                f"{where}: patched forwards would read it unpatched. Declare it as ({actual}, {h.name!r})")


MetricSpec = Union[str, PatchMetric]
"""A patching metric, or its name (:data:`p0circuit.core.entries.METRICS`: ``"norm_ratio:2"``, ``"attn_to_p0"``)."""


def resolve_metric(metric: Any, model: Any) -> Any:
    """``metric`` as a :class:`PatchMetric` for ``model``: a name is parsed (:func:`metric_from_entry`);
    anything else is returned as it is (``None`` means the default; the rest is checked later)."""
    return metric_from_entry(metric, model) if isinstance(metric, str) else metric


def _sink_heads(model: Any, layer: Optional[int], sink_heads: Optional[Sequence[tuple[int, int]]]) -> PatchMetric:
    sink_heads = sink_heads or getattr(model, SINK_HEADS_ATTR, None)
    if not sink_heads:
        raise ConfigError("metric 'sink_heads' needs a planted model; use 'attn_to_p0' or 'norm_ratio:<layer>'")
    return AttnToP0(heads=list(sink_heads))


BUILT_IN: dict[str, Callable[..., PatchMetric]] = {
    "sink_heads": _sink_heads,
    "attn_to_p0": lambda model, layer, sink_heads: default_metric(model.cfg.n_layers),
    "norm_ratio": lambda model, layer, sink_heads: NormRatio(int(layer)),  # type: ignore[arg-type]
}
"""How each built-in metric entry (:data:`p0circuit.core.entries.METRICS`, where the names and their grammar
live, without torch) builds its metric: ``build(model, block, sink_heads)``."""


def metric_from_entry(entry: str, model: Any, sink_heads: Optional[Sequence[tuple[int, int]]] = None) -> PatchMetric:
    """The metric named by ``entry`` for ``model``, one route for every entry: a plugin's registered build
    (:func:`p0circuit.core.entries.register_metric`) or a built-in one (:data:`BUILT_IN`): ``sink_heads``
    (attention to P0 of a planted model's sink heads: ``sink_heads`` if given, else the ones the planted model
    carries), ``attn_to_p0`` (:func:`default_metric`) or ``norm_ratio:<layer>``."""
    kind, layer = check_metric_entry(entry, model.cfg.n_layers)
    build = METRICS[kind].build
    return build(model, layer) if build is not None else BUILT_IN[kind](model, layer, sink_heads)
