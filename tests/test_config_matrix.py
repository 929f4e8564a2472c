"""Issue 14, class 3: the fast path is exact on every model configuration TransformerLens can
build (positions, attention-only, parallel blocks, grouped-query and local attention, norms, gated
MLPs, the hook flags a user may have set), or refuses it with a ConfigError. Each configuration:
activation and path patching, fast against the slow reference, on a norm metric (forwards stop
early) and a logit metric (suffix forwards to the unembedding); attribution runs."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import p0circuit as p0

import oracle as O
from tolerance import close

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=32, d_vocab=20, n_ctx=16, act_fn="gelu", seed=0,
            normalization_type="LN", positional_embedding_type="standard", default_prepend_bos=False)
CONFIGS = {
    "learned": {}, "rotary": dict(positional_embedding_type="rotary"),
    "shortformer": dict(positional_embedding_type="shortformer"), "attn_only": dict(attn_only=True),
    "parallel": dict(parallel_attn_mlp=True), "gqa": dict(positional_embedding_type="rotary", n_key_value_heads=2),
    "local": dict(attn_types=["local", "global"], window_size=3, use_local_attn=True),
    "rms": dict(normalization_type="RMS"), "no_norm": dict(normalization_type=None),
    "ln_pre": dict(normalization_type="LNPre"), "rms_pre": dict(normalization_type="RMSPre"),
    "gated": dict(gated_mlp=True, act_fn="silu"), "attn_result": dict(use_attn_result=True),
    "split_qkv": dict(use_split_qkv_input=True), "mlp_in": dict(use_hook_mlp_in=True), "attn_in": dict(use_attn_in=True),
    "rotary_partial": dict(positional_embedding_type="rotary", rotary_dim=2),
}


def logit_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    torch.manual_seed(0)
    m = HookedTransformer(HookedTransformerConfig(**{**BASE, **CONFIGS[request.param]}))
    with torch.no_grad():
        for param in m.parameters():
            param.normal_(std=0.3)  # not the default init: every weight matters
    return m


@pytest.mark.parametrize("method", ["activation", "path"])
@pytest.mark.parametrize("metric", [p0.NormRatio(1), p0.LogitMetric(logit_diff)], ids=["norm", "logits"])
def test_fast_equals_reference_or_refuses(model, method, metric):
    toks = torch.randint(0, 20, (3, 10), generator=torch.Generator().manual_seed(1))
    fn = getattr(p0, f"{method}_patch")
    kw = dict(corruption="shift", metric=metric, min_signal=0)
    fast, slow = fn(model, toks, **kw), fn(model, toks, reference=True, **kw)
    assert fast.raw.keys() == slow.raw.keys()
    assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in fast.raw)
    assert max(abs(v - fast.clean_metric) for v in fast.raw.values()) > 1e-4  # the patches change something


def test_attribution_equals_plain_autograd(model):
    """Attribution on every configuration equals the same first-order estimate computed with plain
    TransformerLens hooks and torch autograd (tests/oracle.py), not merely a finite number."""
    toks = torch.randint(5, 20, (3, 10), generator=torch.Generator().manual_seed(1))
    nodes = ["A0.H1@0", "A1.H2@rest"] + ([] if model.cfg.attn_only else ["M0@0", "M1@rest"])
    result = p0.attribution_patch(model, toks, nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)),
                                  metric=p0.NormRatio(1), min_signal=0)
    plain = O.attribution(model, toks, nodes, O.Corr("shift"), O.Metric("norm_ratio", layer=1))
    scale = max(1.0, abs(result.clean_metric))
    assert all(close(result.raw[n], plain[n], scale) for n in nodes), (result.raw, plain)
    assert max(abs(result.raw[n] - result.clean_metric) for n in nodes) > 1e-5  # the estimates are not all zero
