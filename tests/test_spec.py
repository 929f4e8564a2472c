import pytest
import torch

from p0circuit import ConfigError, ModelSpec, positional_kind
from p0circuit.core import hooks
from tolerance import assert_close


@pytest.mark.parametrize(
    "kw",
    [
        dict(pos="rope"), dict(pos="nope"), dict(pos="learned"), dict(norm="ln"), dict(mlp="gated"),
        dict(parallel=True), dict(window=4), dict(pos="rope", rotary_dim=8),
    ],
)
def test_spec_builds_and_runs(kw):
    spec = ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=50, n_ctx=16, **kw)
    model = spec.build()
    logits = model(torch.randint(0, 50, (2, 16)))
    assert logits.shape == (2, 16, 50)
    assert torch.isfinite(logits).all()
    assert positional_kind(model) == spec.pos
    assert model.cfg.default_prepend_bos is False


def test_nope_has_no_positional_signal():
    model = ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, pos="nope").build()
    assert not model.W_pos.requires_grad and (model.W_pos == 0).all()
    # the same token at every position gives the same residual stream at every position
    _, cache = model.run_with_cache(torch.full((1, 10), 7))
    r = cache[hooks.resid_post(1)][0]
    assert_close(r, r[:1].expand_as(r), what="the positions of a repeated token")


def test_sliding_window_masks_old_keys():
    model = ModelSpec(n_layers=1, d_model=32, n_heads=2, d_head=16, d_mlp=64, window=3).build()
    _, cache = model.run_with_cache(torch.randint(0, 64, (1, 10)))
    pat = cache[hooks.pattern(0)][0]  # (H, T, T)
    q, k = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    assert (pat[:, (q - k) >= 3] == 0).all()
    assert (pat[:, (q - k) < 3 & (k <= q)] > 0).any()


def test_parallel_blocks_have_no_resid_mid():
    model = ModelSpec(n_layers=1, d_model=32, n_heads=2, d_head=16, d_mlp=64, parallel=True).build()
    assert model.cfg.parallel_attn_mlp


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(pos="alibi"), "ModelSpec.pos='alibi' is not valid; choose one of"),
        (dict(norm="batch"), "choose one of ('rms', 'ln')"),
        (dict(n_layers=0), "ModelSpec.n_layers=0 must be in [[]1, 1000000[]] (blocks)"),
        (dict(window=0), "ModelSpec.window must be None or a positive int"),
        (dict(pos="nope", rotary_dim=4), "rotary_dim only applies with pos='rope'"),
        (dict(rotary_dim=3), "rotary_dim must be even"),
    ],
)
def test_spec_errors_name_the_key(kw, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ModelSpec(**kw)


def test_spec_from_dict_names_unknown_keys():
    with pytest.raises(ConfigError, match=r"unknown ModelSpec key\(s\) \['layers'\]; valid keys"):
        ModelSpec.from_dict({"layers": 3})
    spec = ModelSpec(pos="nope", n_layers=3)
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_same_seed_same_weights():
    a, b = ModelSpec(seed=5).build(), ModelSpec(seed=5).build()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
