"""Hooks the user left on the model (issue 19, item 5).

The fast path reuses cached activations, skips blocks and runs suffixes only, so a hook of the
user's would fire on other tensors than in a full forward: it refuses, naming the hook. The
reference path (full forwards) honours it: its numbers equal a plain-hooks patch with the same
hook in place. Checked on a Gemma 3 checkpoint (QK-norm, post-norms, sliding windows) for a hook
on each kind of hook the engine reads (residual streams, keys, values, patterns, norms), writes
(head outputs, MLP outputs, neurons) or skips (a plain module).
"""

import logging

import pytest
import torch

import p0circuit as p0
import oracle as O
from family_configs import VOCAB, make_checkpoint
from tolerance import close

HOOKS = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.2.hook_resid_post",
         "blocks.0.attn.hook_z", "blocks.0.hook_mlp_out", "blocks.1.mlp.hook_post", "blocks.1.attn.hook_k",
         "blocks.1.attn.hook_v", "blocks.1.attn.hook_q", "blocks.1.attn.hook_pattern", "blocks.0.ln1.hook_scale"]
TOKENS = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
NODES = ["A0.H1@0", "M0@0", "A1.H0@rest", "M1.N3@0"]


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    logging.disable(logging.WARNING)
    return p0.load_checkpoint(make_checkpoint("gemma3", tmp_path_factory.mktemp("hooks")))


def scale(act, hook):
    return act + 0.3  # additive: every norm of Gemma 3 would undo a rescaling


@pytest.mark.parametrize("name", HOOKS)
def test_fast_path_refuses_reference_honours(model, name):
    kw = dict(nodes=NODES, corruption=p0.Shift(filler=(O.FILLER,)), metric=p0.NormRatio(2), min_signal=0)
    model.add_hook(name, scale)
    try:
        with pytest.raises(p0.BadInputError, match=name.rsplit(".", 1)[0].replace(".", r"\.")):
            p0.activation_patch(model, TOKENS, **kw)
        with pytest.raises(p0.BadInputError, match="reference=True"):
            p0.path_patch(model, TOKENS, edges=["M0@0->M1@0.mlp_in"], corruption="shift", metric=p0.NormRatio(2))
        slow = p0.activation_patch(model, TOKENS, reference=True, **kw)
        plain = O.activation(model, TOKENS, NODES, O.Corr("shift"), O.Metric("norm_ratio", layer=2))  # the user's hook stays on for these forwards too
    finally:
        model.reset_hooks()
    without = p0.activation_patch(model, TOKENS, reference=True, **kw)
    for n in NODES:
        assert close(slow.raw[n], plain[n], slow.clean_metric), (n, slow.raw[n], plain[n])
    assert any(abs(slow.raw[n] - without.raw[n]) > 1e-4 for n in NODES), "the user's hook changes the numbers"


def test_hook_on_a_plain_module_is_named(model):
    handle = model.blocks[1].mlp.register_forward_hook(lambda module, args, out: out * 2)
    try:
        with pytest.raises(p0.BadInputError, match=r"blocks\.1\.mlp"):
            p0.activation_patch(model, TOKENS, corruption="shift", metric=p0.NormRatio(2))
    finally:
        handle.remove()
    p0.activation_patch(model, TOKENS, corruption="shift", metric=p0.NormRatio(2))  # and runs once it is gone
