"""The paper's experiments as reusable tools: BOS ablation, cone model, perturbations,
architecture survey, direction and stabilization. Each returns data (a dataclass or DataFrame)
and has a plot function that saves a PNG."""

from p0circuit.studies.experiments.bos import BosAblation, bos_ablation
from p0circuit.studies.experiments.cone import (
    ConeCurve,
    ConeFit,
    cone_expected_sq_norm,
    cone_monte_carlo,
    fit_cone,
    measure_attention_output,
)
from p0circuit.studies.experiments.perturb import (
    PERTURBATIONS,
    PerturbationResults,
    perturbations,
    repeated_token_spread,
)
from p0circuit.studies.experiments.stability import direction_by_layer, plot_direction, plot_stabilization, stabilization
from p0circuit.studies.experiments.survey import SPEC_FAMILIES, default_models, plot_survey, survey

__all__ = [
    "SPEC_FAMILIES", "PERTURBATIONS", "BosAblation", "ConeCurve", "ConeFit", "PerturbationResults", "bos_ablation",
    "cone_expected_sq_norm", "cone_monte_carlo", "default_models", "direction_by_layer", "fit_cone",
    "measure_attention_output", "perturbations", "plot_direction", "plot_stabilization", "plot_survey", "repeated_token_spread", "stabilization", "survey",
]
