"""Perturbations of the first tokens, each measured with the sink report, side by side.

* ``original``: the prompts as given;
* ``repeat_first``: the first token repeated (``x0 x0 x1 ...``, truncated to the same length);
  without absolute positions position 1 is then an exact copy of position 0 in every layer;
* ``random_first``: the first token replaced by a random token;
* ``replace_first``: the first token replaced by one fixed token (``replacement``);
* ``shift_by_one``: one random token prepended (the prompt moves one position right);
* ``repeat_all``: every token replaced by the first one: the documented edge case in which,
  without absolute positions, no position can be told from another at any layer.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pandas as pd
import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.models.spec import positional_kind
from p0circuit.figures.plotting import finish, new_figure
from p0circuit.measures import SinkReport, sink_report
from p0circuit.models.tokens import check_tokens

Perturb = Callable[[Tensor, torch.Generator, int, int], Tensor]


def _random_like(tokens: Tensor, gen: torch.Generator, vocab: int, n: int) -> Tensor:
    return torch.randint(0, vocab, (tokens.shape[0], n), generator=gen).to(tokens.device)


PERTURBATIONS: dict[str, Perturb] = {
    "original": lambda t, g, v, r: t,
    "repeat_first": lambda t, g, v, r: torch.cat([t[:, :1], t[:, :-1]], dim=1),
    "random_first": lambda t, g, v, r: torch.cat([_random_like(t, g, v, 1), t[:, 1:]], dim=1),
    "replace_first": lambda t, g, v, r: torch.cat([torch.full_like(t[:, :1], r), t[:, 1:]], dim=1),
    "shift_by_one": lambda t, g, v, r: torch.cat([_random_like(t, g, v, 1), t[:, :-1]], dim=1),
    "repeat_all": lambda t, g, v, r: t[:, :1].expand_as(t).clone(),
}
"""Registry: name -> ``(tokens, generator, vocab size, replacement id) -> perturbed tokens``."""


@dataclass
class PerturbationResults:
    """A sink report per perturbation."""

    reports: dict[str, SinkReport]
    """Perturbation name -> report."""

    def to_frame(self) -> pd.DataFrame:
        """One row per perturbation: Sink_0^eps, onsets, sink position, norm ratio per layer."""
        rows = []
        for name, r in self.reports.items():
            row: dict[str, Any] = {"perturbation": name, "sink_rate": r.sink_rate, "norm_onset": r.norm_onset_layer,
                                   "head_onset": r.head_onset_layer, "sink_position": r.sink_position}
            row.update({f"norm_ratio_L{l}": v for l, v in enumerate(r.norm_ratio_resid)})
            row.update({f"max_alpha0_L{l}": max(a) for l, a in enumerate(r.alpha)})
            rows.append(row)
        return pd.DataFrame(rows).set_index("perturbation")

    def plot(self, path: Optional[Union[str, Path]] = None) -> Any:
        """P0 norm ratio per layer for every perturbation."""
        fig, (ax,) = new_figure(1, width=6)
        for name, r in self.reports.items():
            ax.plot(range(r.n_layers), r.norm_ratio_resid, marker="o", label=name)
        ax.set(xlabel="layer", ylabel="||h_0|| / mean ||h_t||", yscale="log", title="P0 norm ratio under perturbations")
        ax.legend(fontsize=8)
        return finish(fig, path)


@entry_point
def perturbations(
    model: Any, tokens: Tensor, names: Optional[list[str]] = None, replacement: int = 0, seed: int = 0,
    **report_kw: Any,
) -> PerturbationResults:
    """Run the sink report on each perturbation of ``tokens`` (default: all of them)."""
    tokens = check_tokens(model, tokens, min_len=2)
    names = names or list(PERTURBATIONS)
    unknown = [n for n in names if n not in PERTURBATIONS]
    if unknown:
        raise BadInputError(f"unknown perturbation(s) {unknown}; choose from {list(PERTURBATIONS)}")
    if not 0 <= replacement < model.cfg.d_vocab:
        raise BadInputError(f"replacement token {replacement} is outside the vocabulary 0..{model.cfg.d_vocab - 1}")
    gen = torch.Generator().manual_seed(seed)
    reports = {n: sink_report(model, PERTURBATIONS[n](tokens, gen, model.cfg.d_vocab, replacement), **report_kw)
               for n in names}
    return PerturbationResults(reports)


@entry_point
def repeated_token_spread(model: Any, token: int = 0, length: int = 16) -> pd.DataFrame:
    """Per layer: the largest distance between any position's residual and position 0's on a
    prompt of one repeated token, relative to ||h_0||. Without absolute positions it is 0 up to
    rounding in every layer (no position can be told from another: the NoPE/RoPE edge case)."""
    kind = positional_kind(model)
    if kind == "learned":
        raise BadInputError(
            "this claim is about models without absolute positions; this model has learned "
            "position embeddings, so P0 is identifiable from its embedding (use a RoPE or NoPE model)"
        )
    if not 0 <= token < model.cfg.d_vocab or not 2 <= length <= model.cfg.n_ctx:
        raise BadInputError(f"need a token in 0..{model.cfg.d_vocab - 1} and a length in 2..{model.cfg.n_ctx}")
    tokens = torch.full((1, length), token, dtype=torch.long, device=model.cfg.device)
    names = [hooks.resid_post(l) for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in set(names))
    rows = []
    for layer, name in enumerate(names):
        h = cache[name][0].double()
        rows.append({"layer": layer, "relative_spread": float((h - h[:1]).norm(dim=-1).max() / h[0].norm())})
    return pd.DataFrame(rows).set_index("layer")
