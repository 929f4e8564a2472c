"""Training a ``HookedTransformer`` from a :class:`~p0circuit.ModelSpec`, with checkpoints at
log-spaced steps, resumable after interruption with no lost or repeated steps.

Each checkpoint is a directory ``step_<N>/`` holding ``model.safetensors`` (the model's state
dict, readable by ``safetensors`` and loadable into TransformerLens through :func:`load_trained`),
``spec.json`` (the model spec and training settings) and ``trainer.pt`` (optimizer state and
step). It is written to a temporary directory and renamed into place, so a killed run never
leaves half a checkpoint. Data are deterministic by step (:mod:`p0circuit.studies.training.data`), so
resuming from the last checkpoint replays exactly the batches that were lost, and on the CPU the
result is bitwise equal to an uninterrupted run.
"""

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors.torch import save_file
from p0circuit.core.progress import tqdm

from transformer_lens import HookedTransformer

from p0circuit.core.errors import BadInputError, CheckpointError, ConfigError, NonFiniteError
from p0circuit.core.args import entry_point
from p0circuit.core.io import out_dir, remove_stale, write_dir_atomic
from p0circuit.models.spec import ModelSpec
from p0circuit.models.verify import read_json
from p0circuit.models.trained import load_trained


@entry_point  # __post_init__ checks every field with a message that names the fix
@dataclass(frozen=True)
class TrainConfig:
    """Optimization and checkpointing settings."""

    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 32
    """Sequences per step."""
    seq_len: int = 64
    """Tokens per sequence."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    warmup: int = 100
    """Linear warm-up steps; cosine decay to 10% of ``lr`` afterwards."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clipping (0 disables it)."""
    n_checkpoints: int = 12
    """Checkpoints at log-spaced steps (the last step always included)."""
    seed: int = 0
    """Seed of the optimizer-side randomness (data are seeded by their source)."""
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "n_checkpoints"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        for name in ("lr", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"TrainConfig.{name} must be a finite number, got {v!r}")
        for name in ("warmup", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 2**63:
                raise ConfigError(f"TrainConfig.{name} must be an int in 0..2**63-1, got {v!r}")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError(f"TrainConfig needs lr > 0 and weight_decay, grad_clip >= 0; got lr={self.lr}, "
                              f"weight_decay={self.weight_decay}, grad_clip={self.grad_clip}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"TrainConfig.device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")

    def checkpoint_steps(self) -> list[int]:
        """Log-spaced steps in 1..steps (unique, sorted, ending at ``steps``)."""
        n = min(self.n_checkpoints, self.steps)
        if n == 1:
            return [self.steps]
        pts = {max(1, round(math.exp(math.log(self.steps) * i / (n - 1)))) for i in range(n)}
        return sorted(pts | {self.steps})

    def lr_at(self, step: int) -> float:
        """Learning rate for (0-based) optimizer step ``step``."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _device(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("TrainConfig.device='cuda' but no CUDA device is available: use 'auto' or 'cpu'")
    return choice


def _latest(out: Path) -> Optional[Path]:
    found = [(int(p.name.split("_")[1]), p) for p in out.glob("step_*")
             if p.is_dir() and p.name.split("_")[1].isdigit() and (p / "trainer.pt").exists()]
    return max(found)[1] if found else None


def _check_resume(latest: Path, spec: ModelSpec, config: TrainConfig, source: Any) -> None:
    """A resume must continue the same run: same architecture, data and training settings (only
    ``steps``, checkpoints and the device may change)."""
    meta = read_json(latest / "spec.json", "the checkpoint's spec")
    saved = {"spec": meta.get("spec"), "source": meta.get("source"),
             "train": {k: v for k, v in (meta.get("train") or {}).items() if k not in _MAY_CHANGE}}
    now = {"spec": spec.to_dict(), "source": repr(source),
           "train": {k: v for k, v in asdict(config).items() if k not in _MAY_CHANGE}}
    diffs = [f"{part}.{k}: saved {saved[part].get(k)!r}, now {now[part].get(k)!r}"
             for part in ("spec", "train") for k in sorted(set(saved[part] or {}) | set(now[part]))
             if (saved[part] or {}).get(k) != now[part].get(k)]
    if saved["source"] != now["source"]:
        diffs.append(f"data: saved {saved['source']}, now {now['source']}")
    if diffs:
        raise ConfigError(f"{str(latest.parent)!r} holds a different run ({'; '.join(diffs[:4])}); resuming would mix "
                          "the two. Train into a new --out, or repeat the saved run's settings to continue it")


_MAY_CHANGE = ("steps", "n_checkpoints", "device")


@entry_point
def save_checkpoint(out: Union[str, Path], step: int, model: HookedTransformer, optimizer: torch.optim.Optimizer,
                    spec: ModelSpec, config: TrainConfig, source: Any, loss: float) -> Path:
    """Write ``out/step_<step>/`` atomically (temporary directory, then rename)."""
    out = Path(out)
    if step < 0 or not out.is_dir():
        raise BadInputError(f"save_checkpoint: step={step!r} must be >= 0 and out={str(out)!r} an existing directory")
    _check_source("save_checkpoint", source)
    meta = {"step": step, "loss": loss, "spec": spec.to_dict(), "train": asdict(config), "source": repr(source),
            "bos": getattr(source, "bos", None)}

    def fill(tmp: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        (tmp / "spec.json").write_text(json.dumps(meta, indent=2))
        torch.save({"step": step, "optimizer": optimizer.state_dict()}, tmp / "trainer.pt")

    return write_dir_atomic(out / f"step_{step}", fill)


def _check_source(where: str, source: Any) -> None:
    if not callable(getattr(source, "batch", None)):
        raise BadInputError(f"{where}: source={source!r:.60} has no batch(step, n, length) method; pass a MarkovSource, "
                            "BigramBackcopy or TextSource (p0circuit.studies.training)")


@entry_point
def train(
    spec: ModelSpec, source: Any, config: TrainConfig, out: Union[str, Path], *, stop_after: Optional[int] = None,
    progress: bool = True,
) -> Any:
    """Train (or resume) and return the model; checkpoints go to ``out``.

    ``stop_after`` ends the run after that many optimizer steps of this call (used to test
    interruption); a later call resumes from the last checkpoint.
    """
    _check_source("train", source)
    if stop_after is not None and stop_after < 1:
        raise BadInputError(f"train: stop_after={stop_after!r} must be None or >= 1 (optimizer steps of this call)")
    out = out_dir("train", out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out)  # a save cut short by a kill: never renamed, never read
    device = _device(config.device)
    if getattr(source, "vocab", spec.d_vocab) > spec.d_vocab:
        raise ConfigError(f"the data use {source.vocab} token ids but the model has d_vocab={spec.d_vocab}")
    if config.seq_len > spec.n_ctx:
        raise ConfigError(f"TrainConfig.seq_len={config.seq_len} exceeds the model's n_ctx={spec.n_ctx}")
    model = spec.build(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    start = 0
    latest = _latest(out)
    if latest is not None:
        _check_resume(latest, spec, config, source)
        resumed = load_trained(latest, device)
        model.load_state_dict(resumed.state_dict())
        try:
            state = torch.load(latest / "trainer.pt", map_location=device)
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"])
        except Exception as e:  # a truncated or foreign trainer state: torch and pickle raise their own types
            raise CheckpointError(f"{str(latest / 'trainer.pt')!r} (the optimizer state) cannot be read "
                                  f"({type(e).__name__}: {str(e)[:120]}); delete {str(latest)!r} to resume from the "
                                  "checkpoint before it, or train into a new --out") from None
        if start >= config.steps:
            raise ConfigError(f"{str(out)!r} already holds a run of {start} steps, and steps={config.steps} asks for no "
                              "more: nothing to train. Ask for more steps to continue it, or train into a new --out")
    torch.manual_seed(config.seed + start)
    checkpoints = set(config.checkpoint_steps())
    end = config.steps if stop_after is None else min(config.steps, start + stop_after)
    bar = tqdm(range(start, end), desc="train", disable=not progress, initial=start, total=config.steps)
    loss_value, t0, seen = float("nan"), time.perf_counter(), 0
    model.train()
    for step in bar:
        tokens = source.batch(step, config.batch_size, config.seq_len).to(device)
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        loss = model(tokens, return_type="loss")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise NonFiniteError(f"the training loss is {loss_value} at step {step + 1} (lr {config.lr_at(step):.3g}): the run "
                                 f"diverged; the checkpoints written before it are kept in {str(out)!r}. Use a smaller "
                                 "learning rate or more warmup, in a new --out")
        seen += tokens.numel()
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{seen / (time.perf_counter() - t0):.0f}")
        if step + 1 in checkpoints:
            save_checkpoint(out, step + 1, model, optimizer, spec, config, source, loss_value)
    bar.close()
    model.eval()
    return model
