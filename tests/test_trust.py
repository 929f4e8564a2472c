"""Issue 30: one test per silent bug and per held-out input it names, each failing on the code before
the fix. The numbers are held to the oracle (``tests/oracle.py``, plain TransformerLens hooks)."""

import math
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import oracle as O
import p0circuit as p0
from p0circuit.patching.edges import candidate_edges
from p0circuit.core.plugins import load_plugin
from p0circuit.core.types import Kind, Node
from tolerance import close

TOKENS = torch.randint(8, 24, (3, 7), generator=torch.Generator().manual_seed(21))


def tiny(**kw):
    cfg = dict(n_layers=3, d_model=16, n_heads=4, d_head=4, d_mlp=16, d_vocab=24, n_ctx=16, act_fn="gelu", seed=0,
               normalization_type="RMS", positional_embedding_type="rotary", default_prepend_bos=False)
    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    return model


def weighted_mean(act, p0_=0):
    """A mean weighted along the last axis (plain means and norms of softmax outputs, routing weights
    and normalized vectors are constant); masked attention scores (-inf) count as 0."""
    act = act.float()
    act = torch.where(torch.isfinite(act), act, torch.zeros_like(act))
    return (act * torch.linspace(-1.0, 2.0, act.shape[-1])).mean()


def three_ways(model, nodes, hook, layer, corruption="shift"):
    """fast, reference and oracle raw values of ``nodes`` under a CacheMetric on ``hook``."""
    metric = p0.CacheMetric(lambda acts, at: weighted_mean(acts[hook]), [(layer, hook)], label=hook)
    corr, oc = (p0.Shift(filler=(O.FILLER,)), O.Corr("shift")) if corruption == "shift" else (p0.Zero(), O.Corr("zero"))
    kw = dict(nodes=nodes, corruption=corr, metric=metric, min_signal=0)
    fast = p0.activation_patch(model, TOKENS, **kw)
    slow = p0.activation_patch(model, TOKENS, reference=True, **kw)
    plain = O.activation(model, TOKENS, nodes, oc, O.Metric("cache", hook=hook, fn=weighted_mean))
    return fast, slow, plain


@pytest.mark.parametrize("hook, layer, kw", [
    ("blocks.1.mlp.hook_expert_weights", 1, dict(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu")),
    ("blocks.1.mlp.experts.2.hook_pre", 1, dict(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu")),
    ("blocks.1.ln1_post.hook_normalized", 1, dict(use_normalization_before_and_after=True)),
    ("blocks.1.ln2_post.hook_scale", 1, dict(use_normalization_before_and_after=True)),
    ("blocks.2.attn.hook_rot_k", 2, {}),
    ("ln_final.hook_normalized", 3, {}),
    ("hook_pos_embed", -1, dict(positional_embedding_type="standard")),
], ids=["expert_weights", "expert_hook", "ln1_post", "ln2_post", "rotary_keys", "ln_final", "pos_embed"])
def test_a_metric_on_any_hook_is_reached_in_forward_order(hook, layer, kw):
    """Bug: a hook missing from a hand-kept table of names counted as the start of its block, so a
    patch earlier in the block 'could not reach' it and got the clean value (A1.H0@0: 0.264448 fast,
    0.233433 reference on a mixture of experts). Rotary keys, which TransformerLens rotates after the
    cached prefix is appended, were read as if they held only the suffix."""
    model = tiny(**kw)
    nodes = ["A1.H0@0", "A1.H2@rest", "A0.H1@0", "M0@0"] + (["M1.E1@0"] if "num_experts" in kw else [])
    if layer < 0:  # a metric on an embedding: the embeddings' own patches reach it, nothing later does
        nodes = ["PE@0", "PE@rest", "E@0", "A0.H1@0"]
    fast, slow, plain = three_ways(model, nodes, hook, layer)
    for n in nodes:
        assert close(fast.raw[n], plain[n]) and close(slow.raw[n], plain[n]), (n, fast.raw[n], slow.raw[n], plain[n])
    assert any(not close(fast.raw[n], fast.clean_metric, rel=1e-6) for n in nodes)  # something reaches it
    unchanged = sum(1 for n in nodes if close(plain[n], fast.clean_metric, rel=0))
    assert 0 < fast.settings["unreachable"] <= unchanged or fast.settings["unreachable"] == unchanged == 0


def test_the_reference_path_of_an_ablation_is_its_own():
    """Bug: under an ablation the reference path took its fully corrupted reference from the fast
    engine, which crashed (KeyError) when the skipped block's output was not read by the metric."""
    model = tiny()
    metric = p0.AttnToP0(heads=[(0, 3), (1, 0), (2, 0)])
    for reference in (False, True):
        result = p0.activation_patch(model, TOKENS, nodes=["A2.H0@1", "A0.H1@0"], corruption="zero", metric=metric,
                                     min_signal=0, reference=reference)
        want = O.together(model, TOKENS, ["A2.H0@1", "A0.H1@0"], O.Corr("zero"),
                          O.Metric("attn_to_p0", heads=((0, 3), (1, 0), (2, 0))))
        assert close(result.corrupted_metric, want), (reference, result.corrupted_metric, want)


def test_a_suffix_forward_without_norms_runs():
    """Bug: a suffix forward gave TransformerLens a non-contiguous slice of the residual stream, which
    its affine map cannot view (a RuntimeError from inside torch) in models without norms."""
    model = tiny(normalization_type=None, parallel_attn_mlp=True, n_key_value_heads=1)
    nodes = ["M0.N1@rest", "M1.N6@rest"]
    gap = lambda logits: (logits[:, -1, 6] - logits[:, -1, 4]).mean()  # noqa: E731
    got = p0.activation_patch(model, TOKENS, nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)),
                              metric=p0.LogitMetric(gap), min_signal=0)
    plain = O.activation(model, TOKENS, nodes, O.Corr("shift"), O.Metric("logits", fn=gap))
    with torch.no_grad():
        scale = float(model(TOKENS).abs().max())
    assert all(close(got.raw[n], plain[n], scale=scale) for n in nodes)


def test_key_value_edges_survive_narrowed_candidates():
    """Bug: narrowing the candidates (--layers, --nodes, --positions each, nodes=) kept only edges whose
    receiver was a listed node, and key/value heads never are: 120 key/value edges became 0."""
    from p0circuit.patching.edges import among

    model = p0.ModelSpec(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=24,
                         n_kv_heads=2).build()
    nodes = [n for n in p0.candidate_nodes(model) if n.layer <= 1]
    every = candidate_edges(model, nodes, receiver_layers=2)
    kept = among(model, every, nodes)
    kv = [e for e in kept if e.dst.kind == Kind.KV_HEAD]
    assert kv and len(kv) == len([e for e in every if e.dst.kind == Kind.KV_HEAD])
    one_head = among(model, every, [Node(Kind.HEAD, 1, 3, 0)])  # A1.H3 shares A1.KV1 with A1.H2
    assert {e.dst.name for e in one_head} == {"A1.H3@0", "A1.KV1@0"}
    from p0circuit.studies.discovery.session import run_discovery
    from p0circuit.models.resolve import Resolved

    toks = p0.probe_tokens(model, 4, 10, seed=0)
    found = run_discovery(Resolved("spec", model, "gqa"), toks, methods=["path"], corruption="shift", metric=p0.NormRatio(1),
                                       nodes=nodes)
    names = found.circuits["path"].edge_effects
    assert any(".KV" in n for n in names), "key/value edges are candidates"


def test_triage_normalizes_against_every_candidate(planted):
    """Bug: under an ablation triage built its fully corrupted reference from the top and sampled
    nodes only (1.5934 against activation patching's 1.0142 on the plant with zero)."""
    from p0circuit.patching.methods.triage import triage_patch

    toks = p0.regular_prompts(torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0)))
    for corruption in ("zero", "pos_mean"):
        exact = p0.activation_patch(planted.model, toks, corruption=corruption, metric=p0.NormRatio(1), min_signal=0)
        tri = triage_patch(planted.model, toks, corruption=corruption, metric=p0.NormRatio(1), top=3, sample=2,
                           min_signal=0)
        assert close(tri.corrupted_metric, exact.corrupted_metric), corruption
        for n, v in tri.normalized.items():
            if v == v and n in exact.normalized:
                assert close(v, exact.normalized[n]), (corruption, n)


def test_direct_edges_into_the_metric_equal_plain_hooks():
    """Issue 29, item 4: each sender's direct edge into what the metric reads (``S->R2@0.resid``)."""
    model = tiny(n_key_value_heads=2)
    metric = p0.NormRatio(2)
    edges = [e.name for e in candidate_edges(model, [Node.parse(n) for n in ("A1.H2@0", "M0@0", "M2@rest")],
                                             metric=metric) if e.input.value == "resid"]
    assert sorted(edges) == ["A1.H2@0->R2@0.resid", "M0@0->R2@0.resid", "M2@rest->R2@rest.resid"]
    for direction in ("noise", "denoise"):
        kw = dict(edges=edges, corruption=p0.Shift(filler=(O.FILLER,)), metric=metric, direction=direction, min_signal=0)
        fast, slow = p0.path_patch(model, TOKENS, **kw), p0.path_patch(model, TOKENS, reference=True, **kw)
        plain = O.path(model, TOKENS, edges, O.Corr("shift"), O.Metric("norm_ratio", layer=2), direction)
        for e in edges:
            assert close(fast.raw[e], plain[e]) and close(slow.raw[e], plain[e]), (direction, e)
    default = p0.path_patch(model, TOKENS, corruption="shift", metric=metric)
    assert set(edges) <= set(default.raw)


def test_results_carry_every_parameter_and_comparisons_match_on_them(planted):
    """Bug: Shift.params() dropped ``filler`` and faithfulness_curve compared only names."""
    toks = p0.regular_prompts(torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0)))
    result = p0.activation_patch(planted.model, toks, corruption=p0.Shift(filler=(7,)), metric=p0.NormRatio(1))
    assert result.settings["corruption_params"]["filler"] == [7]
    assert result.settings["metric_params"] == {"layer": 1, "pos": 0, "where": ""}
    p0.faithfulness_curve(result, setup=p0.Setup.of(planted.model, toks, corruption=p0.Shift(filler=(7,)),
                                                    metric=p0.NormRatio(1)))
    with pytest.raises(p0.BadInputError, match="corruption_params"):
        p0.faithfulness_curve(result, setup=p0.Setup.of(planted.model, toks, corruption=p0.Shift(filler=(9,)),
                                                        metric=p0.NormRatio(1)))
    with pytest.raises(p0.BadInputError, match="metric"):
        p0.faithfulness_curve(result, setup=p0.Setup.of(planted.model, toks, corruption=p0.Shift(filler=(7,)),
                                                        metric=p0.NormRatio(1, pos=1)))
    resample = p0.Resample(tokens=toks.roll(1, 0)).params()["tokens"]
    assert resample["tensor"] == list(toks.shape) and len(resample["sha256"]) == 16


def test_held_out_inputs_are_refused_before_any_work(planted, tmp_path, monkeypatch):
    toks = p0.regular_prompts(torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(0)))
    from p0circuit.patching.methods import attribution

    def no_work(*a, **k):
        raise AssertionError("integrated gradients ran before the refusal")

    monkeypatch.setattr(attribution, "_integrated_gradients", no_work)
    with pytest.raises(p0.BadInputError, match="steps=10000000 is more than"):  # refused, not run (hours)
        p0.attribution_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(1), steps=10**7)
    result = p0.activation_patch(planted.model, toks, corruption="shift", metric=p0.NormRatio(1))
    for bad, match in ((dict(top=0), "top=0"), (dict(top=-1), "top=-1"), (dict(ax="a"), "ax='a'")):
        with pytest.raises(p0.BadInputError, match=match):
            p0.plot(result, **bad)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    assert p0.plot(result, ax=list(axes)) is fig
    plt.close(fig)
    no_bos = tiny()
    with pytest.raises(p0.BadInputError, match="no BOS token"):
        p0.activation_patch(no_bos, TOKENS, nodes=["M0@0"], corruption="shift", metric=p0.NormRatio(1), bos=True)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "config.json").write_text("{}")
    with pytest.raises(p0.P0CircuitError, match="is a file, not a checkpoint.*give the directory"):
        p0.load_model(f"checkpoint:{folder / 'model.safetensors'}")
    with pytest.raises(p0.CheckpointError, match="is a directory, not a GGUF file"):
        p0.load_gguf(folder)
    with pytest.raises(p0.P0CircuitError, match="not in the local Hugging Face cache"):
        p0.load_model("hub:gpt2")


def _cli(*args, cwd):
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "p0circuit", *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    return out, time.perf_counter() - started


def test_plugin_errors_are_one_line_naming_the_file_and_line(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("x = (\n")
    raising = tmp_path / "raising.py"
    raising.write_text(textwrap.dedent("""
        import os
        raise RuntimeError("the plugin's own error")
    """))
    with pytest.raises(p0.ConfigError, match=r"does not parse: .*broken\.py, line 1"):
        load_plugin(str(broken))
    with pytest.raises(p0.ConfigError, match=r"raised RuntimeError at .*raising\.py, line 3: the plugin's own error"):
        load_plugin(str(raising))
    for args in (["--plugin", str(raising), "discover"], ["discover", "--plugin", str(raising)]):
        out, _ = _cli(*args, cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0 and "raising.py, line 3" in out.stderr, out.stderr
    config = tmp_path / "sweep.toml"
    config.write_text(f'[sweep]\nmodels = ["planted:rope"]\nmethods = ["activation"]\nplugins = ["{raising}"]\n')
    out, _ = _cli("sweep", str(config), "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "raising.py, line 3" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_nonexistent_checkpoint_is_refused_before_anything_is_read(tmp_path, monkeypatch, capsys):
    import transformers

    from p0circuit.surfaces.cli import main

    def read(*args, **kwargs):
        raise AssertionError("a missing checkpoint reached transformers")

    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", read)
    monkeypatch.setattr(HookedTransformer, "__init__", read)
    assert main(["discover", "--model", f"checkpoint:{tmp_path / 'nope'}", "--out", str(tmp_path / "o")]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_hook_that_did_not_fire_is_ordered_by_its_enclosing_module():
    """A hook the traced forward did not reach (an expert no token was routed to; an input hook whose
    flag cannot be set) takes the span of the hooks that fired under its nearest enclosing module:
    never later than it could write, never earlier than it could be read."""
    from p0circuit.patching.order import hook_order

    order = hook_order(tiny(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu"))
    inside = [n for n in order.first if n.startswith("blocks.1.mlp.experts.")]
    assert inside, "the experts' hooks fired in the trace"
    want = (min(order.first[n] for n in inside), max(order.last[n] for n in inside))
    assert order.span("blocks.1.mlp.experts.9.hook_post") == want  # no expert 9: as if it had not fired
    assert order.can_change("blocks.1.attn.hook_z", "blocks.1.mlp.experts.9.hook_post")
    assert order.can_change("blocks.1.mlp.experts.9.hook_post", "blocks.1.hook_mlp_out")
    assert not order.can_change("blocks.1.hook_mlp_out", "blocks.1.mlp.experts.9.hook_post")
    assert order.span("nothing.like.it") == (0, order.size)


def test_a_metric_on_an_embedding_and_a_block_sees_the_embedding_patch():
    """The fast path folds an embedding patch into block 0's input; a metric that also reads the
    embedding hook itself must see it patched there (a metric on the embedding alone runs no block)."""
    model = tiny(positional_embedding_type="standard")
    names = ["hook_pos_embed", "blocks.1.hook_resid_post"]

    def both(acts, at):
        return weighted_mean(acts[names[0]]) + weighted_mean(acts[names[1]])

    metric = p0.CacheMetric(both, [(-1, names[0]), (1, names[1])], label="embedding and block 1")
    nodes = ["PE@0", "PE@rest", "E@1", "A0.H2@0"]
    fast = p0.activation_patch(model, TOKENS, nodes=nodes, corruption=p0.Shift(filler=(O.FILLER,)), metric=metric,
                               min_signal=0)
    got = {}
    for name in names:
        got[name] = O.activation(model, TOKENS, nodes, O.Corr("shift"), O.Metric("cache", hook=name, fn=weighted_mean))
    for n in nodes:
        assert close(fast.raw[n], got[names[0]][n] + got[names[1]][n]), n


def test_experts_in_both_directions_equal_plain_hooks(user_corruption):
    model = tiny(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu")
    nodes = ["M1.E0@0", "M1.E3@rest", "M0.E2@0", "M2.E1@1"]
    for corruption, oc in ((p0.Shift(filler=(O.FILLER,)), O.Corr("shift")),
                           (user_corruption(), O.Corr("swap_first_two"))):
        for direction in ("noise", "denoise"):
            kw = dict(nodes=nodes, corruption=corruption, metric=p0.NormRatio(2), direction=direction, min_signal=0)
            fast, slow = p0.activation_patch(model, TOKENS, **kw), p0.activation_patch(model, TOKENS, reference=True, **kw)
            plain = O.activation(model, TOKENS, nodes, oc, O.Metric("norm_ratio", layer=2), direction)
            for n in nodes:
                assert close(fast.raw[n], plain[n]) and close(slow.raw[n], plain[n]), (corruption.name, direction, n)


def test_the_reference_path_never_runs_the_fast_engine(monkeypatch):
    """``reference=True`` is the independent slow path: under an ablation its fully corrupted
    reference is an ordinary hooked forward too, not the fast engine it is compared with."""
    from p0circuit.patching import engine, job

    def refuse(*args, **kwargs):
        raise AssertionError("the fast engine ran on the reference path")

    monkeypatch.setattr(engine, "run_groups", refuse)
    monkeypatch.setattr(job, "run_groups", refuse)
    for method, what in ((p0.activation_patch, dict(nodes=["A1.H0@0", "M0@rest"])),
                         (p0.path_patch, dict(edges=["M0@0->A1.H2@0.q", "A0.H1@0->R2@0.resid"]))):
        method(tiny(), TOKENS, corruption="pos_mean", metric=p0.NormRatio(2), reference=True, min_signal=0, **what)


def test_a_metric_inside_a_receivers_normalization_is_refused():
    """Found by the long differential run: a metric on ``blocks.1.ln1.hook_scale`` with an edge into one
    head's value input of block 1 has no single patched value (TransformerLens computes the scale per
    head and input and keeps the last), and the fast path and the oracle answered differently. It is
    refused, for path and attribution edges, before any forward; an MLP-input edge there is answered."""
    model = tiny(n_layers=2)
    hook = "blocks.1.ln1.hook_scale"
    metric = p0.CacheMetric(lambda acts, at: weighted_mean(acts[hook]), [(1, hook)], label="ln1 scale")
    for fn in (p0.path_patch, lambda *a, **k: p0.attribution_patch(*a, level="edge", **k)):
        with pytest.raises(p0.ConfigError, match=r"reads blocks\.1\.ln1\.hook_scale, the normalized attention input inside block 1"):
            fn(model, TOKENS, edges=["E@1->A1.H3@1.v"], corruption="shift", metric=metric)
    split = tiny(n_layers=2, use_split_qkv_input=True)  # found by the review: the key input itself
    key_in = p0.CacheMetric(lambda acts, at: weighted_mean(acts["blocks.1.hook_k_input"]),
                            [(1, "blocks.1.hook_k_input")], label="k input")
    with pytest.raises(p0.ConfigError, match=r"reads blocks\.1\.hook_k_input"):
        p0.path_patch(split, TOKENS, edges=["M0@0->A1.H0@0.k"], corruption="shift", metric=key_in)
    metric = p0.CacheMetric(lambda acts, at: weighted_mean(acts[hook]), [(1, hook)], label="ln1 scale")
    fast = p0.path_patch(model, TOKENS, edges=["A0.H1@0->M0@0.mlp_in"], corruption=p0.Shift(filler=(O.FILLER,)),
                         metric=metric, min_signal=0)
    plain = O.path(model, TOKENS, ["A0.H1@0->M0@0.mlp_in"], O.Corr("shift"), O.Metric("cache", hook=hook, fn=weighted_mean))
    assert close(fast.raw["A0.H1@0->M0@0.mlp_in"], plain["A0.H1@0->M0@0.mlp_in"])


def test_metrics_of_one_line_that_capture_other_values_are_told_apart():
    """Found by the review: a function was described by its file and line only, so two metrics made by
    one lambda with other captured values (other logit ids) compared equal."""
    def logit_of(token):
        return p0.LogitMetric(lambda logits, at: logits[:, -1, token].mean(), label="logit")

    assert logit_of(3).params() != logit_of(4).params()
    assert logit_of(3).params() == logit_of(3).params()


def test_a_search_on_a_triage_result_corrupts_the_nodes_it_left_unexamined():
    """Bug: triage leaves every node outside its top and sample NaN, and the circuit search and the
    faithfulness curve dropped NaN nodes from their candidates, so those stayed clean in every evaluation
    and the circuit's faithfulness counted their work. Held to plain hooks that corrupt every candidate
    outside the circuit."""
    from p0circuit.patching.methods.triage import triage_patch

    model, metric, corr = tiny(), p0.NormRatio(2), p0.Shift(filler=(O.FILLER,))
    nodes = [n.name for n in p0.candidate_nodes(model) if n.layer <= 2]
    tri = triage_patch(model, TOKENS, nodes=nodes, corruption=corr, metric=metric, top=4, sample=2, min_signal=0)
    unexamined = [n for n, v in tri.normalized.items() if v != v]
    assert len(unexamined) > len(nodes) // 2 and set(tri.settings["estimates"]) >= set(unexamined)
    om, named = O.Metric("norm_ratio", layer=2), O.named_of(nodes)
    gap = tri.clean_metric - tri.corrupted_metric
    found = p0.faithful_circuit(tri, target=0.6, tolerance=0.3).search
    rest = [n for n in nodes if n not in found.nodes]
    assert set(rest) & set(unexamined), "some unexamined node is outside the circuit"
    assert close(O.together(model, TOKENS, rest, O.Corr("shift"), om, named),
                 tri.corrupted_metric + found.faithfulness * gap, tri.clean_metric), found
    strength = tri.strengths()
    top = sorted(nodes, key=lambda n: -strength[n])[:3]
    (_, kept, share), = p0.faithfulness_curve(tri, fractions=[3 / len(nodes)])
    assert kept == 3
    plain = O.together(model, TOKENS, [n for n in nodes if n not in top], O.Corr("shift"), om, named)
    assert close(plain, tri.corrupted_metric + share * gap, tri.clean_metric)


def test_integrated_gradients_start_at_the_hooks_block(monkeypatch):
    """Each integrated-gradient forward for a hook in block 2 starts there, from the cached input to it
    (``start_at_layer``): with more steps block 2 runs once more per step and block 0 no more often (it runs
    in the clean and corrupted runs only). (The values are checked against plain autograd on every family
    in test_families.)"""
    model = p0.build_planted(n_layers=6, circuit_layer=2).model  # its own: the blocks' forward is wrapped below
    toks = torch.randint(3, model.cfg.d_vocab, (4, 12), generator=torch.Generator().manual_seed(0))
    runs = {0: 0, 2: 0}
    for b in runs:  # counted by wrapping the blocks' forward (a torch hook would be refused: the fast path skips work)
        real = model.blocks[b].forward

        def counted(*args, b=b, real=real, **kwargs):
            runs[b] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(model.blocks[b], "forward", counted)
    seen = {}
    for steps in (3, 3, 6):  # the first call also checks the model once (p0circuit.models.checks)
        runs.update({0: 0, 2: 0})
        p0.attribution_patch(model, toks, nodes=["M2@0"], corruption="shift", metric=p0.NormRatio(3), min_signal=0,
                             steps=steps)
        seen[steps] = dict(runs)
    assert seen[6][2] - seen[3][2] == 3 and seen[6][0] == seen[3][0] <= 2, seen


@pytest.mark.parametrize("corruption,direction", [("shift", "noise"), ("shift", "denoise"), ("pos_mean", "noise")])
def test_neuron_ops_share_one_value_per_hook(planted, monkeypatch, corruption, direction):
    """Every neuron of an MLP at P0 is patched from one shared ``[batch, 1, d_mlp]`` value (each op a view
    of it), not a copy per neuron: with a copy each, the analysis' neuron screen of Llama-3.2-1B's width
    (32,768 neurons) held 8.6 GB more than the model (docs/performance.md)."""
    from p0circuit.patching import ops as patch_ops
    from p0circuit.patching.methods import activation

    made = []

    def recorded(*args, **kwargs):
        made.append(patch_ops.node_op(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(activation, "node_op", recorded)
    model = planted.model
    toks = torch.randint(3, model.cfg.d_vocab, (4, 10), generator=torch.Generator().manual_seed(0))
    neurons = p0.candidate_neurons(model, [0, 1], positions=(0,))
    p0.activation_patch(model, toks, nodes=neurons, corruption=corruption, metric=p0.NormRatio(1), direction=direction,
                        min_signal=0)
    ops = made[:len(neurons)]
    storages = {op.value.untyped_storage().data_ptr() for op in ops}
    assert len(ops) == len(neurons) > 2 * 8 and len(storages) == 2, (len(ops), len(storages))  # one per MLP


def test_triage_patches_included_nodes_exactly_whatever_their_estimate(planted):
    """``include``: nodes known from another pass are patched exactly even when attribution ranks them last; the
    exact value is activation patching's; a node that is not a candidate is refused before any work."""
    from p0circuit.patching.methods.triage import triage_patch

    toks = p0.regular_prompts(torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0)))
    kw = dict(corruption="shift", metric=p0.NormRatio(1), min_signal=0)
    plain = triage_patch(planted.model, toks, top=1, sample=0, **kw)
    last = min((n for n, v in plain.settings["estimates"].items() if math.isnan(plain.normalized[n])),
               key=lambda n: abs(plain.settings["estimates"][n]))  # the weakest estimate: unexamined without include
    tri = triage_patch(planted.model, toks, top=1, sample=0, include=[last], **kw)
    exact = p0.activation_patch(planted.model, toks, **kw)
    assert tri.settings["triage"]["included"] == 1 and close(tri.normalized[last], exact.normalized[last])
    assert tri.settings["triage"]["unexamined"] == plain.settings["triage"]["unexamined"] - 1
    with pytest.raises(p0.BadInputError, match="not among the candidates"):
        triage_patch(planted.model, toks, nodes=["M0@0", "M1@0"], top=1, sample=0, include=["A0.H0@0"], **kw)


def test_triage_with_a_floor_patches_the_strong_estimates_and_at_least_least(planted):
    """``floor``/``least``: of the ``top`` by estimate, the ``least`` strongest are patched exactly whatever they say,
    the next only at |normalized estimate| >= ``floor``; what is patched equals activation patching's value and plain
    TransformerLens hooks'; (0, 0) patches the whole ``top``; bad values are refused before any work."""
    from p0circuit.patching.methods.triage import triage_patch

    toks = p0.regular_prompts(torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0)))
    kw = dict(corruption="shift", metric=p0.NormRatio(1), min_signal=0)
    every = triage_patch(planted.model, toks, top=8, sample=0, **kw)
    unreachable = {n for n, v in triage_patch(planted.model, toks, top=0, sample=0, **kw).normalized.items() if v == v}
    est = every.settings["estimates"]

    def patched_by(result):
        return {n for n, v in result.normalized.items() if v == v} - unreachable
    ranked = sorted(patched_by(every), key=lambda n: -abs(est[n]))
    assert len(ranked) == 8 and every.settings["triage"]["exact_top"] == 8
    assert min(abs(est[n]) for n in ranked) >= max(abs(v) for n, v in est.items() if n not in ranked and n not in unreachable)
    floor = (abs(est[ranked[4]]) + abs(est[ranked[5]])) / 2  # five estimates above it
    assert abs(est[ranked[4]]) > floor > abs(est[ranked[5]])
    for least, patched in ((2, 5), (7, 7), (0, 5)):
        tri = triage_patch(planted.model, toks, top=8, sample=0, floor=floor, least=least, **kw)
        exact = patched_by(tri)
        assert exact == set(ranked[:patched]) and tri.settings["triage"]["exact_top"] == patched, least
        assert tri.settings["floor"] == floor and tri.settings["least"] == least
        for n in exact:
            assert tri.normalized[n] == every.normalized[n]
    full = p0.activation_patch(planted.model, toks, **kw)
    one = ranked[0]
    clean, corrupted = full.clean_metric, full.corrupted_metric
    plain = O.together(planted.model, toks, [one], O.Corr("shift"), O.Metric("norm_ratio", layer=1),
                       O.named_of(list(full.raw)))
    assert close(every.normalized[one], (clean - plain) / (clean - corrupted)) and close(every.normalized[one],
                                                                                         full.normalized[one])
    for name, bad in (("floor", -0.1), ("floor", float("inf")), ("floor", True), ("floor", "0.1"), ("least", -1),
                      ("least", 1.5), ("least", True), ("least", 9)):  # 9: more than top
        with pytest.raises(p0.BadInputError, match=f"{name}(=| must be)"):
            triage_patch(planted.model, toks, top=8, sample=0, **{name: bad}, **kw)


def test_triage_with_a_floor_and_no_signal_patches_only_the_least(planted):
    """Without a signal (the call's ``min_signal``) the estimates divide by next to nothing: a floor leaves only the
    ``least`` strongest to exact patching and draws no sample, where without one the whole ``top`` and the sample are
    patched."""
    from p0circuit.patching.methods.triage import triage_patch

    toks = p0.regular_prompts(torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0)))
    kw = dict(corruption="shift", metric=p0.NormRatio(1), min_signal=0.999)  # no change is this large
    assert not triage_patch(planted.model, toks, top=8, sample=0, **kw).signal
    tri = triage_patch(planted.model, toks, top=8, sample=4, floor=1e-9, least=3, **kw)
    assert tri.settings["triage"]["exact_top"] == 3 and tri.settings["triage"]["sampled"] == 0
    every = triage_patch(planted.model, toks, top=8, sample=4, **kw).settings["triage"]
    assert every["exact_top"] == 8 and every["sampled"] == 4
