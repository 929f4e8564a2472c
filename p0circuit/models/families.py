"""The model families p0circuit loads, and how each one's config is derived.

Every causal-LM architecture that TransformerLens 3.9's ``HookedTransformer`` converts has one
:class:`Family` record here (the single list the loaders, the GGUF reader, the CLI and the docs
read). A checkpoint's ``HookedTransformerConfig`` always comes out of TransformerLens' own
per-architecture conversion (``convert_hf_model_config``), fed the checkpoint's own
``config.json``:

* most families are converted by TransformerLens *from the config* (its branch reads the
  Hugging Face fields);
* five families (Gemma, Gemma 2, Gemma 3, OLMo, OLMo 2) are keyed on hub *names* in
  TransformerLens: their branch hard-codes one released model's sizes. For those the branch of
  a named released model (``template``) gives the structure (norm placement, QK-norm,
  soft-capping, activation, embedding scaling), and the sizes are then read from the checkpoint's
  config (:data:`SIZE_FIELDS`). That is the one place where p0circuit maps fields itself, and it
  is checked: :func:`p0circuit.models.verify.check_logits` compares the hooked model's logits with
  transformers' forward at every load and refuses the model if they differ.

A family that cannot be converted exactly is listed with ``refuse``: loading it raises a
:class:`~p0circuit.core.errors.CheckpointError` that says why.
"""

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from p0circuit.core.errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class Family:
    """One architecture TransformerLens converts."""

    name: str
    """Readable family name (docs/models.md table, messages)."""
    architecture: str
    """Hugging Face ``architectures[0]``."""
    gguf: tuple[str, ...] = ()
    """GGUF ``general.architecture`` values that transformers dequantizes into this architecture."""
    template: Optional[str] = None
    """Hub name whose name-keyed TransformerLens branch gives the structure (sizes then come from the
    checkpoint's config); None when TransformerLens converts the config itself."""
    features: tuple[str, ...] = ()
    """Architecture features the family brings (docs/models.md table; the exactness tests cover each)."""
    refuse: Optional[str] = None
    """Why the family cannot be loaded exactly (None: it can)."""


FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", "GPT2LMHeadModel", ("gpt2",), features=("learned positions", "LayerNorm")),
    Family("GPT-Neo", "GPTNeoForCausalLM", features=("learned positions", "local attention", "no attention scale")),
    Family("GPT-J", "GPTJForCausalLM", features=("parallel attention + MLP", "partial rotary (adjacent pairs)")),
    Family("GPT-NeoX / Pythia", "GPTNeoXForCausalLM", features=("parallel attention + MLP", "partial rotary")),
    Family("OPT", "OPTForCausalLM", features=("learned positions (offset 2)",)),
    Family("BLOOM", "BloomForCausalLM", ("bloom",), features=("ALiBi", "embedding LayerNorm")),
    Family("Llama", "LlamaForCausalLM", ("llama",), features=("RoPE", "grouped-query attention", "gated MLP")),
    Family("Mistral", "MistralForCausalLM", ("mistral",), features=("sliding-window attention", "grouped-query attention")),
    Family("Mixtral", "MixtralForCausalLM", features=("mixture of experts", "grouped-query attention")),
    Family("Qwen2", "Qwen2ForCausalLM", ("qwen2",), features=("qkv biases", "grouped-query attention")),
    Family("Qwen3", "Qwen3ForCausalLM", ("qwen3",), features=("QK-norm", "grouped-query attention")),
    Family("Phi", "PhiForCausalLM", features=("parallel attention + MLP", "partial rotary", "unembedding bias")),
    Family("Phi-3", "Phi3ForCausalLM", ("phi3",), features=("fused qkv", "gated MLP")),
    Family("Gemma", "GemmaForCausalLM", template="google/gemma-2b",
           features=("multi-query attention", "scaled embeddings", "tied embeddings")),
    Family("Gemma 2", "Gemma2ForCausalLM", ("gemma2",), template="google/gemma-2-2b",
           features=("norms after attention and MLP", "attention and logit soft-capping", "sliding-window attention")),
    Family("Gemma 3", "Gemma3ForCausalLM", ("gemma3",), template="google/gemma-3-270m",
           features=("QK-norm", "norms after attention and MLP", "sliding-window attention", "local/global RoPE bases")),
    Family("OLMo", "OlmoForCausalLM", template="allenai/OLMo-1B-hf",
           features=("non-parametric LayerNorm", "qkv clipping")),
    Family("OLMo 2", "Olmo2ForCausalLM", template="allenai/OLMo-2-0425-1B",
           features=("norms after attention and MLP only", "QK-norm over all heads")),
    Family("OLMoE", "OlmoeForCausalLM", features=("mixture of experts", "QK-norm over all heads")),
    Family("OLMo 3", "Olmo3ForCausalLM", features=("norms after attention and MLP only", "sliding-window attention")),
    Family("GPT-OSS", "GptOssForCausalLM", ("gpt_oss",), features=("mixture of experts", "attention sinks", "sliding-window attention")),
    Family("Apertus", "ApertusForCausalLM", features=("xIELU activation", "QK-norm")),
)

BY_ARCHITECTURE: dict[str, Family] = {f.architecture: f for f in FAMILIES}
BY_GGUF: dict[str, Family] = {g: f for f in FAMILIES for g in f.gguf}


def family_table() -> str:
    """The Markdown table of :data:`FAMILIES` that docs/models.md quotes (written by
    ``tests/test_families.py::test_the_docs_family_table_is_the_records``)."""
    rows = ["| family | architecture | from a directory | from GGUF | features the exactness tests cover |",
            "|---|---|---|---|---|"]
    for f in FAMILIES:
        gguf = ", ".join(f"`{g}`" for g in f.gguf) or "-"
        rows.append(f"| {f.name} | {f.architecture} | {'no: ' + f.refuse if f.refuse else 'yes'} | {gguf} | "
                    f"{', '.join(f.features)} |")
    return "\n".join(rows)


def family_of(architecture: str, where: str) -> Family:
    """The family of ``architecture``; a clear error for one TransformerLens does not convert or
    that is refused."""
    family = BY_ARCHITECTURE.get(architecture)
    if family is None:
        raise CheckpointError(f"{where} holds architecture {architecture!r}, which TransformerLens' HookedTransformer "
                              f"does not convert; p0circuit loads {sorted(BY_ARCHITECTURE)}")
    if family.refuse:
        raise CheckpointError(f"{where}: {family.name} ({architecture}) is not loaded: {family.refuse}")
    return family


SIZE_FIELDS: dict[str, str] = {
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "d_head": "head_dim",
    "n_key_value_heads": "num_key_value_heads",
    "d_mlp": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "eps": "rms_norm_eps",
    "d_vocab": "vocab_size",
    "window_size": "sliding_window",
    "attn_scores_soft_cap": "attn_logit_softcapping",
    "output_logits_soft_cap": "final_logit_softcapping",
    "act_fn": "hidden_activation",
    "clip_qkv": "clip_qkv",
}
"""For the name-keyed families: TransformerLens field <- Hugging Face config field (sizes only;
the structure comes from the template)."""


def _base(value: Any, name: str) -> float:
    """A rotary base from a config: a finite number > 0, else a :class:`ConfigError` naming the field
    (never a default in its place)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"the model config's {name}={value!r:.40} is not a finite number > 0; fix the config (the "
                          "rotary base, e.g. 10000.0)")
    return float(value)


def _rope_bases(hf: Any) -> dict[str, float]:
    """``rotary_base`` (global layers) and ``rotary_base_local`` (sliding layers) from either the
    flat ``rope_theta`` / ``rope_local_base_freq`` fields or transformers 5's ``rope_parameters``
    (flat, or per layer type)."""
    out: dict[str, float] = {}
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if "rope_theta" in full:
            out["rotary_base"] = _base(full["rope_theta"], "rope_parameters.full_attention.rope_theta")
        if "rope_theta" in local:
            out["rotary_base_local"] = _base(local["rope_theta"], "rope_parameters.sliding_attention.rope_theta")
        return out
    theta = getattr(hf, "rope_theta", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    if theta is not None:
        out["rotary_base"] = _base(theta, "rope_theta")
    if getattr(hf, "rope_local_base_freq", None) is not None:
        out["rotary_base_local"] = _base(hf.rope_local_base_freq, "rope_local_base_freq")
    return out


def _sized(cfg: dict[str, Any], hf: Any) -> dict[str, Any]:
    """A template family's TransformerLens config with the checkpoint's own sizes."""
    cfg = dict(cfg)
    for tl_field, hf_field in SIZE_FIELDS.items():
        value = getattr(hf, hf_field, None)
        if value is not None and (tl_field in cfg or tl_field in ("d_head", "n_key_value_heads")):
            cfg[tl_field] = value
    if getattr(hf, "head_dim", None) is None:
        cfg["d_head"] = hf.hidden_size // hf.num_attention_heads
    cfg["rotary_dim"] = cfg["d_head"] if cfg.get("positional_embedding_type") == "rotary" else cfg.get("rotary_dim")
    cfg.update(_rope_bases(hf))
    if cfg.get("n_key_value_heads") == cfg["n_heads"]:
        cfg["n_key_value_heads"] = None
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    if scalar is not None:
        cfg["attn_scale"] = float(scalar) ** 0.5
    types = getattr(hf, "layer_types", None)
    if types:
        cfg["attn_types"] = ["local" if t == "sliding_attention" else "global" for t in types]
        cfg["use_local_attn"] = "sliding_attention" in types
    elif "attn_types" in cfg:
        pattern = getattr(hf, "sliding_window_pattern", None)
        if pattern:  # every pattern-th layer is global
            cfg["attn_types"] = ["global" if (i + 1) % pattern == 0 else "local" for i in range(hf.num_hidden_layers)]
        elif cfg["attn_types"] and len(set(cfg["attn_types"])) == 1:
            cfg["attn_types"] = [cfg["attn_types"][0]] * hf.num_hidden_layers
        else:
            raise CheckpointError(f"the config gives no layer_types for its {hf.num_hidden_layers} layers")
    return cfg


def _legacy_fields(hf: Any) -> dict[str, Any]:
    """Fields TransformerLens 3.9 reads under their transformers-4 names, which transformers 5
    renamed or moved into ``rope_parameters``."""
    out: dict[str, Any] = {}
    if getattr(hf, "n_positions", None) is not None and getattr(hf, "n_ctx", None) is None:
        out["n_ctx"] = hf.n_positions
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    return out


class _LegacyAutoConfig:
    """``AutoConfig`` for TransformerLens' conversion: the loaded config also answers to the
    transformers-4 field names (:func:`_legacy_fields`)."""

    @staticmethod
    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(*args, **kwargs)
        for key, value in _legacy_fields(config).items():
            setattr(config, key, value)
        return config


def tl_state_dict(cfg: Any, hf_model: Any, dtype: Any) -> dict[str, Any]:
    """TransformerLens' per-architecture weight conversion of ``hf_model`` for ``cfg`` (the name it
    takes is only checked to exist: any local path serves, and no hub is asked)."""
    from transformer_lens.loading_from_pretrained import get_pretrained_state_dict

    return get_pretrained_state_dict(tempfile.gettempdir(), cfg, hf_model, dtype=dtype)


def tl_config(hf_config: Any, family: Family) -> dict[str, Any]:
    """TransformerLens' converted config (a dict of ``HookedTransformerConfig`` fields) for a
    checkpoint of ``family`` whose Hugging Face config is ``hf_config``.

    TransformerLens' conversion takes a model *name* and picks some branches by substrings of it
    ("llama", "gemma"), so the config is handed over from a neutral relative path in a temporary
    directory (for a template family: the template's hub name, which selects its branch; no hub
    is asked: the path holds the config)."""
    from unittest import mock

    import transformer_lens.loading_from_pretrained as tl_loading

    name = family.template or "p0circuit-checkpoint"
    config = hf_config.to_dict()
    config["architectures"] = [family.architecture]
    config.pop("quantization_config", None)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="p0c-") as tmp:
        (Path(tmp) / name).mkdir(parents=True)
        (Path(tmp) / name / "config.json").write_text(json.dumps(config, default=str))
        os.chdir(tmp)
        try:
            with mock.patch.object(tl_loading, "AutoConfig", _LegacyAutoConfig):
                cfg = tl_loading.convert_hf_model_config(name, local_files_only=True)
        except Exception as e:  # TransformerLens reads fields the config may lack: say which
            raise CheckpointError(f"TransformerLens could not convert this {family.name} config "
                                  f"({type(e).__name__}: {str(e)[:200]})") from None
        finally:
            os.chdir(cwd)
    if family.template:
        cfg = _sized(cfg, hf_config)
    cfg["original_architecture"] = family.architecture
    cfg.pop("tokenizer_name", None)
    cfg.pop("trust_remote_code", None)
    return cfg
