"""Mixture-of-experts MLPs (issue 19, item 3): the MoE block is the MLP node, single experts are
nodes (``M1.E3@0``), and the router's choice at P0 is a view. On tiny Mixtral, OLMoE and GPT-OSS
checkpoints:

* the experts' contributions, recomputed by p0circuit, add up to TransformerLens' MoE output;
* patching an expert: fast == reference == an independent patch that zeroes the expert's output
  rows inside TransformerLens' own MoE forward (rows mapped to positions from its router hook);
* the routing view equals the router's choices read from TransformerLens' ``hook_expert_indices``.
"""

import logging

import pytest
import torch

import p0circuit as p0
from family_configs import VOCAB, make_checkpoint
from p0circuit.patching.experts import expert_contribution
from tolerance import assert_close, close

TOKENS = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(2))
NODES = ["M0.E0@0", "M0.E1@0", "M0.E2@0", "M0.E3@0", "M1.E1@rest", "M1.E2@0", "M0@0"]


@pytest.fixture(scope="session", params=["mixtral", "olmoe", "gpt_oss"])
def moe(request, tmp_path_factory):
    logging.disable(logging.WARNING)
    return p0.load_checkpoint(make_checkpoint(request.param, tmp_path_factory.mktemp("moe")))


def router_choices(model, tokens, layer):
    """[B, T, k] expert indices as TransformerLens' router chose them."""
    got = {}
    model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.mlp.hook_expert_indices",
                                             lambda act, hook: got.update(i=act.clone()))])
    return got["i"].reshape(*tokens.shape, -1)


def test_contributions_add_up_to_the_moe_output(moe):
    _, cache = moe.run_with_cache(TOKENS)
    for layer in range(moe.cfg.n_layers):
        resid = cache[f"blocks.{layer}.hook_resid_mid"]
        total = sum(expert_contribution(moe, layer, resid, e) for e in range(moe.cfg.num_experts))
        assert_close(total, cache[f"blocks.{layer}.hook_mlp_out"], what="the experts' contributions summed")


@torch.no_grad()
def plain_zero_expert(model, tokens, node, layer_metric):
    """Norm ratio at ``layer_metric`` with one expert's output zeroed at the node's positions, inside
    TransformerLens' MoE forward: its rows are the tokens routed to it, slot by slot, in token order."""
    comp, pos = node.split("@")
    layer, expert = (int(v) for v in comp[1:].split(".E"))
    seq = tokens.shape[1]
    positions = list(range(1, seq)) if pos == "rest" else [int(pos)]
    choices = router_choices(model, tokens, layer).reshape(-1, model.cfg.experts_per_token)  # (N, k)
    rows = [n for slot in range(choices.shape[1]) for n in range(choices.shape[0]) if choices[n, slot] == expert]
    zero = torch.tensor([n % seq in positions for n in rows])
    got = {}

    def hook(module, args, out):
        return out * (~zero)[:, None].to(out.dtype)

    handle = model.blocks[layer].mlp.experts[expert].register_forward_hook(hook)
    try:
        model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer_metric}.hook_resid_post",
                                                 lambda act, hook: got.update(r=act.clone()))])
    finally:
        handle.remove()
    norms = got["r"].norm(dim=-1)
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


def test_expert_patching_fast_reference_plain(moe):
    kw = dict(nodes=NODES, corruption="zero", metric=p0.NormRatio(2), min_signal=0)
    fast, slow = p0.activation_patch(moe, TOKENS, **kw), p0.activation_patch(moe, TOKENS, reference=True, **kw)
    for node in NODES[:-1]:
        plain = plain_zero_expert(moe, TOKENS, node, 2)
        assert close(fast.raw[node], plain) and close(slow.raw[node], plain), (node, fast.raw[node], slow.raw[node], plain)
    assert len({round(fast.raw[n], 6) for n in NODES}) > 3  # experts differ from each other and from the MLP
    for corruption in ("shift", "pos_mean", "resample"):
        kw = dict(nodes=NODES, corruption=corruption, metric=p0.NormRatio(2), min_signal=0)
        fast, slow = p0.activation_patch(moe, TOKENS, **kw), p0.activation_patch(moe, TOKENS, reference=True, **kw)
        assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in NODES)
    denoise = dict(nodes=NODES, corruption="shift", metric=p0.NormRatio(2), min_signal=0, direction="denoise")
    fast, slow = p0.activation_patch(moe, TOKENS, **denoise), p0.activation_patch(moe, TOKENS, reference=True, **denoise)
    assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in NODES)


def test_attribution_takes_expert_nodes(moe):
    result = p0.attribution_patch(moe, TOKENS, nodes=NODES, corruption="zero", metric=p0.NormRatio(2), min_signal=0)
    assert set(result.raw) == set(NODES) and all(v == v for v in result.raw.values())


def test_routing_view_equals_the_router(moe):
    frame = p0.expert_routing(moe, TOKENS)
    choices = router_choices(moe, TOKENS, 1)  # (B, T, k)
    for e in range(moe.cfg.num_experts):
        p0_share = float((choices[:, 0] == e).any(-1).float().mean())
        rest_share = float((choices[:, 1:] == e).any(-1).float().mean())
        assert frame.loc[(1, e), "p0_share"] == pytest.approx(p0_share)
        assert frame.loc[(1, e), "rest_share"] == pytest.approx(rest_share)
    assert frame.groupby("layer")["p0_share"].sum().tolist() == pytest.approx([moe.cfg.experts_per_token] * moe.cfg.n_layers)


def test_expert_nodes_are_refused_where_they_cannot_be(moe):
    with pytest.raises(p0.BadInputError, match="experts 0..3"):
        p0.activation_patch(moe, TOKENS, nodes=["M0.E9@0"], corruption="zero", metric=p0.NormRatio(2))
    with pytest.raises(p0.BadInputError, match="experts cannot be edge senders"):
        p0.path_patch(moe, TOKENS, edges=["M0.E1@0->M1@0.mlp_in"], corruption="zero", metric=p0.NormRatio(2))
    with pytest.raises(p0.BadInputError, match="each expert has neurons of its own"):
        p0.activation_patch(moe, TOKENS, nodes=["M0.N1@0"], corruption="zero", metric=p0.NormRatio(2))
    dense = p0.ModelSpec(n_layers=2).build()
    with pytest.raises(p0.BadInputError, match="not mixtures of experts"):
        p0.activation_patch(dense, TOKENS % 20, nodes=["M0.E1@0"], corruption="zero", metric=p0.NormRatio(1))
    assert [n.name for n in p0.candidate_experts(moe, [1])] == [f"M1.E{e}@0" for e in range(4)]
