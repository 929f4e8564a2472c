"""Typed, validated model specs that build a ``HookedTransformer`` with no network access.

A :class:`ModelSpec` names the architectural choices that matter for the P0 sink: how positions
are encoded (``rope``, ``nope``, ``learned``), the pre-norm type, the MLP type, parallel
attention+MLP blocks (Pythia/GPT-J style) and sliding-window attention (Mistral/Olmo style).

NoPE is not a TransformerLens option: a NoPE model is built with learned absolute positions whose
table ``W_pos`` is zeroed and frozen, so no positional signal reaches the residual stream.
"""

import os
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from p0circuit.core.entries import SPEC_LAYERS
from p0circuit.core.errors import ConfigError, from_known_keys
from p0circuit.core.args import entry_point
from p0circuit.core.threads import share

MAX_PARAMETERS = 10**10
"""The largest model a spec builds (40 GB of float32 weights): a bigger ask is a typo."""

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The dtypes a spec builds in, by name."""


def machine_memory() -> int:
    """This machine's total memory in bytes (physical pages times page size)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_memory(n_parameters: int, dtype: torch.dtype, what: str, fix: str,
                      error: type = ConfigError) -> None:
    """Refuse, before any tensor is allocated, a model whose ``n_parameters`` weights in ``dtype``
    alone exceed this machine's memory (:func:`machine_memory`): building it would swap for minutes,
    then fail. ``what`` names the model, ``fix`` says what to do."""
    size = n_parameters * torch.empty((), dtype=dtype).element_size()
    limit = machine_memory()
    if size > limit:
        raise error(f"{what} would hold about {n_parameters:.3g} parameters, {size / 2**30:,.1f} GiB in "
                    f"{str(dtype).removeprefix('torch.')}, more than this machine's memory ({limit / 2**30:,.1f} GiB "
                    f"in all): {fix}")


_CHOICES: dict[str, tuple[str, ...]] = {
    "pos": ("rope", "nope", "learned"),
    "norm": ("rms", "ln"),
    "mlp": ("plain", "gated"),
    "act_fn": ("gelu", "relu", "silu", "gelu_new"),
}


@entry_point  # __post_init__ checks every field with a message that names the fix
@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build a small hooked transformer from scratch."""

    n_layers: int = SPEC_LAYERS
    """Number of transformer blocks."""
    d_model: int = 64
    """Residual stream width."""
    n_heads: int = 4
    """Attention heads per block."""
    d_head: int = 16
    """Width of each head."""
    d_mlp: int = 256
    """MLP hidden width."""
    d_vocab: int = 64
    """Vocabulary size."""
    n_ctx: int = 64
    """Longest sequence the model accepts."""
    pos: str = "rope"
    """Position encoding: rotary, none at all, or learned absolute embeddings."""
    norm: str = "rms"
    """Pre-norm type before each sublayer and before the unembedding."""
    mlp: str = "plain"
    """Plain (``W_out act(W_in x)``) or gated (``W_out (act(W_gate x) * W_in x)``) MLP."""
    act_fn: str = "gelu"
    """MLP activation function."""
    parallel: bool = False
    """Attention and MLP read the same residual and are added together (Pythia/GPT-J)."""
    window: Optional[int] = None
    """Sliding-window size for every layer (Mistral style); None for full causal attention."""
    rotary_dim: Optional[int] = None
    """Rotated dimensions per head with ``pos="rope"``; None rotates all ``d_head``."""
    n_kv_heads: Optional[int] = None
    """Key/value heads for grouped-query attention (Llama/SmolLM2 style: ``n_heads / n_kv_heads``
    query heads share each); None gives every query head its own keys and values."""
    seed: int = 0
    """Seed for the weight initialization."""
    dtype: Union[str, torch.dtype] = "float32"
    """The built model's dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"`` (or the torch dtype); kept as
    its name, so that :meth:`to_dict` stays plain JSON."""

    def __post_init__(self) -> None:
        name = str(self.dtype).removeprefix("torch.") if isinstance(self.dtype, torch.dtype) else self.dtype
        if name not in DTYPES:
            raise ConfigError(f"ModelSpec.dtype={self.dtype!r} is not a dtype a spec builds in; choose one of "
                              f"{tuple(DTYPES)} (a string, or torch.float32, torch.float16, torch.bfloat16)")
        object.__setattr__(self, "dtype", name)
        if self.n_kv_heads is not None and (
            isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1
            or not isinstance(self.n_heads, int) or self.n_heads % self.n_kv_heads
        ):
            raise ConfigError(f"ModelSpec.n_kv_heads must be None or a positive int dividing n_heads={self.n_heads}, "
                              f"got {self.n_kv_heads!r}")
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ModelSpec.{name} must be a positive int, got {value!r}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigError(
                    f"ModelSpec.{name}={getattr(self, name)!r} is not valid; choose one of {choices}"
                )
        size = self.n_parameters()
        if size > MAX_PARAMETERS:
            raise ConfigError(f"ModelSpec would hold {size:.3g} parameters ({size * 4 / 2**30:.3g} GiB in float32), "
                              f"more than the {MAX_PARAMETERS:.0e} p0circuit builds from a spec; use smaller sizes "
                              "(or load a trained checkpoint)")
        check_fits_memory(size, DTYPES[self.dtype], "ModelSpec", "use smaller sizes (n_layers, d_model, d_mlp, "
                          "d_vocab), or a smaller dtype")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ConfigError(f"ModelSpec.window must be None or a positive int, got {self.window!r}")
        if self.rotary_dim is not None:
            if self.pos != "rope":
                raise ConfigError("ModelSpec.rotary_dim only applies with pos='rope'")
            if not (0 < self.rotary_dim <= self.d_head and self.rotary_dim % 2 == 0):
                raise ConfigError(
                    f"ModelSpec.rotary_dim must be even and in 1..d_head={self.d_head}, "
                    f"got {self.rotary_dim}"
                )

    def n_parameters(self) -> int:
        """Parameters of the built model (embeddings, attention, MLPs, norms), for the size check."""
        kv = self.n_kv_heads or self.n_heads
        attn = self.d_model * self.d_head * (2 * self.n_heads + 2 * kv)
        mlp = self.d_model * self.d_mlp * (3 if self.mlp == "gated" else 2)
        return self.n_layers * (attn + mlp) + 2 * self.d_vocab * self.d_model + self.n_ctx * self.d_model

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelSpec":
        """Build from a plain dict, naming unknown keys and the valid ones."""
        return from_known_keys(cls, d, "ModelSpec")  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; :meth:`from_dict` inverts it. ``dtype`` is left out when it is the default,
        float32, so that the records written before specs had a dtype (a training run's spec.json, which
        a resume compares) read the same."""
        out = asdict(self)
        if out["dtype"] == "float32":
            del out["dtype"]
        return out

    def to_config(self, device: str = "cpu") -> HookedTransformerConfig:
        """The TransformerLens config this spec stands for."""
        local = self.window is not None
        return HookedTransformerConfig(
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_head=self.d_head,
            d_mlp=self.d_mlp,
            d_vocab=self.d_vocab,
            n_ctx=self.n_ctx,
            act_fn=self.act_fn,
            normalization_type="RMS" if self.norm == "rms" else "LN",
            positional_embedding_type="rotary" if self.pos == "rope" else "standard",
            rotary_dim=self.rotary_dim if self.pos == "rope" else None,
            gated_mlp=self.mlp == "gated",
            parallel_attn_mlp=self.parallel,
            use_local_attn=local,
            window_size=self.window,
            attn_types=["local"] * self.n_layers if local else None,
            n_key_value_heads=self.n_kv_heads,
            default_prepend_bos=False,
            seed=self.seed,
            device=device,
            dtype=DTYPES[self.dtype],
            model_name=f"p0circuit-spec-{self.pos}-{self.norm}",
        )

    @entry_point
    def build(self, device: str = "cpu") -> HookedTransformer:
        """A freshly initialized ``HookedTransformer``; no tokenizer, nothing downloaded."""
        model = HookedTransformer(self.to_config(device), move_to_device=True)
        if self.pos == "nope":
            with torch.no_grad():
                model.W_pos.zero_()
            model.W_pos.requires_grad_(False)
        model.p0_spec = self  # type: ignore[attr-defined]  # read back by positional_kind()
        return share(model)  # the user's own forwards share a busy machine too (core/threads.py)


@entry_point
def positional_kind(model: HookedTransformer) -> str:
    """``"rope"``, ``"nope"`` or ``"learned"`` for a hooked model (NoPE = all-zero frozen W_pos)."""
    pet = model.cfg.positional_embedding_type
    if pet == "rotary":
        return "rope"
    if pet in ("standard", "shortformer"):
        w_pos = model.W_pos
        if not w_pos.requires_grad and bool((w_pos == 0).all()):
            return "nope"
        return "learned"
    return str(pet)


