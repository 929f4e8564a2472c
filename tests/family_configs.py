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


def make_checkpoint(family: str, root):
    """Save a tiny random checkpoint of ``family`` under ``root/family`` (once) and return its path.
    Norm weights and biases are random too, so a dropped parameter would show."""
    import torch
    from transformers import AutoModelForCausalLM

    path = root / family
    if not path.exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(family_configs()[family])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(path)
    return path
