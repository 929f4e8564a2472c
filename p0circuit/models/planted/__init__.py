"""Planted models: transformers whose P0-sink circuit is written into the weights by hand."""

from p0circuit.core.entries import VARIANTS
from p0circuit.models.planted.build import (
    PlantedModel,
    PlantSpec,
    build_planted,
    p0_like_positions,
    regular_prompts,
)

__all__ = ["VARIANTS", "PlantSpec", "PlantedModel", "build_planted", "p0_like_positions", "regular_prompts"]
