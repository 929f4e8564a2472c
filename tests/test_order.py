"""Issue 52: the per-model hook-order trace (``p0circuit/patching/order.py``) costs a small fraction of a
forward, counted (``patching/work.py``), not timed; traced by parts it decides exactly what the
whole-model trace decides (every family: ``tests/test_families.py``), and a model it cannot trust to
parts is traced whole."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import p0circuit as p0
from p0circuit.patching import order, work


def deep(n_layers=32, **kw):
    """A narrow model deep enough for one block to be a small share of a forward."""
    cfg = dict(n_layers=n_layers, d_model=16, n_heads=4, d_head=4, d_mlp=32, d_vocab=24, n_ctx=16, act_fn="gelu",
               normalization_type="RMS", positional_embedding_type="rotary", default_prepend_bos=False, seed=0)
    return HookedTransformer(HookedTransformerConfig(**{**cfg, **kw}))


def block_share(model) -> float:
    s = work.shares(model)
    return (s["attn"] + s["mlp"]) / work.forward_work(model, 1)


def counted_trace(model, **kw):
    with work.Count(model) as c:
        got = order.trace(model, **kw)
    return got, c


def test_the_trace_runs_one_block_per_structure_four_times():
    """Two traced shapes and a cached prefix and suffix, each of one block: 4 block calls in all (the
    unembedding runs one column and is not counted), against 4 whole forwards traced whole."""
    model = deep()
    parts, c = counted_trace(model)
    assert parts.traced == "parts" and set(order.structures(model).values()) == {0}
    assert c.passes() == pytest.approx(4 * block_share(model), rel=1e-9) and c.passes() <= 0.2
    assert c.forwards(1) == pytest.approx(c.passes() * 31 / 4, rel=1e-9)  # rows: 2x3, 3x5, 2x3 and 2x2 tokens
    whole, c = counted_trace(model, whole=True)
    assert whole.traced == "whole" and c.passes() == pytest.approx(4.0) and whole.facts() == parts.facts()


def test_blocks_of_another_structure_are_traced_apart():
    """Local and global attention layers (Gemma 2's alternation) are two structures: one block of each."""
    model = deep(n_layers=6, attn_types=["local", "global"] * 3, use_local_attn=True, window_size=4)
    assert order.structures(model) == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1}
    parts, c = counted_trace(model)
    assert c.passes() == pytest.approx(8 * block_share(model), rel=1e-9)
    assert parts.facts() == order.trace(model, whole=True).facts()


def test_a_model_with_hooks_of_its_own_is_traced_whole():
    """A user's hook may change what fires where: such a model gets no facts assumed from one block."""
    model = deep(n_layers=4)
    handle = model.blocks[2].mlp.register_forward_hook(lambda module, args, out: None)
    try:
        assert order.structures(model) is None and order.trace(model).traced == "whole"
    finally:
        handle.remove()
    assert order.trace(model).traced == "parts"


def test_a_subclass_with_its_own_forward_is_traced_whole():
    class Mine(HookedTransformer):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    model = Mine(deep(n_layers=2).cfg)
    assert order.structures(model) is None and order.trace(model).traced == "whole"


def test_the_first_call_counts_only_the_trace_more_than_the_second(planted_models):
    """Nothing else is paid once per model: a first patching call's counted work is the second's plus the
    trace's (rows and passes), whatever the machine does."""
    model = planted_models("rope").model
    tokens = p0.probe_tokens(model, 4, 12, seed=0, regular=True)
    order._ORDERS.pop(model, None)
    _, trace = counted_trace(model)
    order._ORDERS.pop(model, None)
    counts = []
    for _ in range(2):
        with work.Count(model) as c:
            p0.activation_patch(model, tokens, corruption="shift", metric="norm_ratio:1")
        counts.append(c)
    first, second = counts
    assert first.passes() == pytest.approx(second.passes() + trace.passes(), rel=1e-9)
    assert first.forwards(tokens.numel()) == pytest.approx(second.forwards(tokens.numel())
                                                           + trace.forwards(tokens.numel()), rel=1e-9)


def test_the_trace_leaves_the_model_as_it_was():
    model = deep(n_layers=3)
    flags = (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in, model.cfg.use_attn_result)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    order.trace(model)
    assert (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in, model.cfg.use_attn_result) == flags
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    assert model.unembed.W_U.shape == (16, 24)


@pytest.mark.parametrize("kw", [dict(positional_embedding_type="standard", normalization_type="LN"),
                                dict(positional_embedding_type="shortformer", normalization_type="LN"),
                                dict(positional_embedding_type="alibi"), dict(attn_only=True),
                                dict(parallel_attn_mlp=True), dict(normalization_type=None)],
                         ids=["standard", "shortformer", "alibi", "attn_only", "parallel", "no_norm"])
def test_parts_decide_as_the_whole_trace_on_configurations_no_family_has(kw):
    """Beside every family (``tests/test_families.py``): positions TransformerLens adds to the queries and keys
    (shortformer), no MLPs, parallel blocks, no final norm."""
    model = deep(n_layers=3, **kw)
    parts = order.trace(model)
    assert parts.traced == "parts" and parts.facts() == order.trace(model, whole=True).facts()


def test_the_planted_models_are_traced_by_parts(planted_models):
    model = planted_models("rope").model
    parts = order.trace(model)
    assert parts.traced == "parts" and parts.facts() == order.trace(model, whole=True).facts()
