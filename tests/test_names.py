"""Names a researcher types: metrics by name as corruptions are, the nearest valid name for a
mistyped one, the command line's checks before any model is built, and no third-party noise."""

import pytest

import p0circuit as p0
from p0circuit.surfaces.cli import main
from p0circuit.core import entries
from p0circuit.models import resolve
from tolerance import close


@pytest.fixture(scope="module")
def setup():
    pm = p0.build_planted()
    return pm, p0.probe_tokens(pm.model, 6, 10, regular=True)


def test_a_metric_by_name_equals_the_metric_object(setup):
    pm, toks = setup
    by_name = p0.activation_patch(pm.model, toks, metric="norm_ratio:1")
    by_object = p0.activation_patch(pm.model, toks, metric=p0.NormRatio(1))
    assert by_name.metric == by_object.metric and by_name.raw == by_object.raw
    circuit = p0.discover(pm.model, toks, metric="norm_ratio:1")
    assert {n.name for n in circuit.nodes} == {n.name for n in pm.truth.writers}
    from p0circuit.patching.methods.triage import triage_patch

    assert triage_patch(pm.model, toks, metric="attn_to_p0", top=3, sample=0).metric.startswith("attn_to_p0")


@pytest.mark.parametrize("call, fix", [
    (lambda m, t: p0.activation_patch(m, t, metric="sink_head"), "did you mean 'sink_heads'"),
    (lambda m, t: p0.activation_patch(m, t, metric="attn_to_p"), "did you mean 'attn_to_p0'"),
    (lambda m, t: p0.activation_patch(m, t, metric="norm_ratio:x"), "takes a block number, e.g. 'norm_ratio:2'"),
    (lambda m, t: p0.activation_patch(m, t, corruption="shfit"), "did you mean 'shift'"),
    (lambda m, t: p0.discover(m, t, method="activaton"), "did you mean 'activation'"),
    (lambda m, t: entries.check_model_entry("real:smollm"), "did you mean 'real:smollm2'"),
])
def test_a_mistyped_name_gets_the_nearest_valid_one(setup, call, fix):
    pm, toks = setup
    with pytest.raises(p0.ConfigError, match=fix):
        call(pm.model, toks)


def test_to_frame_has_the_effect_beside_the_patched_metric(setup):
    pm, toks = setup
    frame = p0.activation_patch(pm.model, toks, metric="norm_ratio:1").to_frame()
    result = p0.activation_patch(pm.model, toks, metric="norm_ratio:1")
    assert list(frame.columns[:3]) == ["raw", "effect", "normalized"]
    assert (frame["effect"] - (frame["raw"] - result.clean_metric)).abs().max() < 1e-9
    denoise = p0.activation_patch(pm.model, toks, metric="norm_ratio:1", direction="denoise").to_frame()
    assert (denoise["effect"] - (denoise["raw"] - p0.activation_patch(
        pm.model, toks, metric="norm_ratio:1", direction="denoise").corrupted_metric)).abs().max() < 1e-9


@pytest.mark.parametrize("argv, said", [
    (["--metric", "norm_ratio:99"], "the model has blocks 0..3"),
    (["--layers", "0-99"], "the model has layers 0..3"),
    (["--nodes", "A9.H0@0"], "the model has blocks 0..3"),
    (["--metric", "sink_head"], "did you mean 'sink_heads'"),
    (["--model", "spec:rope", "--metric", "norm_ratio:4"], "blocks 0..3"),
])
def test_the_command_line_checks_before_building_the_model(argv, said, monkeypatch, capsys):
    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the arguments were checked")

    monkeypatch.setattr(resolve, "load_model", no_build)
    assert main(["discover", "--quiet", *argv]) == 2
    assert said in capsys.readouterr().err


def test_loading_prints_no_transformer_lens_device_lines(capsys):
    resolve.load_model("planted:rope")
    resolve.load_model("spec:rope")
    out = capsys.readouterr()
    assert "Moving model to device" not in out.out + out.err


def test_discover_writes_strict_json_and_says_once_when_svg_is_skipped(tmp_path, monkeypatch, capsys):
    import json
    import shutil

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "dot" else real_which(name, *a, **k))
    assert main(["discover", "--quiet", "--out", str(tmp_path), "--n-prompts", "8", "--seq-len", "12"]) == 0

    def refuse(name):
        raise AssertionError(f"sink_report.json holds {name}")

    json.loads((tmp_path / "sink_report.json").read_text(), parse_constant=refuse)
    err = capsys.readouterr().err
    assert err.count("Graphviz's 'dot' program is not installed") == 1
    for method in ("activation", "path"):  # beside each circuit: its figure (static and interactive) and heatmap
        assert '<g id="node:metric">' in (tmp_path / f"circuit_{method}.svg").read_text()  # matplotlib's drawing
        assert (tmp_path / f"circuit_{method}.png").read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / f"effects_{method}.png").read_bytes()[:4] == b"\x89PNG"
        assert "addEventListener" in (tmp_path / f"circuit_{method}.html").read_text()
        assert "rank=same" in (tmp_path / f"circuit_{method}.dot").read_text()


def test_discover_defaults_to_a_directory_per_model_and_never_overwrites_another(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["discover", "--quiet", "--n-prompts", "4", "--seq-len", "10"]) == 0
    assert (tmp_path / "runs" / "discover" / "planted-rope" / "shift-default" / "circuit_activation.json").is_file()
    other = tmp_path / "mine"
    assert main(["discover", "--quiet", "--n-prompts", "4", "--seq-len", "10", "--out", str(other)]) == 0

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the directory was checked")

    monkeypatch.setattr(resolve, "load_model", no_build)
    assert main(["discover", "--quiet", "--plant", "nope", "--out", str(other)]) == 2
    assert "holds a discovery of 'planted:rope'" in capsys.readouterr().err
    assert main(["discover", "--quiet", "--corruption", "zero", "--out", str(other)]) == 2  # same model, other settings
    assert "with other settings (corruption='shift', n_prompts=4, seq_len=10)" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["discover", "--quiet", "--plant", "nope", "--out", str(other), "--force", "--n-prompts", "4",
                 "--seq-len", "10"]) == 0


def test_every_position_its_own_node_as_transformer_lens_returns_it(setup):
    import oracle as O

    pm, toks = setup
    kw = dict(corruption=p0.Shift(filler=(O.FILLER,)), metric="norm_ratio:1", positions="each", min_signal=0)
    fast = p0.activation_patch(pm.model, toks, **kw)
    slow = p0.activation_patch(pm.model, toks, reference=True, **kw)
    assert fast.to_tensor("head").shape == (4, toks.shape[1], 2) and fast.to_tensor("mlp").shape == (4, toks.shape[1])
    names = [n for n in fast.raw if p0.Node.parse(n).layer <= 1]
    plain = O.activation(pm.model, toks, names, O.Corr("shift"), O.Metric("norm_ratio", layer=1))
    assert all(close(fast.raw[n], plain[n], fast.clean_metric) and close(slow.raw[n], plain[n], fast.clean_metric) for n in names)
    with pytest.raises(p0.BadInputError, match="positions must be 'split'"):
        p0.activation_patch(pm.model, toks, positions="every")
    with pytest.raises(p0.BadInputError, match="not both"):
        p0.activation_patch(pm.model, toks, positions="each", nodes=["M0@0"])


def test_plot_draws_the_effects_it_is_given(setup):
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    pm, toks = setup
    nodes = p0.activation_patch(pm.model, toks, metric="norm_ratio:1", positions="each")
    fig = p0.plot(nodes)
    heads, mlp = (fig.axes[i].images[0].get_array() for i in (0, 1))  # the two heatmaps (colorbars after)
    want = nodes.to_tensor("head").numpy()
    assert np.allclose(heads.filled(np.nan)[0, 0], np.nansum(want[0, :, 0]))
    assert np.allclose(mlp.filled(np.nan)[1], nodes.to_tensor("mlp").numpy()[1], equal_nan=True)
    edges = p0.path_patch(pm.model, toks, metric="norm_ratio:1")
    grid = p0.plot(edges).axes[0]
    senders = [t.get_text() for t in grid.get_yticklabels()]
    receivers = [t.get_text() for t in grid.get_xticklabels()]
    value = grid.images[0].get_array()[senders.index("A0.H0@0"), receivers.index("M0@0.mlp_in")]
    assert value == pytest.approx(edges.normalized["A0.H0@0->M0@0.mlp_in"])
    neurons = p0.activation_patch(pm.model, toks, nodes=p0.candidate_neurons(pm.model, [1]), metric="norm_ratio:1")
    bars = p0.plot(neurons, top=5).axes[0]
    layer, amplifier = pm.neurons["amplifier"]
    assert bars.get_yticklabels()[0].get_text() in {f"M{layer}.N{n}@0" for n in amplifier}


def test_discover_with_every_position_its_own_node(tmp_path, capsys):
    import json

    assert main(["discover", "--quiet", "--methods", "activation", "--positions", "each", "--n-prompts", "6",
                 "--seq-len", "8", "--out", str(tmp_path)]) == 0
    circuit = p0.Circuit.from_json((tmp_path / "circuit_activation.json").read_text())
    scored = [p0.Node.parse(n) for n in circuit.node_effects]
    assert {n.pos for n in scored} == set(range(8))  # no "rest": each position is a node
    assert {n.name for n in circuit.nodes} == {"A0.H0@0", "M0@0", "M1@0"}  # the plant's circuit, at P0 only
    assert json.loads((tmp_path / "run.json").read_text())["positions"] == "each"
    assert main(["discover", "--positions", "each", "--nodes", "M0@0", "--out", str(tmp_path / "x")]) == 2
    assert "pass it or --nodes, not both" in capsys.readouterr().err


def test_cheap_refusals_take_a_fraction_of_a_model_build(tmp_path):
    """Each refusal, as a user meets it (a fresh process), against loading the smallest model in the
    same run (a fresh process that imports p0circuit and builds planted:rope)."""
    import subprocess
    import sys
    import time

    def timed(argv):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
        return time.perf_counter() - start, done

    build, done = timed(["-c", "from p0circuit.models.resolve import load_model; load_model('planted:rope')"])
    assert done.returncode == 0, done.stderr
    ratios = {}
    for argv, said in [(["--metric", "sink_head"], "did you mean 'sink_heads'"),
                       (["--metric", "norm_ratio:99"], "the model has blocks 0..3"),
                       (["--layers", "0-99"], "the model has layers 0..3"),
                       (["--nodes", "A9.H0@0"], "the model has blocks 0..3"),
                       (["--model", "spec:rope", "--metric", "norm_ratio:4"], "blocks 0..3")]:
        seconds, done = timed(["-m", "p0circuit", "discover", *argv, "--out", str(tmp_path / "out")])
        assert done.returncode == 2 and said in done.stderr, (argv, done.stderr)
        ratios[" ".join(argv)] = seconds / build
    config = tmp_path / "bad.toml"
    config.write_text('[sweep]\ncorruptions = ["shfit"]\n')
    seconds, done = timed(["-m", "p0circuit", "sweep", str(config), "--dry-run"])
    assert done.returncode == 2 and "did you mean 'shift'" in done.stderr, done.stderr
    ratios["sweep: a mistyped corruption"] = seconds / build
    config.write_text('[sweep]\nmodels = ["planted:rope"]\ncorruptions = ["shift"]\nmethods = ["activation"]\n')
    seconds, done = timed(["-m", "p0circuit", "sweep", str(config), "--dry-run", "--out", str(tmp_path / "sw")])
    assert done.returncode == 0 and "1 cells, 0 already done" in done.stdout, done.stderr  # reads files only
    ratios["sweep --dry-run of a valid config"] = seconds / build
    print(f"model build {build:.2f} s; refusal / build: " + ", ".join(f"{k}: {v:.3f}" for k, v in ratios.items()))
    assert max(ratios.values()) < 0.25, ratios
