"""Numerical care at P0: does the huge P0 norm break attribution patching?

Attribution patching multiplies an activation difference by a gradient taken on the base run.
At position 0 of a model with a sink, two things can go wrong:

1. **Linearization.** The residual stream at P0 is 10-1000x larger than elsewhere, so the
   normalization layers divide it by a large scale (RMSNorm's ``hook_scale``): their Jacobian at P0
   is of order ``1/scale``, tiny, and patching P0 moves the norm by a large factor, far outside the
   range where the first-order estimate holds. Threshold-like components (the detector neurons,
   a saturated sink softmax with alpha ~ 0.9999 and almost no gradient) add to it.
2. **Precision.** Gradients of order ``1/scale`` multiplied by differences of order ``scale``
   cancel in float16/bfloat16 and lose digits in float32.

:func:`check_attribution` measures both on the user's own model and prompts instead of assuming:
it runs attribution patching as given, the exact method it approximates (activation patching for
nodes, path patching for edges), and attribution again on a float64 copy of the model. It flags
every node (edge) whose normalized effect differs by more than ``tol`` from the exact one
(*linearization*) or by more than ``precision_tol`` from the float64 one (*precision*), and reports
the P0 normalization scale relative to the other positions. Norms and metrics are computed in
float32 at least everywhere in p0circuit (``.float()`` before any norm), whatever the model dtype.

On the planted model (norm ratio ~13) float32 attribution equals float64 to ~1e-6 (no precision
flags), while the linearization flags the threshold components of the circuit (the
identification head and detector MLP); see ``tests/test_numerics.py``.
"""

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import pandas as pd
import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import hooks
from p0circuit.core.args import entry_point
from p0circuit.patching.methods.activation import activation_patch
from p0circuit.patching.methods.attribution import attribution_patch
from p0circuit.patching.methods.path import path_patch
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.result import PatchResult
from p0circuit.models.tokens import check_tokens

Pair = tuple[float, float]


@dataclass
class AttributionCheck:
    """Attribution vs exact patching vs float64 attribution, with flagged names."""

    approx: PatchResult
    """Attribution patching in the model's dtype."""
    exact: PatchResult
    """The exact method (activation patching for nodes, path patching for edges)."""
    precise: Optional[PatchResult]
    """Attribution patching on a float64 copy (None when ``precision=False``)."""
    linearization: dict[str, Pair] = field(default_factory=dict)
    """Names whose approximate and exact normalized effects differ by more than ``tol``."""
    precision: dict[str, Pair] = field(default_factory=dict)
    """Names whose model-dtype and float64 attribution differ by more than ``precision_tol``."""
    p0_scale_ratio: float = math.nan
    """Largest ratio over normalization layers of P0's scale to the mean scale of the other positions."""
    tol: float = 0.2
    precision_tol: float = 1e-3

    @property
    def ok(self) -> bool:
        """True when nothing is flagged."""
        return not self.linearization and not self.precision

    def table(self) -> pd.DataFrame:
        """One row per name: approximate, exact and float64 normalized effects, and flags."""
        rows = []
        for name, exact in self.exact.normalized.items():
            rows.append({
                "name": name, "attribution": self.approx.normalized.get(name, math.nan), "exact": exact,
                "float64": math.nan if self.precise is None else self.precise.normalized.get(name, math.nan),
                "linearization_flag": name in self.linearization, "precision_flag": name in self.precision,
            })
        return pd.DataFrame(rows).set_index("name")

    def summary(self) -> str:
        """A few lines for logs and notebooks."""
        lines = [f"P0 normalization scale: up to {self.p0_scale_ratio:.1f}x the other positions"]
        lines.append(f"linearization (|attribution - exact| > {self.tol}): "
                     + (", ".join(sorted(self.linearization)) or "none"))
        if self.precise is not None:
            lines.append(f"precision (|{self.approx.settings.get('dtype', 'model dtype')} - float64| > "
                         f"{self.precision_tol}): " + (", ".join(sorted(self.precision)) or "none"))
        return "\n".join(lines)


def differences(a: PatchResult, b: PatchResult, tol: float) -> dict[str, Pair]:
    """Names whose normalized effects in ``a`` and ``b`` differ by more than ``tol``
    (or are NaN in one only): name -> (a, b)."""
    out = {}
    for name, e in b.normalized.items():
        x = a.normalized.get(name, math.nan)
        if math.isnan(x) != math.isnan(e) or (not math.isnan(x) and abs(x - e) > tol):
            out[name] = (x, e)
    return out


def p0_scale_ratio(model: Any, tokens: torch.Tensor) -> float:
    """Largest (over normalization hooks) ratio of P0's normalization scale to the other positions'."""
    names = [h for layer in range(model.cfg.n_layers) for which in ("ln1", "ln2")
             if (h := hooks.ln_scale(layer, which)) in model.hook_dict]
    if not names:
        return math.nan
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    ratios = []
    for n in names:
        s = cache[n].float().reshape(tokens.shape[0], tokens.shape[1], -1)[..., 0]
        ratios.append(float(s[:, 0].mean() / s[:, 1:].mean()))
    return max(ratios)


@entry_point
@takes_options(without=("reference",))
def check_attribution(
    model: HookedTransformer, tokens: Tensor, *, level: str = "node", nodes: Optional[Sequence[Any]] = None,
    edges: Optional[Sequence[Any]] = None, tol: float = 0.2, precision: bool = True, precision_tol: float = 1e-3,
    options: PatchOptions,
) -> AttributionCheck:
    """Run attribution, the exact method and (with ``precision``) float64 attribution; flag disagreements.

    ``nodes``/``edges`` and the shared options (:class:`~p0circuit.PatchOptions`, as keywords or
    ``options=``; not ``reference``) go to all three. The float64 copy doubles the model's memory
    for the duration of the call; pass ``precision=False`` to skip it.
    """
    common: dict[str, Any] = {"options": options}
    approx = attribution_patch(model, tokens, level=level, nodes=nodes, edges=edges, **common)
    approx.settings["dtype"] = str(model.cfg.dtype).replace("torch.", "")
    if level == "node":
        exact = activation_patch(model, tokens, nodes=nodes, **common)
    else:
        exact = path_patch(model, tokens, edges=edges, **common)
    precise = None
    flagged_precision: dict[str, Pair] = {}
    if precision:
        double = copy.deepcopy(model).to(torch.float64, print_details=False)
        precise = attribution_patch(double, tokens, level=level, nodes=nodes, edges=edges, **common)
        del double
        flagged_precision = differences(approx, precise, precision_tol)
    return AttributionCheck(
        approx=approx, exact=exact, precise=precise, linearization=differences(approx, exact, tol),
        precision=flagged_precision, p0_scale_ratio=p0_scale_ratio(model, check_tokens(model, tokens, min_len=2)),
        tol=tol, precision_tol=precision_tol,
    )
