"""BOS ablation: the same texts with and without a BOS token, side by side.

The paper's first claim: remove [BOS] from LLaMA-3 or Qwen and the sink vanishes at layer 1 but
reappears at layer 2. :func:`bos_ablation` runs the sink report on ``[BOS] + x`` and on ``x``
and reports, per layer, the P0 norm ratio and attention to P0 in both runs, the onset layers,
and the layer shift (onset without BOS minus onset with BOS; None when the sink never forms).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
from torch import Tensor

from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.figures.plotting import finish, new_figure
from p0circuit.measures import SinkReport, sink_report
from p0circuit.models.tokens import check_tokens, prepend_id


@dataclass
class BosAblation:
    """Sink reports with and without BOS."""

    with_bos: SinkReport
    """Report on ``[BOS] + x``."""
    without_bos: SinkReport
    """Report on ``x``."""

    @property
    def layer_shift(self) -> Optional[int]:
        """Norm-onset layer without BOS minus with BOS (None if either never reaches the threshold)."""
        a, b = self.with_bos.norm_onset_layer, self.without_bos.norm_onset_layer
        return None if a is None or b is None else b - a

    def to_frame(self) -> pd.DataFrame:
        """Per layer: norm ratio and strongest attention to P0, with and without BOS."""
        rows = []
        for layer in range(self.with_bos.n_layers):
            rows.append({
                "layer": layer,
                "norm_ratio_with_bos": self.with_bos.norm_ratio_resid[layer],
                "norm_ratio_without_bos": self.without_bos.norm_ratio_resid[layer],
                "max_alpha0_with_bos": max(self.with_bos.alpha[layer]),
                "max_alpha0_without_bos": max(self.without_bos.alpha[layer]),
            })
        return pd.DataFrame(rows).set_index("layer")

    def summary(self) -> str:
        """One line: onset layers and the shift."""
        return (f"norm onset with BOS: {self.with_bos.norm_onset_layer}, without: {self.without_bos.norm_onset_layer}; "
                f"layer shift: {self.layer_shift}")

    def plot(self, path: Optional[Union[str, Path]] = None) -> Any:
        """Norm ratio and max attention to P0 per layer, with and without BOS."""
        frame = self.to_frame()
        fig, (ax1, ax2) = new_figure(2)
        for col, label in (("with_bos", "with BOS"), ("without_bos", "without BOS")):
            ax1.plot(frame.index, frame[f"norm_ratio_{col}"], marker="o", label=label)
            ax2.plot(frame.index, frame[f"max_alpha0_{col}"], marker="o", label=label)
        ax1.set(xlabel="layer", ylabel="||h_0|| / mean ||h_t||", yscale="log", title="P0 norm ratio")
        ax2.set(xlabel="layer", ylabel="max over heads of alpha_0", title="attention to P0", ylim=(0, 1.05))
        ax1.legend()
        return finish(fig, path)


@entry_point
def bos_ablation(model: Any, tokens: Tensor, bos_token_id: Optional[int] = None, **report_kw: Any) -> BosAblation:
    """Compare ``[BOS] + tokens`` with ``tokens`` (``tokens`` must not start with BOS already).

    ``bos_token_id`` defaults to what ``prepend_bos=True`` would prepend
    (:func:`p0circuit.models.tokens.prepend_id`; choose it with :func:`p0circuit.set_bos`)."""
    tokens = check_tokens(model, tokens, min_len=2)
    if bos_token_id is None:
        try:
            bos_token_id = prepend_id(model)  # refuses a tokenizer "BOS" that is no start-of-text token
        except BadInputError as e:
            raise BadInputError(f"{e}; or pass bos_token_id=... to bos_ablation") from None
    if bool((tokens[:, 0] == bos_token_id).any()):
        raise BadInputError(
            f"some prompts already start with BOS (id {bos_token_id}): pass the prompts without BOS, "
            "bos_ablation adds it for the 'with BOS' run"
        )
    if tokens.shape[1] + 1 > model.cfg.n_ctx:
        raise BadInputError(f"prompts of length {tokens.shape[1]} leave no room for BOS in n_ctx={model.cfg.n_ctx}")
    bos = torch.full((tokens.shape[0], 1), bos_token_id, dtype=tokens.dtype, device=tokens.device)
    with_bos = sink_report(model, torch.cat([bos, tokens], dim=1), **report_kw)
    without = sink_report(model, tokens, **report_kw)
    return BosAblation(with_bos, without)
