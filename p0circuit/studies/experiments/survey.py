"""Architecture survey: the P0 sink and its identification signal across model families.

:func:`survey` measures each model on the same random prompts (no BOS) and returns one row per
model: the P0 norm ratio per layer, the onset layers, the sink position, and where position 0 is
identified at layer 0:

* ``attn_signal``: ``||o_0|| / mean_{t>0} ||o_t||`` of the layer-0 attention output (the cone
  asymmetry of claim 3; above 1 means P0's attention output stands out);
* ``pos_embed_signal`` (learned positions only): ``||p_0 - m|| / mean_{t>0} ||p_t - m||`` with
  ``m`` the mean position embedding over t > 0 (P0 standing out in the position table);
* ``identified_by``: ``position embedding`` when that ratio exceeds ``threshold``, else
  ``causal mask (layer-0 attention)`` when ``attn_signal`` does, else ``none``.

:func:`default_models` builds tiny models of the families at initialization and the planted
models; real checkpoints come in through :func:`p0circuit.load_checkpoint` or
:func:`p0circuit.load_pretrained` (the ``p0circuit survey`` command takes paths and hub names).
"""

from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import at_least, entry_point
from p0circuit.core.io import out_file
from p0circuit.measures import sink_report
from p0circuit.core.entries import SPEC_FAMILIES
from p0circuit.models.spec import ModelSpec, positional_kind
from p0circuit.models.planted import build_planted
from p0circuit.figures.plotting import check_frame, finish, new_figure
from p0circuit.models.tokens import make_prompts



@entry_point
def default_models(d_vocab: int = 64, n_ctx: int = 64, seed: int = 0) -> dict[str, tuple[str, Any]]:
    """Name -> (kind, model): each family at initialization, and the planted models."""
    models: dict[str, tuple[str, Any]] = {}
    for name, kw in SPEC_FAMILIES.items():
        spec = ModelSpec(n_layers=4, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=d_vocab, n_ctx=n_ctx,
                         seed=seed, **kw)
        models[name] = ("init", spec.build())
    for pos in ("rope", "nope", "learned"):
        models[f"planted {pos}"] = ("planted", build_planted(pos=pos, d_vocab=32, n_ctx=n_ctx).model)
    return models


def _signals(model: Any, tokens: Tensor) -> tuple[float, Optional[float]]:
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=hooks.attn_out(0))
    norms = cache[hooks.attn_out(0)].norm(dim=-1)  # (B, T)
    attn = float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())
    if positional_kind(model) != "learned":
        return attn, None
    table = model.W_pos[: tokens.shape[1]].detach()
    mean = table[1:].mean(0)
    dev = (table - mean).norm(dim=-1)
    return attn, float(dev[0] / dev[1:].mean().clamp_min(1e-12))


@entry_point
def survey(
    models: dict[str, tuple[str, Any]], n_prompts: int = 16, seq_len: int = 32, seed: int = 0,
    threshold: float = 1.5, attn_threshold: float = 1.05, prompts: str = "auto",
) -> pd.DataFrame:
    """One row per model (see the module docstring). ``prompts`` (:func:`~p0circuit.models.tokens.make_prompts`):
    ``auto`` gives natural-English prompts to models with a tokenizer and regular random ids to the
    others; the ``prompts`` column says which each model got."""
    if not models:
        raise BadInputError("survey needs at least one model")
    at_least("survey", "n_prompts", n_prompts, 1, "the prompts each model is measured on")
    at_least("survey", "seq_len", seq_len, 2, "tokens per prompt: position 0 and at least one other")
    rows = []
    for name, (kind, model) in models.items():
        made = make_prompts(model, n_prompts, min(seq_len, model.cfg.n_ctx), source=prompts, seed=seed)
        tokens = made.tokens
        report = sink_report(model, tokens)
        attn, pe = _signals(model, tokens)
        if pe is not None and pe > threshold:
            source = "position embedding"
        elif attn > attn_threshold:
            source = "causal mask (layer-0 attention)"
        else:
            source = "none"
        row: dict[str, Any] = {"model": name, "kind": kind, "prompts": made.source, "positions": positional_kind(model),
                               "norm_onset": report.norm_onset_layer, "head_onset": report.head_onset_layer,
                               "sink_position": report.sink_position, "sink_rate": report.sink_rate,
                               "attn_signal": attn, "pos_embed_signal": pe, "identified_by": source}
        row.update({f"norm_ratio_L{l}": v for l, v in enumerate(report.norm_ratio_resid)})
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


@entry_point
def plot_survey(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Any:
    """P0 norm ratio per layer for every surveyed model (log scale)."""
    check_frame("plot_survey", frame, ("kind", "norm_ratio_L*"), "survey(models)")
    if path is not None:
        out_file("plot_survey", path)
    cols = [c for c in frame.columns if c.startswith("norm_ratio_L")]
    fig, (ax,) = new_figure(1, width=7)
    for name, row in frame.iterrows():
        values = [row[c] for c in cols if not pd.isna(row[c])]
        ax.plot(range(len(values)), values, marker="o", label=f"{name} ({row['kind']})")
    ax.set(xlabel="layer", ylabel="||h_0|| / mean ||h_t||", yscale="log", title="P0 norm ratio across architectures")
    ax.legend(fontsize=7)
    return finish(fig, path)
