"""Next-token loss: what an intervention on the residual stream costs the model's predictions."""

import torch
from jaxtyping import Float, Int
from torch import Tensor


def next_token_loss(logits: Float[Tensor, "batch pos vocab"],
                    tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, " batch"]:
    """Mean cross-entropy of predicting each token from the ones before it, per prompt (in float32)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    target = tokens[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    return -logp.gather(-1, target).squeeze(-1).mean(-1)
