"""The conversion cache: a GGUF file's converted float32 weights, config and tokenizer, kept under
``cache_root()/gguf`` (:func:`p0circuit.core.io.cache_root`) so that a later load skips transformers' parsing and
dequantization (:func:`p0circuit.models.gguf.load_gguf`).

An entry is keyed by the file's path, size and modification time, the cache format (:data:`CACHE_VERSION`) and
transformers' version, and carries the same facts in ``p0circuit.json``. An entry of another version, or one that
cannot be read, is never used: the load converts again and says why, naming the entries it could not use and
how to free their space.
"""

import glob
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from p0circuit.core.io import write_dir_atomic
from p0circuit.models.checkpoints import load_tokenizer

CACHE_VERSION = 3
"""Bumped whenever what the cache holds changes; older entries are then ignored (3: matrices stored in the layout
the hooked model keeps them in, :data:`TRANSPOSED`)."""
TRANSPOSED = ".T"
"""Suffix of a stored matrix that the model holds as the transpose of a contiguous tensor (an MLP's or the
unembedding's weight: :mod:`p0circuit.models.layout`): the file keeps that contiguous tensor and a read gives
back its transpose, so a load makes no copy of it (the memory-mapped file is the weight)."""
STAMP = "p0circuit.json"
"""The file in each entry that says what it was made from and by which versions."""


def stamp_of(path: Path) -> dict[str, Any]:
    """What an entry for GGUF file ``path`` is made from and by: the file (resolved: links to one file share
    its entry), its size and time, the cache format and transformers' version."""
    real = path.resolve()
    stat = real.stat()
    return {"file": str(real), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "cache_version": CACHE_VERSION,
            "transformers": transformers.__version__}


def entry_of(stamp: dict[str, Any], root: Path) -> Path:
    """The entry's directory under ``root``: the file's name and a digest of its stamp."""
    key = "|".join(str(stamp[k]) for k in ("file", "size", "mtime_ns", "cache_version", "transformers"))
    return root / "gguf" / f"{Path(stamp['file']).stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _why(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    if theirs.get("cache_version") != ours["cache_version"]:
        return (f"made by another version of p0circuit (cache format {theirs.get('cache_version', 'unstamped')}, this "
                f"one reads {ours['cache_version']})")
    if theirs.get("transformers") != ours["transformers"]:
        return f"converted under transformers {theirs.get('transformers')}, this is {ours['transformers']}"
    return "made from another copy of the file, or an earlier one (its path, size or time differ)"


def read_entry(entry: Path, stamp: dict[str, Any]) -> tuple[Optional[tuple[Any, dict[str, torch.Tensor], Any]], str]:
    """``((hf_config, state_dict, tokenizer), "")`` from the entry, or ``(None, why)`` when there is none (why:
    ""), or it is of another version or cannot be read (why: what was wrong, e.g. 'cannot be read (...)')."""
    if not (entry / "model.safetensors").is_file():
        return None, ""
    try:
        if (entry / STAMP).is_file():  # entries written before stamps existed are keyed the same way
            theirs = json.loads((entry / STAMP).read_text())
            if theirs != stamp:
                return None, _why(theirs, stamp)
        config = json.loads((entry / "hf_config.json").read_text())
        hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
        stored = load_file(str(entry / "model.safetensors"))
        weights = {k[:-len(TRANSPOSED)] if k.endswith(TRANSPOSED) else k: v.T if k.endswith(TRANSPOSED) else v
                   for k, v in stored.items()}
        return (hf_config, weights, load_tokenizer(entry)), ""
    except Exception as e:  # a damaged entry is converted again, never a crash
        return None, f"cannot be read ({type(e).__name__}: {str(e)[:200]})"


def others(entry: Path, stamp: dict[str, Any]) -> list[tuple[Path, str]]:
    """The other entries of a file of the same name, each with why it is not this file's (another version of
    p0circuit or transformers, another copy of the file)."""
    stem = entry.name.rsplit("-", 1)[0]
    out = []
    for other in sorted(entry.parent.glob(f"{glob.escape(stem)}-*")):
        if other == entry or not other.is_dir() or other.name.rsplit("-", 1)[0] != stem:
            continue
        try:
            theirs = json.loads((other / STAMP).read_text())
        except (OSError, ValueError):
            theirs = {}
        why = _why(theirs, stamp) if theirs else ("made before cache entries were stamped (by another version of "
                                                  "p0circuit or transformers, or from another copy of the file)")
        out.append((other, why))
    return out


def unusable_notice(name: str, unusable: list[tuple[Path, str]]) -> str:
    """What a load says before converting again when entries of the file could not be used."""
    listed = "; ".join(f"{path} ({why})" for path, why in unusable)
    paths = " ".join(str(path) for path, _ in unusable)
    return (f"not using the cached conversion{'s' if len(unusable) > 1 else ''} of {name}: {listed}. Converting it "
            f"again (as long as a first load); to free the old ones' space: rm -r {paths}")


def _stored(key: str, value: torch.Tensor) -> tuple[str, torch.Tensor]:
    """What the file keeps for one weight: a matrix held as the transpose of a contiguous tensor is kept as that
    tensor (:data:`TRANSPOSED`), every other weight as a contiguous copy."""
    if value.dim() == 2 and not value.is_contiguous() and value.T.is_contiguous():
        return key + TRANSPOSED, value.T.clone()
    return key, value.clone().contiguous()


def write_entry(entry: Path, stamp: dict[str, Any], hf_config: Any, state_dict: dict[str, torch.Tensor],
                tokenizer: Any) -> None:
    """Write an entry whole or not at all (:func:`~p0circuit.core.io.write_dir_atomic`)."""
    config = {k: v for k, v in hf_config.to_dict().items() if k != "quantization_config"}

    def fill(tmp: Path) -> None:
        save_file(dict(_stored(k, v.detach()) for k, v in state_dict.items()), str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        (tmp / "hf_config.json").write_text(json.dumps(config))
        (tmp / STAMP).write_text(json.dumps(stamp))

    entry.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(entry, fill)
