"""Planted models: transformers whose P0-sink circuit is written into the weights by hand."""

from p0circuit.planted.build import PlantedModel, PlantSpec, build_planted, p0_like_positions

__all__ = ["PlantSpec", "PlantedModel", "build_planted", "p0_like_positions"]
