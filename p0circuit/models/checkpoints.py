"""Loading Hugging Face checkpoints into ``HookedTransformer`` models.

:func:`load_checkpoint` reads a checkpoint *directory on local disk* with no network access
(``local_files_only``), for every causal-LM family TransformerLens' ``HookedTransformer``
converts (:data:`p0circuit.models.families.FAMILIES`). Config and weights both go through
TransformerLens' per-architecture conversion (:mod:`p0circuit.models.families` says how a local
checkpoint is handed to it), and the hooked logits are checked against transformers' forward at
every load. The result is a plain ``HookedTransformer``, so every hook the toolkit uses
(``hook_resid_mid`` included) really writes the residual stream; p0circuit does not rely on
``TransformerBridge``.

:func:`load_pretrained` is the path for users with a hub: a thin wrapper over
``HookedTransformer.from_pretrained`` (Pythia's ``checkpoint_index`` included) that makes the BOS
choice explicit.
"""

import math
from pathlib import Path
from typing import Any, Optional, Union

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from p0circuit.core.errors import BadInputError, CheckpointError, ConfigError
from p0circuit.core.args import entry_point
from p0circuit.core.entries import checkpoint_problem
from p0circuit.core.threads import share
from p0circuit.models.families import BY_ARCHITECTURE, family_of, tl_config, tl_state_dict
from p0circuit.models.layout import linear_layout
from p0circuit.models.spec import check_fits_memory
from p0circuit.models.verify import check_finite, check_loading_info, check_logits, read_json

def _cached(name: str) -> bool:
    """Whether the Hugging Face cache holds the config of the hub model TransformerLens maps ``name``
    to (checked on disk: no request, so an offline machine gets its answer at once)."""
    from huggingface_hub import constants
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        official = get_official_model_name(name)
    except ValueError:
        return True  # a name TransformerLens does not know: it says so itself, at once
    return (Path(constants.HF_HUB_CACHE) / f"models--{official.replace('/', '--')}").is_dir()  # any revision


def read_architecture(path: Path) -> str:
    """``architectures[0]`` of a checkpoint directory's config.json; clear errors for a missing
    directory or file, a config that is not a JSON object, and an architecture p0circuit does not load."""
    cfg_file = path / "config.json"
    if path.is_file():
        raise CheckpointError(checkpoint_problem(path) or f"{str(path)!r} is a file")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist; pass a directory saved with save_pretrained()")
    if not cfg_file.is_file():
        raise CheckpointError(
            f"{str(path)!r} has no config.json; it is not a Hugging Face checkpoint directory "
            "(save one with model.save_pretrained(path))"
        )
    config = read_json(cfg_file, "the model config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{str(cfg_file)!r} holds a JSON {type(config).__name__}, not an object of config "
                              "fields; re-save the checkpoint (model.save_pretrained)")
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise CheckpointError(f"{str(cfg_file)!r} names no architecture (\"architectures\": {archs!r:.60}); "
                              f"set it to one of {sorted(BY_ARCHITECTURE)}")
    return family_of(archs[0], repr(str(path))).architecture


SIZE_KEYS: tuple[tuple[str, ...], ...] = (
    ("hidden_size", "n_embd", "d_model"), ("num_hidden_layers", "n_layer", "num_layers"),
    ("num_attention_heads", "n_head"), ("num_key_value_heads",), ("head_dim",),
    ("intermediate_size", "n_inner", "ffn_dim", "d_ff"), ("vocab_size",), ("max_position_embeddings", "n_positions"),
    ("num_local_experts", "num_experts"), ("num_experts_per_tok",), ("sliding_window",),
)
"""Size fields of a Hugging Face config (each with the names families give it): whole numbers >= 1 where
given (null allowed)."""
BASE_KEYS = ("rope_theta", "rope_local_base_freq")
"""Rotary base fields: finite numbers > 0 where given (flat, or in ``rope_parameters``, flat or per layer type)."""


def _first(config: dict, names: tuple[str, ...]) -> Any:
    return next((config[n] for n in names if config.get(n) is not None), None)


def check_config_values(config: dict, where: str, dtype: torch.dtype) -> None:
    """Refuse, before transformers reads ``config`` (a checkpoint's config.json, as a dict), a size that
    is not a whole number >= 1, a rotary base that is not a finite number > 0 (transformers would fail
    deep inside the model's construction, or take a default), and a model whose weights alone would
    not fit in this machine's memory (estimated from the sizes, a lower bound: never a real model)."""
    for names in SIZE_KEYS:
        for name in names:
            value = config.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{where}: {name}={value!r:.40} is not a whole number >= 1; fix the config "
                                  "(a size of the architecture)")
    params = config.get("rope_parameters")
    found = [(name, config.get(name)) for name in BASE_KEYS]
    if isinstance(params, dict):
        found += [(f"rope_parameters.{n}", params.get(n)) for n in BASE_KEYS]
        found += [(f"rope_parameters.{kind}.{n}", sub.get(n)) for kind, sub in params.items() if isinstance(sub, dict)
                  for n in BASE_KEYS]
    for name, value in found:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{where}: {name}={value!r:.40} is not a finite number > 0; fix the config (the "
                              "rotary base, e.g. 10000.0)")
    sizes = [_first(config, names) for names in SIZE_KEYS[:7]]
    d_model, layers, heads, kv_heads, head_dim, d_mlp, vocab = sizes
    if d_model is None or layers is None:
        return
    heads = heads or 1
    head_dim = head_dim or max(d_model // heads, 1)
    attn = d_model * head_dim * (2 * heads + 2 * (kv_heads or heads))
    experts = _first(config, SIZE_KEYS[8]) or 1
    mlp = 2 * d_model * (d_mlp or d_model) * experts
    check_fits_memory(layers * (attn + mlp) + (vocab or 0) * d_model, dtype, where,
                      "the config's sizes (num_hidden_layers, hidden_size, intermediate_size, vocab_size) are too "
                      "large for this machine: fix them, or load on a machine with more memory", error=ConfigError)


def hooked_config(hf_config: Any, architecture: str, *, device: str = "cpu", dtype: Any = torch.float32,
                  n_ctx: Optional[int] = None, name: str = "") -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a checkpoint of ``architecture`` (TransformerLens' own
    conversion: :mod:`p0circuit.models.families`), its context capped at ``n_ctx``."""
    family = family_of(architecture, name or architecture)
    cfg = tl_config(hf_config, family)
    for chosen in ("dtype", "default_prepend_bos", "device"):  # p0circuit's choices, not the family's defaults
        cfg.pop(chosen, None)
    if n_ctx is not None:
        cfg["n_ctx"] = min(int(cfg["n_ctx"]), n_ctx)
    return HookedTransformerConfig(**cfg, default_prepend_bos=False, init_weights=False, device=device, dtype=dtype,
                                   model_name=name or str(getattr(hf_config, "_name_or_path", "") or architecture))


def hooked_model(cfg: HookedTransformerConfig, state_dict: dict[str, torch.Tensor], tokenizer: Any,
                 device: str = "cpu") -> HookedTransformer:
    """A plain ``HookedTransformer`` holding ``state_dict`` unprocessed (no folding or centering:
    its logits and residual norms equal the Hugging Face model's)."""
    state_dict = dict(state_dict)  # TransformerLens pops the entries it loads: the caller's dict stays whole
    if "pos_embed.W_pos" in state_dict:  # learned positions: as many as the (capped) context
        state_dict["pos_embed.W_pos"] = state_dict["pos_embed.W_pos"][:cfg.n_ctx].clone()  # not the whole table
    elif cfg.positional_embedding_type not in ("standard", "shortformer"):
        # unused (ALiBi, rotary), but TransformerLens would fill it with torch.empty: arbitrary memory, at
        # times NaN, which the finite-weight check then (rightly) refuses
        state_dict["pos_embed.W_pos"] = torch.zeros(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)  # init_weights=False: untouched memory
    attach_tokenizer(model, tokenizer)
    # TransformerLens' load_and_process_state_dict with every processing off, without its copies: the
    # converted tensors (mostly views of the Hugging Face weights) become the parameters (assign=True),
    # so the hooked model shares the loaded weights' memory instead of holding a second copy (its own
    # processing step would also pass every half-precision tensor through float32 and back)
    filled = model.fill_missing_keys(state_dict)
    model.load_state_dict({k: v.detach() for k, v in filled.items()}, strict=False, assign=True)
    _untie(model)
    for param in model.parameters():  # the dtype asked for, end to end (Apertus' activation parameters come as float32)
        if param.is_floating_point() and param.dtype != cfg.dtype:
            param.data = param.data.to(cfg.dtype)
    linear_layout(model)  # values unchanged; no weight copy per forward
    model.to(device, print_details=False)  # no "Moving model to device" line
    model.eval()
    return share(model)  # the user's own forwards share a busy machine too (core/threads.py)


def _untie(model: HookedTransformer) -> None:
    """Give every parameter memory of its own: tied weights (an unembedding that is the embedding's
    transpose, parallel blocks' shared norms) came in as views of one tensor, and TransformerLens
    edits parameters in place (``process_weights_``: centering the unembedding would move the
    embedding too). A later parameter sharing memory with an earlier one is copied."""
    seen: list[tuple[int, int]] = []
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            storage = param.untyped_storage()
            span = (storage.data_ptr(), storage.data_ptr() + storage.nbytes())
            if any(a < span[1] and span[0] < b for a, b in seen):
                setattr(module, name, torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad))
            else:
                seen.append(span)


def from_hf(hf_config: Any, hf_model: Any, architecture: str, tokenizer: Any, *, where: str, device: str = "cpu",
            dtype: Any = torch.float32, n_ctx: Optional[int] = None,
            name: str = "") -> tuple[HookedTransformer, dict[str, torch.Tensor]]:
    """(hooked model, its state dict) from a loaded Hugging Face model, with its logits checked
    against the Hugging Face forward (:func:`check_logits`)."""
    cfg = hooked_config(hf_config, architecture, dtype=dtype, n_ctx=n_ctx, name=name)
    try:
        state_dict = tl_state_dict(cfg, hf_model, dtype)
        model = hooked_model(cfg, state_dict, tokenizer)
    except Exception as e:  # TransformerLens' converter meets a variant it does not know (e.g. OPT-350m's projections)
        raise CheckpointError(f"{where}: TransformerLens' {architecture} conversion does not fit this checkpoint "
                              f"({type(e).__name__}: {str(e)[:200]}); p0circuit refuses it rather than patch a "
                              "different model") from None
    check_logits(hf_model, model, where)
    return model.to(device, print_details=False), state_dict


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
        settings = read_json(tcfg, "the tokenizer config")
        if not isinstance(settings, dict):
            raise CheckpointError(f"{str(tcfg)!r} holds a JSON {type(settings).__name__}, not an object of tokenizer "
                                  "settings; re-save the tokenizer (tokenizer.save_pretrained) or remove its files")
        cls_name = settings.get("tokenizer_class") or ""
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
    path: Union[str, Path], device: str = "cpu", dtype: Any = torch.float32, n_ctx: int = 2048
) -> HookedTransformer:
    """Load a local Hugging Face checkpoint directory as a ``HookedTransformer``, offline.

    The tokenizer is loaded from the same directory when its files are there, else the model has
    no tokenizer and takes token tensors only. Weights are loaded unprocessed (no folding or
    centering), so logits equal the HF model's; that is checked at every load
    (:func:`~p0circuit.models.verify.check_logits`). ``n_ctx`` caps the context the hooked model is
    built for (TransformerLens keeps an ``n_ctx x n_ctx`` mask per layer). ``default_prepend_bos``
    is False: text entry points in p0circuit always take ``prepend_bos`` explicitly anyway.
    """
    path = Path(path)
    architecture = read_architecture(path)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BadInputError(f"dtype must be a floating torch dtype (torch.float32, torch.float16, torch.bfloat16), "
                            f"got {dtype!r}")
    check_config_values(read_json(path / "config.json", "the model config"), repr(str(path / "config.json")), dtype)
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
    model, _ = from_hf(hf_config, hf_model.eval(), architecture, load_tokenizer(path), where=repr(str(path)),
                       device=device, dtype=dtype, n_ctx=n_ctx)
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
    if not _cached(name):
        raise CheckpointError(
            f"{name!r} is not in the local Hugging Face cache, and p0circuit downloads nothing at run time: download "
            "the checkpoint on a machine with network access, copy its directory here and load it with "
            "p0circuit.load_checkpoint(path) (model entry checkpoint:<path>)")
    loader = HookedTransformer.from_pretrained if process_weights else HookedTransformer.from_pretrained_no_processing
    try:
        return loader(name, checkpoint_index=checkpoint_index, default_prepend_bos=prepend_bos, device=device, **kwargs)
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"could not load {name!r} from the hub ({type(e).__name__}: {str(e)[:300]}). Without "
            "network access, download the checkpoint elsewhere, copy the directory here and use "
            "p0circuit.models.load_checkpoint(path)."
        ) from None
