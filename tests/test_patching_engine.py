"""The fast patching path equals the slow reference, and equals TransformerLens where they overlap."""

from contextlib import contextmanager


import pytest
import torch
from transformer_lens import patching as tl_patching

import p0circuit as p0
from p0circuit import ModelSpec, Node, Kind
from p0circuit.patching import PosMean, Resample, Shift, Zero

from conftest import random_tokens
from tolerance import close, results_close



@contextmanager
def _rows_into(model, layers):
    """(rows, tokens): the rows entering each of ``layers`` in the block, and batch x positions per
    call. Counted by wrapping the blocks' forward: a hook would be one of the user's, which the fast
    path refuses."""
    rows = {layer: 0 for layer in layers}
    tokens = {layer: [] for layer in layers}
    for layer in layers:
        def forward(resid, *args, _f=model.blocks[layer].forward, _l=layer, **kw):
            rows[_l] += resid.shape[0]
            tokens[_l].append(resid.shape[0] * resid.shape[1])
            return _f(resid, *args, **kw)
        model.blocks[layer].forward = forward
    try:
        yield rows, tokens
    finally:
        for layer in layers:
            del model.blocks[layer].forward  # the class's forward again


@pytest.fixture(scope="module")
def generic():
    """A random model that is not the plant: LayerNorm, gated MLP, learned positions."""
    return ModelSpec(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=24,
                     pos="learned", norm="ln", mlp="gated", seed=1).build()


def logit_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


@pytest.mark.parametrize("corruption", [Shift(2), PosMean(), Zero(), Resample()])
def test_activation_fast_equals_reference_planted(planted, corruption):
    toks = random_tokens(6, 20, 32, seed=3)
    # zeroing the embeddings or the whole residual stream at the other positions leaves the norm
    # ratio x/0: a NonFiniteError (tested in test_verify), not a comparison
    zero = isinstance(corruption, Zero)
    nodes = p0.patching.candidate_nodes(planted.model, embed=not zero, resid=not zero)
    metric = p0.NormRatio(1)
    fast = p0.activation_patch(planted.model, toks, nodes=nodes, corruption=corruption, metric=metric, rows_per_forward=13)
    slow = p0.activation_patch(planted.model, toks, nodes=nodes, corruption=corruption, metric=metric, reference=True)
    assert results_close(fast, slow)


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_activation_fast_equals_reference_generic(generic, direction):
    toks = random_tokens(4, 12, 50, seed=4)
    metric = p0.LogitMetric(logit_diff)
    nodes = p0.patching.candidate_nodes(generic, positions=(0, 1), embed=True)
    fast = p0.activation_patch(generic, toks, nodes=nodes, corruption=Shift(3), metric=metric, direction=direction, min_signal=0)
    slow = p0.activation_patch(generic, toks, nodes=nodes, corruption=Shift(3), metric=metric, direction=direction, min_signal=0, reference=True)
    assert results_close(fast, slow)


@pytest.mark.parametrize("corruption", [Shift(1), PosMean()])
def test_path_fast_equals_reference(planted, corruption):
    toks = random_tokens(4, 16, 32, seed=5)
    metric = p0.AttnToP0(heads=list(planted.sink_heads))
    fast = p0.path_patch(planted.model, toks, corruption=corruption, metric=metric, rows_per_forward=40)
    slow = p0.path_patch(planted.model, toks, corruption=corruption, metric=metric, reference=True)
    assert results_close(fast, slow)


def test_path_fast_equals_reference_generic(generic):
    toks = random_tokens(3, 10, 50, seed=6)
    metric = p0.LogitMetric(logit_diff)
    fast = p0.path_patch(generic, toks, corruption=Shift(2), metric=metric, direction="denoise", min_signal=0)
    slow = p0.path_patch(generic, toks, corruption=Shift(2), metric=metric, direction="denoise", min_signal=0,
                         reference=True)
    assert results_close(fast, slow)


@pytest.mark.parametrize("model_name", ["planted", "generic"])
def test_equal_to_transformer_lens_patching(planted, generic, model_name):
    """Per-position head and MLP outputs, denoising a resampled prompt, as get_act_patch_* does."""
    model = planted.model if model_name == "planted" else generic
    vocab = model.cfg.d_vocab
    clean = random_tokens(3, 8, vocab, seed=7)
    corrupt = random_tokens(3, 8, vocab, seed=8)
    _, clean_cache = model.run_with_cache(clean)
    tl_heads = tl_patching.get_act_patch_attn_head_out_by_pos(model, corrupt, clean_cache, logit_diff)
    tl_mlps = tl_patching.get_act_patch_mlp_out(model, corrupt, clean_cache, logit_diff)
    L, T, H = model.cfg.n_layers, clean.shape[1], model.cfg.n_heads
    nodes = [Node(Kind.HEAD, l, h, p) for l in range(L) for p in range(T) for h in range(H)]
    nodes += [Node(Kind.MLP, l, pos=p) for l in range(L) for p in range(T)]
    ours = p0.activation_patch(model, clean, nodes=nodes, corruption=Resample(tokens=corrupt), metric=p0.LogitMetric(logit_diff),
                               direction="denoise", min_signal=0)
    for l in range(L):
        for p in range(T):
            assert close(ours.raw[f"M{l}@{p}"], float(tl_mlps[l, p]), ours.clean_metric)
            for h in range(H):
                assert close(ours.raw[f"A{l}.H{h}@{p}"], float(tl_heads[l, p, h]), ours.clean_metric)


def test_hooks_never_leak(planted):
    """After an exception inside a patching run the model has no hooks and its flags are restored."""
    def boom(acts, p0_index):
        raise RuntimeError("metric failed")

    metric = p0.CacheMetric(boom, [(1, p0.hooks.resid_post(1))], label="boom")
    toks = random_tokens(2, 8, 32, seed=1)
    for fn in (p0.activation_patch, p0.path_patch, p0.attribution_patch):
        with pytest.raises(RuntimeError, match="metric failed"):
            fn(planted.model, toks, corruption="shift", metric=metric)
        assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in planted.model.hook_dict.values())
        assert not planted.model.cfg.use_split_qkv_input and not planted.model.cfg.use_hook_mlp_in
    before = planted.model(toks)
    assert torch.equal(before, planted.model(toks))


def test_patched_forwards_skip_the_unchanged_prefix(planted):
    """Patches of layer-2 outputs never re-run blocks 0-2 (block 2's output is updated in place at
    the patched positions): only the clean and corrupted cache runs do; block 3 runs once per node."""
    model = planted.model
    with _rows_into(model, (0, 2, 3)) as (calls, _):
        toks = random_tokens(4, 12, 32, seed=9)
        nodes = [f"A2.H{h}@{p}" for h in range(2) for p in (0, "rest")] + ["M2@0", "M2@rest"]
        fast = p0.activation_patch(model, toks, nodes=nodes, corruption="shift", metric=p0.NormRatio(3), rows_per_forward=24)
    assert calls[0] == 2 * 4 and calls[2] == 2 * 4  # the clean and the shifted run, 4 prompts each
    assert calls[3] == 2 * 4 + 6 * 4  # plus one copy of the prompts per patched node
    slow = p0.activation_patch(model, toks, nodes=nodes, corruption="shift", metric=p0.NormRatio(3), reference=True)
    assert results_close(fast, slow)


def test_positions_before_the_patch_are_not_recomputed(planted):
    """A patch at position 5 runs later blocks on positions 5.. only (the prefix comes from cached keys/values)."""
    model = planted.model
    with _rows_into(model, (3,)) as (_, seen):
        toks = random_tokens(4, 12, 32, seed=9)
        nodes = ["A2.H0@5", "A2.H1@5", "M2@5"]
        metric = p0.LogitMetric(lambda logits: logits[:, -1, 0].mean())
        other = Resample(tokens=random_tokens(4, 12, 32, seed=10))
        fast = p0.activation_patch(model, toks, nodes=nodes, corruption=other, metric=metric, direction="denoise", min_signal=0)
    assert seen[3] == [4 * 12, 4 * 12, 3 * 4 * (12 - 5)]  # clean run, corrupted run, one suffix forward
    slow = p0.activation_patch(model, toks, nodes=nodes, corruption=other, metric=metric, direction="denoise", min_signal=0, reference=True)
    assert results_close(fast, slow)


def test_a_metric_read_at_p0_runs_only_the_positions_up_to_p0(planted):
    """ResidDim reads P0 alone: every patched forward runs positions <= P0 only (1 in the clean run,
    2 in the shifted one of the denoise direction, the prefix from the cached keys and values),
    patches of later positions get exactly the base run's value without a forward, and both equal
    the reference, which runs every prompt whole."""
    model = planted.model
    toks = random_tokens(4, 12, 32, seed=9)
    nodes = ["A1.H0@0", "M0@0", "M1@0", "M1.N3@0", "A1.H0@rest", "M1@rest", "M1.N3@4"]
    metric = p0.ResidDim(3, 69)  # the plant's massive dimension at P0 (about 111 there, at most 8 elsewhere)
    for direction in ("noise", "denoise"):
        with _rows_into(model, (2, 3)) as (_, seen):
            fast = p0.activation_patch(model, toks, nodes=nodes, corruption="shift", metric=metric, direction=direction,
                                       min_signal=0, rows_per_forward=4)
        assert seen[3][:2] == [4 * 12, 4 * 13]  # the two cached runs, whole
        assert seen[3][2:] and all(n == 4 for n in seen[3][2:]), (direction, seen[3])  # one position a prompt
        assert len(seen[3]) == 2 + 4  # a forward per node at P0 (rows_per_forward=4: a group each; M0 skips block 0)
        base = fast.clean_metric if direction == "noise" else fast.corrupted_metric
        assert all(fast.raw[n] == base for n in nodes[4:])  # after P0: the base run's value, no forward
        assert any(abs(fast.raw[n] - base) > 1e-3 for n in nodes[:4])
        slow = p0.activation_patch(model, toks, nodes=nodes, corruption="shift", metric=metric, direction=direction,
                                   min_signal=0, reference=True)
        assert results_close(fast, slow), direction


def test_a_pattern_metric_read_at_p0_equals_plain_hooks(planted):
    """A metric that reads an attention pattern and declares P0 as its last position: the query
    axis and the key axis are both cut at P0 and filled back (NaN queries, 0 keys). Its values,
    in the denoise direction (P0 at 1, so the patched forward runs one position after a cached
    prefix), equal a hand-written patch with plain TransformerLens hooks on whole prompts."""
    model = planted.model

    class P0Row(p0.PatchMetric):
        name = "pattern_row_at_p0"

        def needs(self, n_layers):
            return [p0.hooks.HookRef(2, p0.hooks.pattern(2))]

        def __call__(self, view):
            row = view.acts[p0.hooks.pattern(2)][:, :, view.p0]  # [batch, head, key]
            return (row[:, :, : view.p0 + 1] * torch.arange(1, view.p0 + 2)).sum(-1).mean() + row.sum(-1).mean()

        def last_position(self, p0_index):
            return p0_index

    toks = random_tokens(4, 12, 32, seed=9)
    shifted = torch.cat([torch.full_like(toks[:, :1], 7), toks], dim=1)
    nodes = ["A0.H0@0", "A0.H1@0", "M0@0", "A1.H0@0", "M1@rest"]
    fast = p0.activation_patch(model, toks, nodes=nodes, corruption=p0.Shift(filler=(7,)), metric=P0Row(),
                               direction="denoise", min_signal=0)
    _, clean = model.run_with_cache(toks)
    for node in nodes:
        comp, pos = node.split("@")
        layer = int(comp[1])
        name = f"blocks.{layer}.attn.hook_z" if ".H" in comp else f"blocks.{layer}.hook_mlp_out"
        at = [1] if pos == "0" else list(range(2, 13))
        value = clean[name][:, [p - 1 for p in at]]
        head = int(comp.split(".H")[1]) if ".H" in comp else None
        got = {}

        def patch(act, hook, value=value, head=head, at=at):
            if head is None:
                act[:, at] = value
            else:
                act[:, at, head] = value[:, :, head]
            return act

        def grab(act, hook):
            got["p"] = act

        with torch.no_grad():
            model.run_with_hooks(shifted, fwd_hooks=[(name, patch), ("blocks.2.attn.hook_pattern", grab)])
        row = got["p"][:, :, 1]
        plain = float(((row[:, :, :2] * torch.arange(1, 3)).sum(-1).mean() + row.sum(-1).mean()))
        assert close(fast.raw[node], plain, fast.clean_metric), (node, fast.raw[node], plain)


def test_a_metric_that_reads_past_its_last_position_is_refused(planted):
    """A metric that declares P0 but averages every position would get NaN (or the base value) from
    the shortened forwards: refused before any patched forward, with the fix."""

    class Lying(p0.ResidDim):
        def __call__(self, view):
            return view.acts[p0.hooks.resid_post(self.layer)][:, view.p0:, self.dim].float().mean()

    class Negative(p0.ResidDim):
        def last_position(self, p0_index):
            return -1

    toks = random_tokens(4, 12, 32, seed=9)
    with pytest.raises(p0.BadInputError, match=r"last_position\(0\) says it reads positions up to 0 only.*return None"):
        p0.activation_patch(planted.model, toks, nodes=["M1@0"], corruption="shift", metric=Lying(3, 69))
    with pytest.raises(p0.BadInputError, match=r"last_position\(0\) returned -1; it must be None"):
        p0.activation_patch(planted.model, toks, nodes=["M1@0"], corruption="shift", metric=Negative(3, 69))


def test_patches_that_cannot_reach_the_metric_are_not_run(planted):
    """NormRatio(1) reads block 1's output: blocks 2-3 never run (not even in the cached runs), their
    nodes get an effect of exactly 0, and the result equals the reference path that runs them all."""
    model = planted.model
    with _rows_into(model, (1, 2, 3)) as (calls, _):
        toks = random_tokens(4, 12, 32, seed=3)
        fast = p0.activation_patch(model, toks, corruption="shift", metric=p0.NormRatio(1))
        seen = dict(calls)
        edges = p0.path_patch(model, toks, edges=["M0@0->M1@0.mlp_in", "M0@0->A2.H0@0.k", "M1@0->A3.H1@0.q"],
                              corruption="shift", metric=p0.NormRatio(1))
        assert calls[2] == calls[3] == 0
    assert seen[2] == seen[3] == 0 and seen[1] > 0
    late = [n for n in fast.names if n.startswith(("A2", "A3", "M2", "M3"))]
    assert len(late) == 12 and fast.settings["unreachable"] == 12  # 2 heads + 1 MLP, 2 layers, 2 positions
    assert all(fast.normalized[n] == 0.0 and fast.raw[n] == fast.clean_metric for n in late)
    slow = p0.activation_patch(model, toks, corruption="shift", metric=p0.NormRatio(1), reference=True)
    assert all(slow.normalized[n] == 0.0 for n in late)  # the reference runs them: truly no effect
    assert results_close(fast, slow)
    assert edges.normalized["M0@0->A2.H0@0.k"] == 0.0 and edges.normalized["M0@0->M1@0.mlp_in"] > 0.5


def test_heads_of_the_metric_block_cannot_reach_its_pattern(planted):
    """AttnToP0 at layer 2 reads block 2's attention pattern, which block 2's own head outputs and
    MLP come after: they are not run; layer-1 nodes are."""
    toks = random_tokens(4, 12, 32, seed=4)
    metric = p0.AttnToP0(heads=[(2, 0)])
    nodes = ["A1.H0@0", "M1@0", "A2.H0@0", "A2.H1@0", "M2@0"]
    fast = p0.activation_patch(planted.model, toks, nodes=nodes, corruption="shift", metric=metric)
    slow = p0.activation_patch(planted.model, toks, nodes=nodes, corruption="shift", metric=metric, reference=True)
    assert fast.settings["unreachable"] == 3 and slow.settings["unreachable"] == 0
    assert fast.normalized == slow.normalized or results_close(fast, slow)
    assert abs(fast.normalized["M1@0"]) > 0.5


@pytest.mark.parametrize("metric", [p0.NormRatio(1), p0.LogitMetric(logit_diff)], ids=["norm", "logits"])
def test_skipped_blocks_batch_mixed_positions(generic, metric):
    """The patched block's output is computed for a whole layer at once (heads at one position,
    at several, at the rest of the positions, MLPs among them): equal to running each patch in full."""
    toks = random_tokens(3, 10, 50, seed=8)
    nodes = [Node(Kind.HEAD, l, h, p) for l in range(2) for h in range(4) for p in (0, 3, "rest")]
    nodes += [Node(Kind.MLP, l, pos=p) for l in range(2) for p in (0, 5, "rest")]
    kw = dict(nodes=nodes, corruption=Resample(), metric=metric, min_signal=0)
    fast = p0.activation_patch(generic, toks, rows_per_forward=7, **kw)
    slow = p0.activation_patch(generic, toks, reference=True, **kw)
    assert results_close(fast, slow)
    assert max(abs(v) for v in fast.raw.values()) > 1e-3  # the patches do something


def test_a_forward_ends_at_the_metric_s_last_read(planted):
    """A metric that reads an attention pattern (the sink heads' attention to P0 in block 2) needs nothing after it:
    the fast path's patched forwards stop there, so block 2's MLP runs only in the clean and corrupted runs that are
    cached whole, never in a patched forward, while its attention runs in each; the values equal the reference path's
    full forwards with ordinary hooks."""
    model = planted.model
    toks = random_tokens(4, 12, model.cfg.d_vocab, seed=5)
    metric = p0.AttnToP0(heads=[(2, 0), (2, 1)])
    calls = {"attn": 0, "mlp": 0}
    for part in calls:
        def forward(*args, _f=getattr(model.blocks[2], part).forward, _p=part, **kw):
            calls[_p] += 1
            return _f(*args, **kw)
        getattr(model.blocks[2], part).forward = forward
    try:
        fast = p0.activation_patch(model, toks, corruption=Shift(1), metric=metric, min_signal=0)
    finally:
        for part in calls:
            del getattr(model.blocks[2], part).forward
    assert calls["mlp"] <= 2 < calls["attn"]  # the cached clean and corrupted runs only
    slow = p0.activation_patch(model, toks, corruption=Shift(1), metric=metric, min_signal=0, reference=True)
    assert results_close(fast, slow)
