"""Checkpoints are verified, never patched up silently.

Hugging Face's loaders fill a tensor that a checkpoint lacks with a fresh random initialization
and only warn; a layer the config names but the weights lack, a truncated file or a NaN weight
then yields a model that runs and a plausible, wrong sink report. Every loader in p0circuit
passes through here: each tensor the architecture needs is present, of the right shape and
finite, extra tensors are named, and unreadable files give one :class:`CheckpointError` that
names the file and the fix.
"""

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file

from p0circuit.errors import CheckpointError, NonFiniteError


def _listed(names: Any, n: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _problems(*kinds: tuple[str, list[str]]) -> list[str]:
    """``"<count> <what>: <names>"`` for each non-empty kind of problem (shapes listed 3 at most)."""
    return [f"{len(names)} {what}: {_listed(names, 3 if 'shape' in what else 6)}" for what, names in kinds if names]


def check_loading_info(path: Path, info: Mapping[str, Any]) -> None:
    """Raise unless transformers' ``output_loading_info`` says every tensor was loaded as saved."""
    mismatched = [f"{name} (saved {tuple(saved)}, config needs {tuple(needed)})"
                  for name, saved, needed in info.get("mismatched_keys") or []]
    problems = _problems(("tensor(s) the config needs are missing", list(info.get("missing_keys") or [])),
                         ("tensor(s) have the wrong shape", mismatched),
                         ("tensor(s) the config does not use", list(info.get("unexpected_keys") or [])))
    if problems:
        raise CheckpointError(
            f"{str(path)!r}: config and weights disagree: " + "; ".join(problems) + ". Loading would fill "
            "the gaps with random weights; re-save the checkpoint, or fix config.json to match its weights")


def check_finite(state: Mapping[str, torch.Tensor], where: Any) -> None:
    """Raise :class:`NonFiniteError` naming the tensors of ``state`` that hold NaN or inf."""
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteError(f"{str(where)!r}: weight(s) {_listed(bad)} hold NaN or inf; the checkpoint is corrupt "
                             "(or was saved from a diverged run): use an earlier or re-saved checkpoint")


def read_json(file: Path, what: str) -> Any:
    """A JSON file, or one :class:`CheckpointError` naming it when it is unreadable."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{str(file)!r} ({what}) does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{str(file)!r} ({what}) is not valid JSON ({type(e).__name__}: {str(e)[:120]}); "
                              "the file is truncated or garbled: re-save the checkpoint") from None


def read_safetensors(file: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A safetensors file, or one :class:`CheckpointError` naming it when it is unreadable."""
    try:
        return load_file(str(file), device=device)
    except FileNotFoundError:
        raise CheckpointError(f"{str(file)!r} does not exist") from None
    except Exception as e:  # safetensors raises SafetensorError, OSError or ValueError by case
        raise CheckpointError(f"{str(file)!r} cannot be read as safetensors ({type(e).__name__}: {str(e)[:160]}); "
                              "the file is truncated or garbled: re-save the checkpoint") from None


def load_strict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: Path) -> None:
    """``model.load_state_dict(state)`` that names missing, extra and misshapen tensors."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    shapes = [f"{k} (saved {tuple(state[k].shape)}, needs {tuple(v.shape)})" for k, v in own.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = _problems(("tensor(s) missing", missing), ("with the wrong shape", shapes),
                         ("not part of the model", extra))
    if problems:
        raise CheckpointError(f"{str(where)!r}: the weights do not match its spec.json: " + "; ".join(problems)
                              + ". Re-save the checkpoint, or fix spec.json to match its weights")
    params = dict(model.named_parameters())  # buffers such as attention masks hold -inf on purpose
    check_finite({k: v for k, v in state.items() if k in params}, where)
    model.load_state_dict(state)
