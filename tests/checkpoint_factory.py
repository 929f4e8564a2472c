"""Tiny random Hugging Face checkpoints of each supported family, created on local disk.

Nothing is downloaded: configs are written by hand, weights are random, and the tokenizer is a
word-level ``tokenizers`` model over the words ``w3 .. w63``.
"""

from pathlib import Path

import torch

VOCAB = 64


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<eos>"
    )


def family_configs():
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1)
    return {
        "llama": tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **common),
        "pythia": tf.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.25, **common),
        "gpt2": tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common),
        "opt": tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=64, word_embed_proj_dim=32, **common),
        "qwen2": tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **common),
        "mistral": tf.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    sliding_window=8, **common),
    }


def make_checkpoint(family: str, root: Path, seed: int = 0, with_tokenizer: bool = True) -> Path:
    """Save a tiny random checkpoint of ``family`` under ``root/family`` and return its path."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_configs()[family])
    # random (not default-initialized) norms and biases, so a dropped parameter would show
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    path = root / family
    model.save_pretrained(path)
    if with_tokenizer:
        make_tokenizer().save_pretrained(path)
    return path
