"""One call that measures the sink: :func:`sink_report`.

It runs the model once with a cache of only the hooks it needs and returns a
:class:`SinkReport`: per layer, the P0 norm ratio of the residual stream and of the attention and
MLP outputs, the share of sinking heads, the strongest head's attention to P0 and the direction
stability of ``h_0``; overall, ``Sink_0^eps``, the onset layers, the argmax sink position and the
massive activations. The report prints as a table and converts to a DataFrame or a dict.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd
import torch
from torch import Tensor
from transformer_lens import ActivationCache, HookedTransformer

from p0circuit.core.defaults import ALPHA_LINE, MASSIVE_RATIO, NORM_THRESHOLD, SINK_EPS, sink_rate_label
from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError, MissingHookError, NonFiniteError, non_finite_fix
from p0circuit.core.args import above_one, entry_point
from p0circuit.measures.attention import (
    argmax_sink_position,
    attention_to_position,
    sink_rate,
    sink_rate_per_layer,
)
from p0circuit.measures.norms import direction_stability, direction_stability_ordinary, direction_to, first_layer_at_least, massive_activations, norm_ratio
from p0circuit.measures.positions import SinkPosition, classify, sink_positions, token_text
from p0circuit.models.tokens import bos_id, check_tokens
from p0circuit.models.checks import check_model


@dataclass
class SinkReport:
    """Sink and norm measurements of one batch of prompts."""

    n_prompts: int
    """Prompts measured."""
    seq_len: int
    """Tokens per prompt."""
    eps: float
    """Threshold on alpha_0 for a head to count as sinking."""
    norm_threshold: float
    """Norm ratio at which the residual stream counts as a sink state."""
    alpha: list[list[float]]
    """alpha_0 per [layer][head], mean over prompts."""
    sink_rate: float
    """Sink_0^eps: share of (layer, head) pairs with alpha_0 > eps, mean over prompts."""
    sink_rate_per_layer: list[float]
    """Share of sinking heads per layer."""
    norm_ratio_resid: list[float]
    """||h_0|| / mean_{t>0} ||h_t|| of resid_post per layer, mean over prompts."""
    norm_ratio_resid_min: list[float]
    """The same, minimum over prompts."""
    norm_ratio_attn: list[float]
    """Norm ratio of the attention output per layer (NaN where it is 0 at every t > 0)."""
    norm_ratio_mlp: list[float]
    """Norm ratio of the MLP output per layer (NaN where it is 0 at every t > 0)."""
    direction_stability: Optional[list[float]]
    """Mean pairwise cosine of h_0 across prompts per layer (None with a single prompt)."""
    massive: list[tuple[int, int, float, float]]
    """Massive activations at P0: (layer, dim, mean value, ratio to the typical scale)."""
    norm_onset_layer: Optional[int]
    """First layer whose resid_post norm ratio >= norm_threshold, or None."""
    head_onset_layer: Optional[int]
    """First layer with a head whose alpha_0 > eps, or None."""
    sink_position: int
    """Key position with the highest mean attention (alpha_k) among the first ones."""
    sink_position_scores: list[float] = field(default_factory=list)
    """Mean alpha_k for each candidate position k."""
    sink_position_max_alpha: float = 0.0
    """Strongest head's alpha_k at ``sink_position`` (mean over prompts)."""
    sink_positions: list[SinkPosition] = field(default_factory=list)
    """Every (layer, position class) that is a sink state: P0, a BOS token, a delimiter such as the first
    comma, ... (see :mod:`p0circuit.measures.positions`); empty when the report was built without tokens."""
    direction_to_onset: Optional[list[float]] = None
    """Per layer, the cosine of h_0's mean direction (over prompts) with its mean direction at the norm onset
    (:attr:`norm_onset_layer`); None without an onset."""
    direction_stability_ordinary: Optional[list[float]] = None
    """The baseline of :attr:`direction_stability`: per layer, the mean pairwise cosine across prompts of the state at
    one ordinary position (t > 0), averaged over those positions (None with a single prompt)."""
    direction_stability_unmassive: Optional[list[float]] = None
    """The other baseline: :attr:`direction_stability` of h_0 with its massive dimensions at that layer set to 0 (how
    much of the agreement those few dimensions make; None with a single prompt)."""

    @property
    def n_layers(self) -> int:
        """Number of layers measured."""
        return len(self.norm_ratio_resid)

    @property
    def norm_stages(self) -> list[tuple[str, int, float]]:
        """Every ``("onset", layer, ratio)`` where the P0 norm ratio of the residual stream reaches
        ``norm_threshold`` and every ``("erasure", layer, ratio)`` where it falls back below, in
        layer order. A model can amplify P0 more than once: SmolLM2-135M does near layer 2, erases
        it around layers 9-10 and amplifies it again, far more, at layer 11."""
        stages = []
        above = False
        for layer, ratio in enumerate(self.norm_ratio_resid):
            now = not math.isnan(ratio) and ratio >= self.norm_threshold
            if now != above:
                stages.append(("onset" if now else "erasure", layer, float(ratio)))
                above = now
        return stages

    @property
    def norm_onsets(self) -> list[int]:
        """Layers where the P0 norm ratio reaches the threshold (see :attr:`norm_stages`)."""
        return [layer for kind, layer, _ in self.norm_stages if kind == "onset"]

    def to_frame(self) -> pd.DataFrame:
        """One row per layer."""
        rows = []
        for layer in range(self.n_layers):
            rows.append({
                "layer": layer,
                "norm_ratio_resid": self.norm_ratio_resid[layer],
                "norm_ratio_resid_min": self.norm_ratio_resid_min[layer],
                "norm_ratio_attn": self.norm_ratio_attn[layer],
                "norm_ratio_mlp": self.norm_ratio_mlp[layer],
                "sink_rate": self.sink_rate_per_layer[layer],
                "max_alpha0": max(self.alpha[layer]),
                "cos_h0": None if self.direction_stability is None else self.direction_stability[layer],
                "cos_h0_to_onset": None if self.direction_to_onset is None else self.direction_to_onset[layer],
            })
        return pd.DataFrame(rows).set_index("layer")

    def sinks_at(self, layer: int) -> list[SinkPosition]:
        """The position classes that are sink states after block ``layer``."""
        return [s for s in self.sink_positions if s.layer == layer]

    @property
    def sink_classes(self) -> list[str]:
        """Every position class that is a sink state at some layer, strongest first."""
        best: dict[str, float] = {}
        for s in self.sink_positions:
            best[s.where] = max(best.get(s.where, 0.0), s.ratio * s.share)
        return sorted(best, key=lambda w: -best[w])

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["sink_positions"] = [s.to_dict() for s in self.sink_positions]
        return out

    def __str__(self) -> str:
        def f(x: Optional[float]) -> str:
            return "   n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:6.2f}"

        head = "layer | ratio resid (min) | ratio attn | ratio mlp | sink heads | max a0 | cos h0"
        lines = [f"SinkReport: {self.n_prompts} prompts x {self.seq_len} tokens, eps={self.eps}", head]
        for layer in range(self.n_layers):
            cos = None if self.direction_stability is None else self.direction_stability[layer]
            lines.append(
                f"{layer:5d} | {f(self.norm_ratio_resid[layer])} ({f(self.norm_ratio_resid_min[layer])}) | "
                f"    {f(self.norm_ratio_attn[layer])} |    {f(self.norm_ratio_mlp[layer])} |"
                f"     {f(self.sink_rate_per_layer[layer])} | {f(max(self.alpha[layer]))} | {f(cos)}"
            )
        lines.append(
            f"{sink_rate_label(self.eps)} = {self.sink_rate:.3f}; norm onset layer = {self.norm_onset_layer} "
            f"(ratio >= {self.norm_threshold}); head onset layer = {self.head_onset_layer}; "
            f"sink position = {self.sink_position}"
        )
        if self.norm_stages:
            lines.append("P0 norm stages: " + ", ".join(f"{kind} at layer {layer} ({ratio:.3g}x)"
                                                        for kind, layer, ratio in self.norm_stages))
        if self.massive:
            top = ", ".join(f"L{l}[{d}]={v:.1f} ({r:.0f}x)" for l, d, v, r in self.massive[:5])
            lines.append(f"massive activations at P0: {top}")
        for where in self.sink_classes[:4]:
            layers = [s for s in self.sink_positions if s.where == where]
            lines.append(f"sink states at {where}: layers {_layer_ranges([s.layer for s in layers])}, up to "
                         f"{max(s.ratio for s in layers):.3g}x the prompt's median norm")
        return "\n".join(lines)


def no_sink(report: SinkReport, line: float = ALPHA_LINE) -> Optional[str]:
    """Why these prompts show no P0 sink (no block where the P0 norm ratio reaches the report's threshold and no head
    giving position 0 a mean attention, alpha_0, above the sink ``line``), or None when they show one: a circuit found
    for a P0 metric there explains that metric's change, not a sink."""
    strongest = max(max(row) for row in report.alpha)
    if report.norm_onset_layer is not None or strongest > line:
        return None
    peak = max(range(report.n_layers), key=lambda l: report.norm_ratio_resid[l])
    return (f"no P0 sink on these prompts: the P0 norm ratio peaks at {report.norm_ratio_resid[peak]:.3g} (block {peak}), "
            f"below the line {report.norm_threshold:g}, and the strongest head's alpha_0 (mean attention to position 0) "
            f"is {strongest:.2f}, below the sink line {line:g} ({sink_rate_label(report.eps)} = {report.sink_rate:.3f})")


def _layer_ranges(layers: list[int]) -> str:
    out: list[list[int]] = []
    for l in sorted(layers):
        if out and out[-1][1] == l - 1:
            out[-1][1] = l
        else:
            out.append([l, l])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _needed(n_layers: int) -> list[str]:
    names = [hooks.EMBED]
    for layer in range(n_layers):
        names += [hooks.attn_out(layer), hooks.mlp_out(layer), hooks.resid_post(layer), hooks.pattern(layer)]
    return names


@entry_point
def check_finite(cache: ActivationCache, n_layers: int) -> None:
    """Raise :class:`NonFiniteError` naming the first hook (in forward order) with NaN or inf."""
    for name in _needed(n_layers):
        if name in cache.cache_dict and not torch.isfinite(cache[name]).all():
            raise NonFiniteError(non_finite_fix(cache[name].dtype, f"NaN or inf first appears at {name!r}; the "
                                                                   "activations before it are finite"))


@entry_point
def report_from_cache(
    cache: ActivationCache, n_layers: int, *, eps: float = SINK_EPS, norm_threshold: float = NORM_THRESHOLD,
    massive_ratio: float = MASSIVE_RATIO, classes: Optional[list[list[str]]] = None, texts: Optional[list[list[str]]] = None,
) -> SinkReport:
    """Build a :class:`SinkReport` from a cache holding every hook :func:`sink_report` needs;
    ``classes`` (per prompt, per position: :func:`p0circuit.measures.positions.classify`) adds the
    sink positions."""
    above_one("report_from_cache", "norm_threshold", norm_threshold)
    missing = [n for n in _needed(n_layers)[1:] if n not in cache.cache_dict]
    if missing:
        raise MissingHookError(
            f"the cache lacks {len(missing)} hook(s) the sink report needs, e.g. {missing[:3]}; "
            "run model.run_with_cache(tokens) without a names_filter, or call sink_report(model, tokens)"
        )
    check_finite(cache, n_layers)
    resid = torch.stack([cache[hooks.resid_post(l)] for l in range(n_layers)])  # (L, B, T, d)
    batch, seq_len = resid.shape[1], resid.shape[2]
    if seq_len < 2:
        raise BadInputError("sequence length 1 has no positions t > 0 to compare P0 with; use longer prompts")
    patterns = torch.stack([cache[hooks.pattern(l)] for l in range(n_layers)])  # (L, B, H, T, T)
    alpha = attention_to_position(patterns, 0)  # (B, L, H)
    rate_layer = sink_rate_per_layer(alpha, eps)
    ratio_resid = norm_ratio(resid)  # (L, B)
    attn = torch.stack([cache[hooks.attn_out(l)] for l in range(n_layers)])
    mlp = torch.stack([cache[hooks.mlp_out(l)] for l in range(n_layers)])
    mean_alpha = alpha.mean(0)  # (L, H)
    head_hits = torch.nonzero((mean_alpha > eps).any(-1)).flatten()
    sink_pos, scores = argmax_sink_position(patterns)
    massive = [
        (layer, d, v, r)
        for layer in range(n_layers)
        for d, v, r in massive_activations(resid[layer], ratio=massive_ratio)
    ]
    stability = ordinary = unmassive = None
    if batch >= 2:
        stability = [float(direction_stability(resid[l, :, 0])) for l in range(n_layers)]
        ordinary = [float(direction_stability_ordinary(resid[l])) for l in range(n_layers)]
        unmassive = []
        for l in range(n_layers):
            h0 = resid[l, :, 0].clone()
            h0[:, [d for layer, d, _, _ in massive if layer == l]] = 0.0
            unmassive.append(float(direction_stability(h0)))
    onset = first_layer_at_least(ratio_resid.mean(1), norm_threshold)
    return SinkReport(
        n_prompts=batch,
        seq_len=seq_len,
        eps=eps,
        norm_threshold=norm_threshold,
        alpha=mean_alpha.tolist(),
        sink_rate=float(sink_rate(alpha, eps)),
        sink_rate_per_layer=rate_layer.tolist(),
        norm_ratio_resid=ratio_resid.mean(1).tolist(),
        norm_ratio_resid_min=ratio_resid.min(1).values.tolist(),
        norm_ratio_attn=norm_ratio(attn).mean(1).tolist(),
        norm_ratio_mlp=norm_ratio(mlp).mean(1).tolist(),
        direction_stability=stability,
        massive=massive,
        norm_onset_layer=onset,
        direction_to_onset=None if onset is None else direction_to(resid[:, :, 0], onset).tolist(),
        direction_stability_ordinary=ordinary, direction_stability_unmassive=unmassive,
        head_onset_layer=int(head_hits[0]) if len(head_hits) else None,
        sink_position=sink_pos,
        sink_position_scores=scores.tolist(),
        sink_position_max_alpha=float(attention_to_position(patterns, sink_pos).mean(0).max()),
        sink_positions=[] if classes is None else sink_positions(resid, patterns, classes, norm_threshold, texts=texts),
    )


@entry_point
def sink_report(
    model: Any, tokens: Tensor, *, eps: float = SINK_EPS,
    norm_threshold: float = NORM_THRESHOLD, massive_ratio: float = MASSIVE_RATIO, bos: Any = None,
) -> SinkReport:
    """Measure the P0 sink of a ``HookedTransformer`` on ``tokens`` (``[batch, pos]``, pos >= 2).

    ``bos``: the run's BOS choice, checked against ``tokens`` (see :func:`p0circuit.models.tokens.check_bos`);
    None makes no claim. Norms are computed in float32 whatever the model's dtype.

    ``model`` and ``tokens`` are validated here with messages that say what to do, so their
    annotations are deliberately loose.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> report = p0.sink_report(pm.model, tokens, bos=False)
        >>> report.norm_onset_layer, report.head_onset_layer, report.sink_position
        (1, 2, 0)
    """
    if not isinstance(model, HookedTransformer):
        raise BadInputError(
            f"sink_report needs a transformer_lens HookedTransformer, got {type(model).__name__}; "
            "load checkpoints with p0circuit.models.load_checkpoint or build one with ModelSpec"
        )
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    above_one("sink_report", "norm_threshold", norm_threshold)
    needed = _needed(model.cfg.n_layers)
    missing = [n for n in needed if n not in model.hook_dict]
    if missing:
        raise MissingHookError(
            f"model lacks hook point(s) {missing[:3]} that the sink report needs; p0circuit supports "
            "HookedTransformer models with standard blocks (load checkpoints with load_checkpoint)"
        )
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in set(needed))
    text = token_text(model)
    classes = classify(tokens, text, bos_id(model))
    return report_from_cache(
        cache, model.cfg.n_layers, eps=eps, norm_threshold=norm_threshold, massive_ratio=massive_ratio,
        classes=classes, texts=[[text(t) for t in row] for row in tokens.tolist()],
    )
