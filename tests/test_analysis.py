"""``p0circuit.analyze`` on planted models, whose answers the plant writes into the weights.

* ``planted:rope`` (a position-keyed plant): without BOS the onset's nodes and edges are exactly the
  plant's, edges into the sink heads' keys included, and the amplifier neuron is among the neurons.
* ``planted:bos`` (a BOS-keyed plant, the counterpart of a BOS-trained model): without BOS there is
  no sink and the verdict says the claim fails; with BOS, ``shift`` sees nothing and the analysis
  picks ``swap``, which finds the BOS token's embedding and the two MLPs.
* Interrupted analyses resume without redoing a finished step; a directory holding another analysis
  is refused before the model is built; every file is strict JSON.
"""

import json
import time

import pytest

import p0circuit as p0
from p0circuit.studies.analysis import AnalysisSettings, analyze
from p0circuit.studies.analysis import run as analysis_run
from p0circuit.studies.analysis import steps
from p0circuit.surfaces.cli import main
from p0circuit.models.planted import build_planted

SMALL = dict(n_prompts=8, length=16, lengths=(10,), neurons_keep=16)


def strict_load(path):
    def refuse(name):
        raise AssertionError(f"{path} holds {name}, which is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def untimed(x):
    """``x`` without its ``seconds`` entries (the one thing a resumed run may differ in)."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k != "seconds"}
    return [untimed(v) for v in x] if isinstance(x, list) else x


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rope")
    pm = build_planted()
    return pm, analyze(pm, out=out, progress=False, bos=(False,), **SMALL), out


@pytest.fixture(scope="module")
def bos_run(tmp_path_factory, planted_models):
    out = tmp_path_factory.mktemp("bos")
    pm = planted_models("bos")
    return pm, analyze(pm, out=out, progress=False, **SMALL), out


def test_position_plant_nodes_edges_and_neurons(rope_run):
    pm, result, _ = rope_run
    (onset,) = result["onsets"]["without_bos"]
    a = pm.spec.circuit_layer
    assert onset["layer"] == a + 1 and onset["where"] == "P0" and onset["corruption"] == "shift"
    assert set(onset["nodes"]) == {n.name for n in pm.truth.writers}
    within = {e.name for e in pm.truth.edges if e.dst.layer <= onset["layer"]}
    # the plant's last MLP writes the massive dimension straight into the stream the metric reads
    direct = {f"M{a + 1}@0->R{onset['layer']}@0.resid"}
    assert set(onset["edges"]) == within | direct
    into_keys = {e.name for e in pm.truth.edges if e.dst.layer > onset["layer"]}
    assert set(onset["into_sinks"]["edges"]) == into_keys
    layer, amplifier = pm.neurons["amplifier"]
    assert {f"M{layer}.N{n}@0" for n in amplifier} <= set(onset["neurons"])
    assert onset["faithfulness"]["3"] > 0.95 and onset["faithfulness"]["1"] < 0.5
    assert result["sinks"]["without_bos"]["sink_positions"][0]["where"] == "P0"


def test_files_are_strict_json_and_self_contained(rope_run):
    _, result, out = rope_run
    data = strict_load(out / "analysis.json")
    assert {"model", "sinks", "onsets"} <= set(data)
    sinks = data["sinks"]["without_bos"]
    assert {"sink_rate", "norm_stages", "massive_dims", "sink_positions"} <= set(sinks)
    assert all(len(stage) == 3 and stage[0] in ("onset", "erasure") for stage in sinks["norm_stages"])
    onset = data["onsets"]["without_bos"][0]
    assert {"layer", "nodes", "edges", "neurons", "faithfulness"} <= set(onset)
    assert all(isinstance(v, float) for v in onset["faithfulness"].values())
    strict_load(out / "analysis.state.json")
    page = (out / "report.html").read_text()
    assert page.count("<img") >= 2 and "src=\"http" not in page and "data:image/png;base64," in page
    assert (out / "analysis.md").read_text() == str(result)


def test_bos_plant_swap_finds_the_token_shift_cannot(bos_run):
    pm, result, _ = bos_run
    assert result["onsets"]["without_bos"] == [] and result["verdict"]["holds"] is False
    assert "fails" in result["verdict"]["claim"]
    (onset,) = result["onsets"]["with_bos"]
    assert onset["corruption"] == "swap" and onset["corruption_choice"]["chosen"] == "swap"
    assert set(onset["nodes"]) == {n.name for n in pm.truth.writers}  # E@0, M0@0, M1@0
    direct = {f"M{pm.spec.circuit_layer + 1}@0->R{onset['layer']}@0.resid"}  # the last MLP into the metric's stream
    assert set(onset["edges"]) == {e.name for e in pm.truth.edges if e.dst.layer <= onset["layer"]} | direct
    shift = result["variations"]["with_bos"]["corruption"]["shift"]
    assert shift["signal"] is False and "try 'swap'" in shift["message"] and "try 'shift'" not in shift["message"]
    assert result["sinks"]["with_bos"]["sink_positions"][0]["where"] == "P0 (BOS)"


def test_interrupted_analysis_resumes_without_redoing_steps(tmp_path, monkeypatch):
    pm = build_planted()
    calls = {"faithfulness": 0}
    real_faithfulness = steps.faithfulness

    def counted(*args, **kwargs):  # called once per onset's node step, nowhere else
        calls["faithfulness"] += 1
        return real_faithfulness(*args, **kwargs)

    monkeypatch.setattr(steps, "faithfulness", counted)
    real_edges = steps.edges

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(steps, "edges", interrupted)
    with pytest.raises(KeyboardInterrupt):
        analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)
    state = strict_load(tmp_path / analysis_run.STATE)
    assert list(state["steps"]) == ["without_bos/sinks", "without_bos/P0@L1/nodes"]
    assert calls["faithfulness"] == 1 and not (tmp_path / "analysis.json").exists()
    monkeypatch.setattr(steps, "edges", real_edges)
    resumed = analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)
    assert calls["faithfulness"] == 1  # the finished node step was read back, not run again
    fresh = analyze(pm, progress=False, bos=(False,), **SMALL)
    assert untimed(resumed["onsets"]) == untimed(fresh["onsets"]) and resumed["sinks"] == fresh["sinks"]
    again = analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)  # everything read back
    assert untimed(again["onsets"]) == untimed(fresh["onsets"]) and again["verdict"] == fresh["verdict"]


def test_another_analysis_is_refused_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    assert main(["analyze", "--model", "planted:rope", "--out", str(tmp_path), "--n-prompts", "4", "--length", "8",
                 "--bos", "without", "--quiet"]) == 0
    from p0circuit.models import resolve

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the directory was checked")

    monkeypatch.setattr(resolve, "load_model", no_build)
    t = time.perf_counter()
    code = main(["analyze", "--model", "planted:nope", "--out", str(tmp_path), "--quiet"])
    assert code == 2 and time.perf_counter() - t < 1.0
    err = capsys.readouterr().err
    assert "holds an analysis of 'planted:rope'" in err and "--fresh" in err


def test_analyze_leaves_the_grad_mode_alone(rope_run):
    import torch

    assert torch.is_grad_enabled()  # the module's analyses ran in this process before


def test_bad_settings_are_refused_by_name():
    with pytest.raises(p0.ConfigError, match="n_prompts must be an int >= 2"):
        AnalysisSettings(n_prompts=1)
    with pytest.raises(p0.ConfigError, match="bos must list False and/or True"):
        AnalysisSettings(bos=(True, True))
    with pytest.raises(p0.BadInputError, match="the settings are"):
        analyze("planted:rope", n_promts=4)
    with pytest.raises(p0.BadInputError, match="HookedTransformer or a model entry"):
        analyze(42)


def test_default_output_directory_is_per_model_entry():
    from p0circuit.core.io import run_dir

    assert str(run_dir("analyze", "real:smollm2")) == "runs/analyze/real-smollm2"
    assert run_dir("analyze", "checkpoint:/a/b c") != run_dir("analyze", "checkpoint:/a/b_d")
