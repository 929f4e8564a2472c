"""Half precision that cannot lie.

* Every family's tiny checkpoint loaded in bfloat16: activation and path patching (fast path) equal
  the plain-hook oracle (``tests/oracle.py``) run on the same bfloat16 model, at a stated tolerance:
  :data:`REL_BF16` of the metric's size, one bfloat16 rounding (bfloat16 keeps 8 bits of mantissa; the
  two computations add and multiply in different orders). Measured: at most 0.69 of it (OPT), while the
  median single-node effect is about 1e-2 of the metric, so the tolerance sits below most effects. The
  metrics themselves are computed in float32 from the bfloat16 activations.
* A float16 model whose residual stream overflows (float16 stops at 65,504; massive activations at
  P0 pass it) is refused with the reason and the fix, never a NaN effect.
"""

import logging

import pytest
import torch

import p0circuit as p0
import oracle as O
from p0circuit.core.types import Node
from family_configs import VOCAB, make_checkpoint
from tolerance import close
from test_families import FAMILIES, METRIC_LAYER, nodes_of, sample, senders_of

REL_BF16 = 2**-8
"""Tolerance of a bfloat16 comparison, relative to the metric's size: one rounding of 2**-8."""
TOKENS = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="session", params=FAMILIES)
def family_bf16(request, tmp_path_factory):
    logging.disable(logging.WARNING)
    path = make_checkpoint(request.param, tmp_path_factory.mktemp("bf16"))
    try:
        return request.param, p0.load_checkpoint(path, dtype=torch.bfloat16)
    except p0.CheckpointError as err:  # refused at load, with the fix: acceptable, never a wrong number
        assert "does not run in torch.bfloat16" in str(err) and "dtype=torch.float32" in str(err), err
        pytest.skip(f"{request.param} refuses bfloat16 at load: {err}")


def test_bfloat16_patching_equals_plain_hooks(family_bf16):
    name, model = family_bf16
    assert model.cfg.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.bfloat16
    metric, corr, om = p0.NormRatio(METRIC_LAYER), p0.Shift(filler=(O.FILLER,)), O.Metric("norm_ratio", layer=METRIC_LAYER)
    nodes = nodes_of(name, model)
    fast = p0.activation_patch(model, TOKENS, nodes=nodes, corruption=corr, metric=metric, min_signal=0)
    plain = O.activation(model, TOKENS, nodes, O.Corr("shift"), om)
    scale = abs(fast.clean_metric)
    bad = [(n, fast.raw[n], plain[n]) for n in nodes if not close(fast.raw[n], plain[n], scale, rel=REL_BF16)]
    assert not bad, f"{name}: {len(bad)} of {len(nodes)} nodes differ (name, fast, plain): {bad[:4]}"
    assert isinstance(fast.clean_metric, float)
    edges = sample([e.name for e in p0.candidate_edges(model, [Node.parse(s) for s in senders_of(name)])])
    fast_e = p0.path_patch(model, TOKENS, edges=edges, corruption=corr, metric=metric, min_signal=0)
    plain_e = O.path(model, TOKENS, edges, O.Corr("shift"), om)
    bad = [(e, fast_e.raw[e], plain_e[e]) for e in edges if not close(fast_e.raw[e], plain_e[e], scale, rel=REL_BF16)]
    assert not bad, f"{name}: {len(bad)} of {len(edges)} edges differ (name, fast, plain): {bad[:4]}"


def test_a_float16_overflow_is_refused_with_the_fix():
    """A residual stream past 65,504 at P0 (as Gemma 3's massive activations are) in a float16 model:
    every entry point refuses it naming float16, where, and the fix; none returns a NaN effect."""
    model = p0.ModelSpec(n_layers=2, d_model=32, n_heads=2, d_vocab=40, n_ctx=16).build()
    with torch.no_grad():  # each weight fits float16; their sum in the residual stream does not
        for block in model.blocks:
            block.mlp.b_out[3] = 4e4
    model.to(torch.float16)
    toks = p0.probe_tokens(model, 4, 8, seed=0)
    for call in (lambda: p0.sink_report(model, toks, bos=False),
                 lambda: p0.activation_patch(model, toks, corruption="shift", metric="norm_ratio:1")):
        with pytest.raises(p0.NonFiniteError, match="float16 overflow") as err:
            call()
        assert "bfloat16 or float32" in str(err.value) and "blocks.1" in str(err.value)
    model.to(torch.bfloat16)  # the fix: the same weights in bfloat16 measure
    assert torch.isfinite(torch.tensor(p0.sink_report(model, toks, bos=False).norm_ratio_resid)).all()


def test_bfloat16_circuit_numbers_equal_plain_hooks(family_bf16):
    """A found circuit's faithfulness, completeness and denoising on the bfloat16 model: plain hooks patching
    every node outside it, only its nodes, and its nodes restored into the corrupted run, at one rounding."""
    name, model = family_bf16
    metric, corr, om = p0.NormRatio(METRIC_LAYER), p0.Shift(filler=(O.FILLER,)), O.Metric("norm_ratio", layer=METRIC_LAYER)
    result = p0.activation_patch(model, TOKENS, nodes=nodes_of(name, model), corruption=corr, metric=metric,
                                 min_signal=0)
    found = p0.faithful_circuit(result, target=0.6, tolerance=0.4).search
    names, gap, scale = list(result.raw), result.clean_metric - result.corrupted_metric, abs(result.clean_metric)
    rest = [n for n in names if n not in found.nodes]
    for value, plain in ((result.corrupted_metric + found.faithfulness * gap,
                          O.together(model, TOKENS, rest, O.Corr("shift"), om, O.named_of(names))),
                         (result.clean_metric - found.completeness * gap,
                          O.together(model, TOKENS, found.nodes, O.Corr("shift"), om, O.named_of(names))),
                         (result.corrupted_metric + found.denoising * gap,
                          O.together(model, TOKENS, found.nodes, O.Corr("shift"), om, O.named_of(names),
                                     direction="denoise"))):
        assert close(value, plain, scale, rel=REL_BF16), (name, found.nodes, value, plain)
