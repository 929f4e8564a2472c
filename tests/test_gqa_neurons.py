"""Grouped-query attention receivers and neuron-level nodes: the fast path against the slow
reference, and against hand-written TransformerLens hooks."""

import pytest
import torch

import p0circuit as p0
from p0circuit import Edge, Kind, ModelSpec, Node
from p0circuit.core.types import Input
from p0circuit.core.errors import BadInputError
from p0circuit.patching import Resample, Shift
from p0circuit.patching.edges import candidate_edges
from p0circuit.patching.sites import candidate_neurons

from conftest import random_tokens
from tolerance import close, results_close



@pytest.fixture(scope="module")
def gqa():
    """Llama-like: RMSNorm, gated SiLU MLP, RoPE, 4 query heads sharing 2 key/value heads."""
    return ModelSpec(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=50, n_ctx=16,
                     mlp="gated", act_fn="silu", seed=2).build()


def logit_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


def test_kv_edges_go_to_the_shared_key_value_head_once(gqa):
    edges = candidate_edges(gqa, [Node(Kind.MLP, 0, pos=0)])
    into = {(e.dst.kind, e.dst.layer, e.input.value) for e in edges}
    for layer in (1, 2):
        assert sum(1 for e in edges if e.dst.layer == layer and e.input.value == "q") == 4
        for which in ("k", "v"):
            receivers = [e.dst for e in edges if e.dst.layer == layer and e.input.value == which]
            assert receivers == [Node(Kind.KV_HEAD, layer, g, 0) for g in range(2)]
    assert (Kind.HEAD, 1, "k") not in into
    assert len({e.name for e in edges}) == len(edges)


def test_a_query_head_as_key_receiver_names_the_shared_head(gqa):
    with pytest.raises(BadInputError, match=r"A1\.KV1@0\.k"):
        p0.path_patch(gqa, random_tokens(2, 8, 50, seed=1), edges=["M0@0->A1.H3@0.k"], metric=p0.LogitMetric(logit_diff),
                      min_signal=0)


@pytest.mark.parametrize("corruption", [Shift(2), Resample()])
def test_gqa_path_fast_equals_reference(gqa, corruption):
    toks = random_tokens(3, 10, 50, seed=3)
    metric = p0.LogitMetric(logit_diff)
    kw = dict(corruption=corruption, metric=metric, min_signal=0)
    fast = p0.path_patch(gqa, toks, rows_per_forward=9, **kw)
    slow = p0.path_patch(gqa, toks, reference=True, **kw)
    assert any("KV" in name for name in fast.raw)
    assert results_close(fast, slow)


def test_kv_edge_equals_a_hand_written_hook(gqa):
    """M0@0 -> A1.KV1@0.v: the clean run with (corrupted - clean) MLP-0 output at position 0
    added to key/value head 1's value input of block 1, nothing else."""
    toks = random_tokens(3, 10, 50, seed=4)
    corrupt = random_tokens(3, 10, 50, seed=5)
    metric = p0.LogitMetric(logit_diff)
    res = p0.path_patch(gqa, toks, edges=["M0@0->A1.KV1@0.v"], corruption=Resample(tokens=corrupt), metric=metric,
                        min_signal=0)
    _, clean = gqa.run_with_cache(toks, names_filter="blocks.0.hook_mlp_out")
    _, corr = gqa.run_with_cache(corrupt, names_filter="blocks.0.hook_mlp_out")
    delta = corr["blocks.0.hook_mlp_out"][:, 0] - clean["blocks.0.hook_mlp_out"][:, 0]

    def add(act, hook):
        act = act.clone()
        act[:, 0, 1] += delta
        return act

    gqa.set_use_split_qkv_input(True)
    try:
        logits = gqa.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_v_input", add)])
    finally:
        gqa.set_use_split_qkv_input(False)
    assert close(res.raw["M0@0->A1.KV1@0.v"], float(logit_diff(logits).detach()), res.clean_metric)


def test_neuron_nodes_fast_equal_reference_and_hooks(gqa):
    toks = random_tokens(4, 10, 50, seed=6)
    nodes = candidate_neurons(gqa, [0, 1], positions=(0, "rest"))
    assert len(nodes) == 2 * 2 * 48 and nodes[0].name == "M0.N0@0"
    metric = p0.NormRatio(2)
    shift = Shift(1, filler=(5,))
    fast = p0.activation_patch(gqa, toks, nodes=nodes, corruption=shift, metric=metric, min_signal=0)
    slow = p0.activation_patch(gqa, toks, nodes=nodes, corruption=shift, metric=metric, min_signal=0, reference=True)
    assert results_close(fast, slow)
    # one neuron by hand: its activation at position 0 set to the shifted run's
    shifted = torch.cat([torch.full((4, 1), 5), toks], dim=1)
    _, corr = gqa.run_with_cache(shifted, names_filter="blocks.1.mlp.hook_post")
    value = corr["blocks.1.mlp.hook_post"][:, 1, 7]  # the clean first token sits at position 1 there

    def put(act, hook):
        act = act.clone()
        act[:, 0, 7] = value
        return act

    captured = {}
    gqa.run_with_hooks(toks, fwd_hooks=[("blocks.1.mlp.hook_post", put),
                                        ("blocks.2.hook_resid_post", lambda a, hook: captured.update(r=a))])
    view = p0.patching.RunView({"blocks.2.hook_resid_post": captured["r"]}, None, 0)
    assert close(fast.raw["M1.N7@0"], float(metric(view).detach()), fast.clean_metric)
    assert max(abs(fast.raw[n.name] - fast.clean_metric) for n in nodes) > 1e-4  # neurons matter


def test_neuron_senders_in_path_patching(gqa):
    toks = random_tokens(3, 10, 50, seed=7)
    edges = [Edge(Node(Kind.NEURON, 0, pos=0, neuron=n), Node(Kind.MLP, 1, pos=0), Input.MLP) for n in range(6)]
    edges += [Edge(Node(Kind.NEURON, 0, pos=0, neuron=3), Node(Kind.KV_HEAD, 1, 0, 0), Input.K)]
    kw = dict(edges=edges, corruption=Shift(1), metric=p0.NormRatio(2), min_signal=0)
    fast = p0.path_patch(gqa, toks, **kw)
    slow = p0.path_patch(gqa, toks, reference=True, **kw)
    assert results_close(fast, slow)


def test_bad_neuron_and_kv_nodes(gqa):
    toks = random_tokens(2, 8, 50, seed=1)
    with pytest.raises(BadInputError, match="neurons 0..47"):
        p0.activation_patch(gqa, toks, nodes=["M0.N48@0"], metric=p0.NormRatio(2), min_signal=0)
    with pytest.raises(BadInputError, match="only a receiver"):
        p0.activation_patch(gqa, toks, nodes=["A1.KV0@0"], metric=p0.NormRatio(2), min_signal=0)
    with pytest.raises(BadInputError, match="cannot send"):
        Edge.parse("A0.KV0@0->M1@0.mlp_in")
    with pytest.raises(BadInputError, match="only query heads have a q input"):
        Edge.parse("M0@0->A1.KV0@0.q")


@pytest.mark.parametrize("name", ["gqa", "mha"])
def test_query_key_value_edges_equal_the_per_head_input_hooks(gqa, name, monkeypatch):
    """Edges into q/k/v set the receiver's vector to ln1(resid + delta) W + b; the same edges sent
    through TransformerLens' per-head input hooks (use_split_qkv_input) give the same values."""
    from p0circuit.patching import ops
    from p0circuit.patching.methods import path as path_method

    model = gqa if name == "gqa" else ModelSpec(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=48, d_vocab=50,
                                                 n_ctx=16, norm="ln", pos="learned", seed=3).build()
    toks = random_tokens(3, 10, 50, seed=9)
    senders = [Node(Kind.HEAD, 0, 1, 0), Node(Kind.MLP, 0, pos=0), Node(Kind.HEAD, 0, 2, "rest")]
    edges = [e for e in candidate_edges(model, senders) if e.input != Input.MLP]
    kw = dict(edges=edges, corruption=Shift(2), metric=p0.LogitMetric(logit_diff), min_signal=0)
    direct = p0.path_patch(model, toks, **kw)
    monkeypatch.setattr(ops, "direct_qkv", lambda model: False)
    monkeypatch.setattr(path_method, "direct_qkv", lambda model: False)
    split = p0.path_patch(model, toks, **kw)
    assert results_close(direct, split) and max(abs(v - direct.clean_metric) for v in direct.raw.values()) > 1e-4
