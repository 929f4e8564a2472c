"""Training small models from a spec on synthetic or local data, with resumable checkpoints."""

from p0circuit.studies.training.data import BigramBackcopy, MarkovSource, TextSource, hf_dataset_source
from p0circuit.studies.training.trainer import TrainConfig, load_trained, save_checkpoint, train

__all__ = ["BigramBackcopy", "MarkovSource", "TextSource", "TrainConfig", "hf_dataset_source", "load_trained",
           "save_checkpoint", "train"]
