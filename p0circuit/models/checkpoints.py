"""Loading Hugging Face checkpoints into ``HookedTransformer`` models.

:func:`load_checkpoint` reads a checkpoint *directory on local disk* with no network access
(``local_files_only``), for the families the P0-sink literature studies: Llama, GPT-NeoX/Pythia,
GPT-2, OPT, Qwen2 and Mistral. The HF config is mapped to a ``HookedTransformerConfig`` here
(TransformerLens' own mapping keys some families on the model *name*, which a local path does not
carry), and the weights go through TransformerLens' per-family weight conversion. The result is a
plain ``HookedTransformer``, so every hook the toolkit uses (``hook_resid_mid`` included) really
writes the residual stream; p0circuit does not rely on ``TransformerBridge``.

:func:`load_pretrained` is the path for users with a hub: a thin wrapper over
``HookedTransformer.from_pretrained`` (Pythia's ``checkpoint_index`` included) that makes the BOS
choice explicit.
"""

import json
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import get_pretrained_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from p0circuit.errors import BadInputError, CheckpointError, entry_point
from p0circuit.models.verify import check_finite, check_loading_info
from p0circuit.models.layout import linear_layout

SUPPORTED = (
    "LlamaForCausalLM",
    "GPTNeoXForCausalLM",
    "GPT2LMHeadModel",
    "OPTForCausalLM",
    "Qwen2ForCausalLM",
    "MistralForCausalLM",
)


def _rope_theta(hf: Any, default: float = 10000.0) -> float:
    theta = getattr(hf, "rope_theta", None)
    params = getattr(hf, "rope_parameters", None) or {}
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return float(theta if theta is not None else default)


def _rotary_pct(hf: Any) -> float:
    pct = getattr(hf, "rotary_pct", None)
    params = getattr(hf, "rope_parameters", None) or {}
    if pct is None and isinstance(params, dict):
        pct = params.get("partial_rotary_factor")
    return float(pct if pct is not None else 1.0)


def _head_dim(hf: Any) -> int:
    hd = getattr(hf, "head_dim", None)
    return int(hd) if hd else hf.hidden_size // hf.num_attention_heads


def _kv_heads(hf: Any) -> Optional[int]:
    kv = getattr(hf, "num_key_value_heads", None)
    return None if kv in (None, hf.num_attention_heads) else int(kv)


def _llama_like(hf: Any, **extra: Any) -> dict[str, Any]:
    cfg = dict(
        d_model=hf.hidden_size,
        d_head=_head_dim(hf),
        n_heads=hf.num_attention_heads,
        n_key_value_heads=_kv_heads(hf),
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=hf.rms_norm_eps,
        d_vocab=hf.vocab_size,
        act_fn=hf.hidden_act,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=_head_dim(hf),
        rotary_base=_rope_theta(hf),
        final_rms=True,
        gated_mlp=True,
    )
    cfg.update(extra)
    return cfg


def _gpt2(hf: Any) -> dict[str, Any]:
    return dict(
        d_model=hf.n_embd,
        d_head=hf.n_embd // hf.n_head,
        n_heads=hf.n_head,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size,
        act_fn=hf.activation_function,
        use_attn_scale=getattr(hf, "scale_attn_weights", True),
        scale_attn_by_inverse_layer_idx=getattr(hf, "scale_attn_by_inverse_layer_idx", False),
        normalization_type="LN",
    )


def _opt(hf: Any) -> dict[str, Any]:
    if getattr(hf, "word_embed_proj_dim", hf.hidden_size) != hf.hidden_size:
        raise CheckpointError("OPT checkpoints with word_embed_proj_dim != hidden_size are not supported")
    if not getattr(hf, "do_layer_norm_before", True):
        raise CheckpointError("post-norm OPT checkpoints (do_layer_norm_before=False) are not supported")
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_attention_heads,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.ffn_dim,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=1e-5,
        d_vocab=hf.vocab_size,
        act_fn=hf.activation_function,
        normalization_type="LN",
    )


def _neox(hf: Any) -> dict[str, Any]:
    d_head = hf.hidden_size // hf.num_attention_heads
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=hf.layer_norm_eps,
        d_vocab=hf.vocab_size,
        act_fn=hf.hidden_act,
        parallel_attn_mlp=getattr(hf, "use_parallel_residual", True),
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=round(_rotary_pct(hf) * d_head),
        rotary_base=_rope_theta(hf),
        normalization_type="LN",
    )


def _qwen2(hf: Any) -> dict[str, Any]:
    return _llama_like(hf, n_key_value_heads=hf.num_key_value_heads)


def _mistral(hf: Any) -> dict[str, Any]:
    window = getattr(hf, "sliding_window", None)
    extra: dict[str, Any] = {"n_key_value_heads": hf.num_key_value_heads}
    if window:
        extra.update(use_local_attn=True, window_size=int(window), attn_types=["local"] * hf.num_hidden_layers)
    return _llama_like(hf, **extra)


_CONVERTERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama_like,
    "GPTNeoXForCausalLM": _neox,
    "GPT2LMHeadModel": _gpt2,
    "OPTForCausalLM": _opt,
    "Qwen2ForCausalLM": _qwen2,
    "MistralForCausalLM": _mistral,
}


def _read_architecture(path: Path) -> str:
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist; pass a directory saved with save_pretrained()")
    if not cfg_file.is_file():
        raise CheckpointError(
            f"{str(path)!r} has no config.json; it is not a Hugging Face checkpoint directory "
            "(save one with model.save_pretrained(path))"
        )
    try:
        archs = json.loads(cfg_file.read_text()).get("architectures") or []
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({e}); re-save the checkpoint") from None
    if not archs or archs[0] not in _CONVERTERS:
        raise CheckpointError(
            f"{str(path)!r} holds architecture {archs[:1] or 'unknown'}; supported: {list(SUPPORTED)}"
        )
    return archs[0]


def hooked_config_from_hf(hf_config: Any, architecture: str, device: str = "cpu") -> HookedTransformerConfig:
    """Map a Hugging Face config of a supported family to a ``HookedTransformerConfig``."""
    cfg = _CONVERTERS[architecture](hf_config)
    cfg = {k: v for k, v in cfg.items() if v is not None or k == "n_key_value_heads"}
    if cfg.get("n_key_value_heads") is None:
        cfg.pop("n_key_value_heads", None)
    return HookedTransformerConfig(
        **cfg,
        original_architecture=architecture,
        default_prepend_bos=False,
        init_weights=False,
        device=device,
        model_name=str(getattr(hf_config, "_name_or_path", "") or architecture),
    )


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved in ``path``, or None when there is none.

    A generic fast tokenizer (``tokenizer_class`` PreTrainedTokenizerFast / TokenizersBackend) is
    loaded as such: AutoTokenizer would pick the family's class from config.json (e.g.
    Qwen2Tokenizer), which rebuilds its own model and ignores the saved one.
    """
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    cls_name = ""
    tcfg = path / "tokenizer_config.json"
    if tcfg.is_file():
        try:
            cls_name = json.loads(tcfg.read_text()).get("tokenizer_class") or ""
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{tcfg} is not valid JSON ({e}); re-save the tokenizer") from None
    try:
        if cls_name in ("PreTrainedTokenizerFast", "TokenizersBackend") and (path / "tokenizer.json").is_file():
            return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # tokenizers and transformers raise their own types for a garbled file
        raise CheckpointError(f"the tokenizer files in {str(path)!r} cannot be read ({type(e).__name__}: {str(e)[:160]}); "
                              "re-save the tokenizer (tokenizer.save_pretrained) or remove its files to load without one") from None


def attach_tokenizer(model: HookedTransformer, tokenizer: Any) -> None:
    """Attach ``tokenizer`` (or nothing, when None) as saved.

    TransformerLens' ``set_tokenizer`` re-loads some families' tokenizers with ``add_bos_token=True``,
    which is a silent BOS choice (and breaks simple local tokenizers)."""
    if tokenizer is None:
        return
    tokenizer.padding_side = "right"
    model.tokenizer = tokenizer
    model.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0


@entry_point
def load_checkpoint(
    path: Union[str, Path], device: str = "cpu", dtype: Any = torch.float32
) -> HookedTransformer:
    """Load a local Hugging Face checkpoint directory as a ``HookedTransformer``, offline.

    The tokenizer is loaded from the same directory when its files are there, else the model has
    no tokenizer and takes token tensors only. Weights are loaded unprocessed (no folding or
    centering), so logits equal the HF model's. ``default_prepend_bos`` is False: text entry
    points in p0circuit always take ``prepend_bos`` explicitly anyway.
    """
    path = Path(path)
    architecture = _read_architecture(path)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BadInputError(f"dtype must be a floating torch dtype (torch.float32, torch.float16, torch.bfloat16), "
                            f"got {dtype!r}")
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
        hf_model, info = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype,
                                                              output_loading_info=True)
    except Exception as e:  # safetensors, torch and transformers each raise their own types here
        raise CheckpointError(
            f"could not load the weights in {str(path)!r} ({type(e).__name__}: {str(e)[:300]}); "
            "check that the weight files (model.safetensors or pytorch_model.bin) are complete"
        ) from None
    check_loading_info(path, info)
    check_finite(dict(hf_model.named_parameters()), path)
    cfg = hooked_config_from_hf(hf_config, architecture, device)
    cfg.dtype = dtype  # honoured: the hooked model holds the weights in the dtype asked for
    tokenizer = load_tokenizer(path)
    state_dict = get_pretrained_state_dict(str(path), cfg, hf_model, dtype=dtype)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    attach_tokenizer(model, tokenizer)
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    linear_layout(model)  # values unchanged; no weight copy per forward
    model.to(device)
    model.eval()
    return model


@entry_point
def load_pretrained(
    name: str,
    *,
    prepend_bos: bool,
    checkpoint_index: Optional[int] = None,
    device: str = "cpu",
    process_weights: bool = False,
    **kwargs: Any,
) -> HookedTransformer:
    """Load a model by hub name with TransformerLens (needs a hub, or the Hugging Face cache).

    ``prepend_bos`` is required: it becomes the model's default for text input. For Pythia,
    ``checkpoint_index`` picks one of the public training checkpoints (TransformerLens maps it to
    the hub revision ``step<N>``). Weights are loaded *unprocessed* by default
    (``from_pretrained_no_processing``): folding and centering change the residual stream's norms,
    which are what sink metrics measure. With no hub and no cached copy this raises
    :class:`CheckpointError` pointing at :func:`load_checkpoint` for local directories.
    """
    if Path(name).exists():
        raise CheckpointError(f"{name!r} is a local path; use load_checkpoint({name!r}) for directories on disk")
    loader = HookedTransformer.from_pretrained if process_weights else HookedTransformer.from_pretrained_no_processing
    try:
        return loader(name, checkpoint_index=checkpoint_index, default_prepend_bos=prepend_bos, device=device, **kwargs)
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"could not load {name!r} from the hub ({type(e).__name__}: {str(e)[:300]}). Without "
            "network access, download the checkpoint elsewhere, copy the directory here and use "
            "p0circuit.models.load_checkpoint(path)."
        ) from None
