"""Model entries: the one place a string like ``planted:rope`` or ``checkpoint:runs/train/step_64``
becomes a model. The command line, sweep configs, the report and the tracker all resolve here.

=====================  ======================================================================
entry                  model
=====================  ======================================================================
``planted:<variant>``  a planted model (:data:`p0circuit.core.entries.VARIANTS`), with its ground truth
``spec:<family>``      a freshly initialized small model (:data:`p0circuit.core.entries.SPEC_FAMILIES`)
``checkpoint:<path>``  a local checkpoint: a Hugging Face directory (``config.json``), a
                       p0circuit training checkpoint (``spec.json``, written by ``p0circuit train``)
                       or a GGUF file (``.gguf``)
``real:<name>``        a real pretrained model shipped by packages (:data:`p0circuit.core.entries.REAL`:
                       ``real:smollm2``, ``real:gemma3``, ``real:qwen2.5``)
``hub:<name>``         ``HookedTransformer.from_pretrained`` (needs a hub or the HF cache), no BOS
=====================  ======================================================================
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from transformer_lens import HookedTransformer

from p0circuit.core.errors import CheckpointError
from p0circuit.core.args import entry_point
from p0circuit.models.checkpoints import load_checkpoint, load_pretrained
from p0circuit.models.gguf import load_gemma3, load_gguf, load_qwen25, load_smollm2
from p0circuit.core.entries import SPEC_FAMILIES, REAL, VARIANTS, check_model_entry
from p0circuit.models.spec import ModelSpec
from p0circuit.models.planted import PlantedModel, build_planted
from p0circuit.models.trained import load_trained
from p0circuit.core.types import Circuit

@dataclass
class Resolved:
    """A model from an entry, with its ground truth when it is planted."""

    entry: str
    """The entry it came from."""
    model: HookedTransformer
    """The hooked model."""
    label: str
    """A human-readable description."""
    plant: Optional[PlantedModel] = None
    """The planted model (``planted:`` entries only)."""
    start_token: Optional[str] = None
    """The start-of-text token of a real model whose tokenizer BOS is not one (:data:`START_TOKENS`)."""
    variant: Optional[str] = None
    """What the weights are when they come from a GGUF file (``real:`` entries, ``checkpoint:<file>.gguf``):
    the released model and its quantization, read from the file (:func:`p0circuit.models.gguf.variant`;
    the model carries it as ``model.cfg.variant``); None for other entries."""

    @property
    def truth(self) -> Optional[Circuit]:
        """The planted ground truth, or None."""
        return None if self.plant is None else self.plant.truth

    @property
    def sink_heads(self) -> Optional[tuple[tuple[int, int], ...]]:
        """The planted sink heads, or None."""
        return None if self.plant is None else self.plant.sink_heads


LOADERS = {"smollm2": load_smollm2, "gemma3": load_gemma3, "qwen2.5": load_qwen25}
"""The loader of each real model (:data:`p0circuit.core.entries.REAL`)."""
assert sorted(LOADERS) == sorted(REAL)


START_TOKENS = {"smollm2": "<|endoftext|>", "qwen2.5": "<|endoftext|>"}
"""What the with-BOS setting puts at position 0 of real models whose tokenizer prepends no start of text: each
one's document separator. SmolLM2's ``bos_token`` is ``<|im_start|>``, a chat-turn marker; its training documents
were separated by ``<|endoftext|>``. Qwen2.5's tokenizer prepends nothing and its released tokenizer has no
``bos_token`` at all (the GGUF file names ``<|endoftext|>``, id 151643, with ``add_bos_token`` false): its
pretraining documents end with ``<|endoftext|>``, so a prompt after one is a prompt at a document's start, the
closest Qwen comes to a BOS; stated here so that it does not depend on what a tokenizer file calls its BOS."""


def load_any_checkpoint(path: Union[str, Path], device: str = "cpu") -> HookedTransformer:
    """A local checkpoint of any format: a p0circuit training checkpoint (``spec.json``), a Hugging
    Face directory (``config.json``) or a GGUF file."""
    path = Path(path)
    if path.suffix == ".gguf":
        return load_gguf(path, device=device)
    if (path / "spec.json").is_file():
        return load_trained(path, device=device)
    if path.is_dir() and not (path / "config.json").is_file():
        raise CheckpointError(
            f"{str(path)!r} has neither spec.json (a p0circuit training checkpoint, e.g. runs/train/step_N) nor "
            "config.json (a Hugging Face checkpoint directory); pass one of those"
        )
    return load_checkpoint(path, device=device)


@entry_point
def load_model(entry: str, *, seed: int = 0, device: str = "cpu") -> Resolved:
    """The model named by ``entry`` (see the module docstring); ``seed`` initializes ``spec:`` models.

    Example::

        >>> import p0circuit as p0
        >>> resolved = p0.load_model("planted:rope")
        >>> resolved.model.cfg.n_layers, resolved.truth is not None
        (4, True)
    """
    kind, arg = check_model_entry(entry)
    if kind == "planted":
        plant = build_planted(**VARIANTS[arg])
        return Resolved(entry, plant.model.to(device, print_details=False), f"planted model ({arg})", plant)
    if kind == "spec":
        model = ModelSpec(seed=seed, **SPEC_FAMILIES[arg]).build(device)
        return Resolved(entry, model, f"untrained {arg} model (ModelSpec, seed {seed})")
    if kind == "checkpoint":
        model = load_any_checkpoint(arg, device=device)
        return Resolved(entry, model, f"checkpoint {arg}", variant=getattr(model.cfg, "variant", None))
    if kind == "real":
        model = LOADERS[arg](device=device)
        return Resolved(entry, model, f"real model {arg}", start_token=START_TOKENS.get(arg),
                        variant=getattr(model.cfg, "variant", None))
    return Resolved(entry, load_pretrained(arg, prepend_bos=False, device=device), f"hub model {arg}")
