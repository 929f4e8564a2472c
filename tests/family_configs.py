"""Tiny random configs of every family TransformerLens converts, with transformers' own config classes.

Sizes are small (d_model 32, 4 heads of 8, 3 layers, vocabulary 64) but every architecture
feature a family brings is switched on: sliding windows of 4 (prompts are longer), grouped- and
multi-query attention, partial rotary, soft-capping, QK-norm, post-norms, 4 experts choosing 2.
"""

VOCAB = 64
WINDOW = 4


def family_configs() -> dict:
    """``{key: transformers config}`` for every family (keys as in docs/models.md's table)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    llama_like = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, **common)
    return {
        "gpt2": tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, **common),
        "gpt_neo": tf.GPTNeoConfig(hidden_size=32, num_layers=3, num_heads=4, max_position_embeddings=64,
                                   attention_types=[[["global", "local"], 1], [["global"], 1]], window_size=WINDOW,
                                   **common),
        "gptj": tf.GPTJConfig(n_embd=32, n_layer=3, n_head=4, n_positions=64, rotary_dim=4, **common),
        "pythia": tf.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   max_position_embeddings=64, rotary_pct=0.25, **common),
        "opt": tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4,
                            max_position_embeddings=64, word_embed_proj_dim=32, **common),
        "bloom": tf.BloomConfig(hidden_size=32, n_layer=3, n_head=4, **common),
        "llama": tf.LlamaConfig(**llama_like),
        "mistral": tf.MistralConfig(sliding_window=WINDOW, **llama_like),
        "mixtral": tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **llama_like),
        "qwen2": tf.Qwen2Config(**llama_like),
        "qwen3": tf.Qwen3Config(head_dim=8, **llama_like),
        "phi": tf.PhiConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                            max_position_embeddings=64, partial_rotary_factor=0.5, **common),
        "phi3": tf.Phi3Config(**llama_like),
        "gemma": tf.GemmaConfig(head_dim=8, **{**llama_like, "num_key_value_heads": 1}),
        "gemma2": tf.Gemma2Config(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                  attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **llama_like),
        "gemma3": tf.Gemma3TextConfig(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8,
                                      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                      **{**llama_like, "num_key_value_heads": 1}),
        "olmo": tf.OlmoConfig(clip_qkv=2.0, **{**llama_like, "num_key_value_heads": 4}),
        "olmo2": tf.Olmo2Config(**{**llama_like, "num_key_value_heads": 4}),
        "olmoe": tf.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **llama_like),
        "olmo3": tf.Olmo3Config(sliding_window=WINDOW,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                **llama_like),
        "gpt_oss": tf.GptOssConfig(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   **llama_like),
        "apertus": tf.ApertusConfig(**llama_like),
    }


NOT_FEATURES = {"model_name", "original_architecture", "n_params", "initializer_range", "eps", "n_ctx", "d_model",
                "d_head", "n_heads", "n_layers", "d_mlp", "d_vocab", "d_vocab_out", "rotary_base", "rotary_base_local",
                "yarn_attention_factor", "yarn_factor", "attn_scale", "tokenizer_prepends_bos", "device", "dtype",
                "seed", "init_weights", "default_prepend_bos", "experts_per_token"}
"""``HookedTransformerConfig`` fields that are sizes, names or numeric hyperparameters, not architecture features."""


def features(cfg) -> set:
    """The architecture features of a ``HookedTransformerConfig``: ``field=value`` for every field that is
    not a size or a hyperparameter (a field TransformerLens adds later counts too), with values reduced to
    the kind of the feature (grouped or multi-query attention; a rotary dimension below the head's; a soft
    cap set; the set of attention types), and whether TransformerLens treats the architecture as post-norm."""
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    d, out = cfg.to_dict(), {f"post_norm={cfg.original_architecture in POST_NORM_ARCHITECTURES}"}
    for key, value in d.items():
        if key in NOT_FEATURES or not isinstance(value, (int, float, str, bool, type(None), list, tuple)):
            continue
        if key == "attn_types" and value:
            value = sorted(set(value))
        elif key in ("attn_scores_soft_cap", "output_logits_soft_cap"):
            value = value > 0
        elif key in ("window_size", "clip_qkv"):
            value = value is not None
        elif key == "rotary_dim" and value is not None:
            value = "partial" if value < d["d_head"] else "full"
        elif key == "n_key_value_heads":
            value = "mha" if value in (None, d["n_heads"]) else ("mqa" if value == 1 else "gqa")
        out.add(f"{key}={value}")
    return out


def family_features() -> dict:
    """``{family: features}``, from each config's TransformerLens conversion (no weights are made)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from p0circuit.models.checkpoints import hooked_config

    return {name: features(hooked_config(c, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[c.model_type]))
            for name, c in family_configs().items()}


def feature_cover() -> list:
    """A small set of families that together bring every architecture feature any family brings (a greedy
    set cover over :func:`family_features`, in name order on ties): the fast tier's families."""
    feats = family_features()
    left, cover = set().union(*feats.values()), []
    while left:
        best = max(sorted(feats), key=lambda name: len(feats[name] & left))
        cover.append(best)
        left -= feats[best]
    return sorted(cover)


def make_tokenizer():
    """A word-level tokenizer over the words ``w3 .. w63`` (ids 0-2: ``<bos>``, ``<eos>``, ``<unk>``), built here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<eos>"
    )


def make_checkpoint(family: str, root, seed: int = 0, with_tokenizer: bool = False):
    """Save a tiny random checkpoint of ``family`` under ``root/family`` (kept when already there) and
    return its path; with the word-level tokenizer of :func:`make_tokenizer` when ``with_tokenizer``. Norm weights and biases are random too, so a dropped parameter would show."""
    import torch
    from transformers import AutoModelForCausalLM

    path = root / family
    if not path.exists():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(family_configs()[family])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(path)
        if with_tokenizer:
            make_tokenizer().save_pretrained(path)
    return path
