"""Mixture-of-experts MLPs: each expert's contribution, and where the router sends each position.

TransformerLens' expert hooks see only the tokens routed to each expert, flattened, so an expert
cannot be patched at a position through them. Here an expert's contribution is recomputed from the
residual stream the MLP reads (:func:`mlp_input_hook`), through the block's own ``ln2``, router and
expert modules: ``w_e(x) * expert_e(x)``,
``w_e`` the routing weight (zero where the expert is not among the top-k). The contributions of all
experts add up to TransformerLens' MoE output (a test holds them to it), so patching one expert is
adding its change at ``hook_mlp_out``.

:func:`expert_routing` is the router's view that the literature on "super experts" asks for:
how often, and with what weight, position 0 is sent to each expert, against the other positions.
"""

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from p0circuit.core.errors import BadInputError
from p0circuit.core.args import as_list, entry_point
from p0circuit.models.checks import check_model
from p0circuit.patching.shape import BlockShape


def is_moe(model: Any) -> bool:
    """Whether the model's MLPs are mixtures of experts."""
    return bool(BlockShape.of(model).experts)


def mlp_input_hook(model: Any, layer: int) -> str:
    """The residual stream block ``layer``'s MLP reads (before its ``ln2``): ``resid_mid``, or
    ``resid_pre`` in parallel attention + MLP blocks. (``ln2.hook_normalized`` is taken before the
    norm's weight, so it is not the MLP's input.)"""
    return BlockShape.of(model).mlp_input(layer)


def check_experts(model: Any, node: Any) -> None:
    """Refuse expert nodes where adding an expert's change at ``hook_mlp_out`` is not exact: a norm
    after the MLP (the experts' sum passes through it)."""
    from p0circuit.patching.engine import output_norm

    if output_norm(model, "mlp") is not None:
        raise BadInputError(f"node {node}: this model normalizes the MLP output, so one expert's change does not add "
                            f"up; patch the whole MLP (M{node.layer}@{node.pos})")


def _check_layers(where: str, model: Any, layers: Sequence[int]) -> list[int]:
    """``layers`` as a list: the model checked, then the layers it does not have refused, then a model without
    experts (the arguments' own errors first)."""
    check_model(model)
    layers = as_list(where, "layers", layers)
    bad = [l for l in layers if isinstance(l, bool) or not (isinstance(l, int) and 0 <= l < model.cfg.n_layers)]
    if bad or not layers:
        raise BadInputError(f"{where}: layers {bad or '[]'} are not blocks of this model (0..{model.cfg.n_layers - 1})")
    return layers


def _moe(where: str, model: Any) -> None:
    if not is_moe(model):
        raise BadInputError(f"{where}: this model's MLPs are not mixtures of experts")


def routing_weights(moe: Any, x: Tensor) -> Tensor:
    """``[N, E]``: each expert's routing weight for the rows of ``x`` (``[N, d_model]``, the MLP's
    normalized input), zero for experts outside the top-k, as the block's router computes them."""
    from transformer_lens.components.mlps.gpt_oss_moe import GptOssMoE

    logits = moe.W_gate(x)
    k = moe.experts_per_token
    if isinstance(moe, GptOssMoE):  # softmax over the chosen experts' logits
        top, index = torch.topk(logits, k, dim=-1)
        weights = F.softmax(top, dim=-1, dtype=torch.float)
    else:  # Mixtral / OLMoE: softmax over all experts, then the top k (renormalized when configured)
        weights, index = torch.topk(F.softmax(logits, dim=1, dtype=torch.float), k, dim=-1)
        if moe.cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    full = torch.zeros(logits.shape, dtype=torch.float, device=x.device)
    return full.scatter(1, index, weights).to(x.dtype)


@torch.no_grad()
def expert_contribution(model: Any, layer: int, resid: Tensor, expert: int) -> Tensor:
    """``[B, T, d_model]``: expert ``expert``'s weighted contribution to block ``layer``'s MLP output,
    from the residual stream the MLP reads (``resid``, ``[B, T, d_model]``: :func:`mlp_input_hook`)."""
    moe = model.blocks[layer].mlp
    x = model.blocks[layer].ln2(resid)
    flat = x.reshape(-1, x.shape[-1])
    weight = routing_weights(moe, flat)[:, expert, None]  # (N, 1)
    return (moe.experts[expert](flat) * weight).reshape(x.shape)


@entry_point
def candidate_experts(model: Any, layers: Sequence[int], positions: Sequence[Any] = (0,)) -> list:
    """Every expert of the MoE MLPs of ``layers`` at each position class (``M1.E3@0``)."""
    from p0circuit.core.types import Kind, Node

    layers = _check_layers("candidate_experts", model, layers)
    positions = as_list("candidate_experts", "positions", positions)
    for p in positions:
        Node(Kind.EXPERT, 0, pos=p, neuron=0)  # a position class that is not one is refused here, by its name
    _moe("candidate_experts", model)
    return [Node(Kind.EXPERT, l, pos=p, neuron=e) for l in layers for p in positions
            for e in range(BlockShape.of(model).experts)]


@entry_point
@torch.no_grad()
def expert_routing(model: Any, tokens: Tensor, layers: Optional[Sequence[int]] = None) -> Any:
    """Where the router sends position 0 and the other positions: one row per (layer, expert) with
    ``p0_share`` (fraction of prompts whose position 0 goes to the expert), ``rest_share`` (fraction
    of the tokens at t > 0), and the mean routing weights ``p0_weight`` / ``rest_weight``
    (a pandas DataFrame). An expert with a high ``p0_share`` and a low ``rest_share`` is one P0 has
    to itself."""
    import pandas as pd

    from p0circuit.models.tokens import check_tokens

    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2)
    layers = _check_layers("expert_routing", model, range(model.cfg.n_layers) if layers is None else layers)
    _moe("expert_routing", model)
    names = {mlp_input_hook(model, l) for l in layers}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, stop_at_layer=max(layers) + 1)
    rows = []
    for layer in layers:
        x = model.blocks[layer].ln2(cache[mlp_input_hook(model, layer)])
        w = routing_weights(model.blocks[layer].mlp, x.reshape(-1, x.shape[-1])).reshape(*x.shape[:2], -1).float()
        chosen = w > 0
        for e in range(w.shape[-1]):
            rows.append({"layer": layer, "expert": e, "p0_share": float(chosen[:, 0, e].float().mean()),
                         "rest_share": float(chosen[:, 1:, e].float().mean()), "p0_weight": float(w[:, 0, e].mean()),
                         "rest_weight": float(w[:, 1:, e].mean())})
    return pd.DataFrame(rows).set_index(["layer", "expert"])
