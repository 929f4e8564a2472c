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

from p0circuit.core.errors import CheckpointError, NonFiniteError


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


LOGIT_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
"""Largest |hooked - Hugging Face| logit difference, relative to the largest |logit| (at least 1),
that a load accepts; 5e-2 for half-precision dtypes. A conversion mistake (a dropped norm, a
wrong scale, a misread window) gives differences of order one."""


@torch.no_grad()
def check_logits(hf_model: Any, model: Any, where: Any, length: int = 24) -> float:
    """Compare the hooked model's logits with the Hugging Face model's on random ids (two prompts,
    longer than any sliding window up to ``length``); raise :class:`CheckpointError` when they
    differ beyond :data:`LOGIT_TOLERANCE`. Returns the largest difference."""
    cfg = model.cfg
    length = min(length, cfg.n_ctx)
    ids = torch.randint(0, cfg.d_vocab, (2, length), generator=torch.Generator().manual_seed(0))
    hf_device = next(hf_model.parameters()).device
    try:
        expected = hf_model(ids.to(hf_device)).logits.float().cpu()
        got = model(ids.to(cfg.device)).float().cpu()
    except RuntimeError as e:  # e.g. a mixture of experts mixing float32 routing weights into half precision
        raise CheckpointError(f"{where}: this {cfg.original_architecture} model does not run in {cfg.dtype} here "
                              f"({str(e)[:160]}); load it with dtype=torch.float32") from None
    if expected.shape != got.shape:
        raise CheckpointError(f"{where}: the converted model gives logits of shape {tuple(got.shape)}, transformers "
                              f"{tuple(expected.shape)}; the {cfg.original_architecture} conversion does not fit this config")
    diff = float((expected - got).abs().max())
    scale = max(1.0, float(expected.abs().max()))
    tol = LOGIT_TOLERANCE.get(cfg.dtype, 5e-2)
    if not diff <= tol * scale:
        raise CheckpointError(
            f"{where}: TransformerLens' conversion of this {cfg.original_architecture} checkpoint does not reproduce "
            f"transformers' forward (max logit difference {diff:.3g}, largest logit {scale:.3g}); the config uses a "
            "feature the conversion does not carry, so p0circuit refuses it rather than patch a different model")
    return diff
