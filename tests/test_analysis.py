"""``p0circuit.analyze`` on planted models, whose answers the plant writes into the weights.

* ``planted:rope`` (a position-keyed plant): without BOS the onset's nodes and edges are exactly the
  plant's, edges into the sink heads' keys included, and the amplifier neuron is among the neurons.
* ``planted:bos`` (a BOS-keyed plant, the counterpart of a BOS-trained model): without BOS there is
  no sink and the verdict says the claim fails; with BOS, ``shift`` sees nothing and the analysis
  picks ``swap``, which finds the BOS token's embedding and the two MLPs.
* Interrupted analyses resume without redoing a finished step; a directory holding another analysis
  is refused before the model is built; every file is strict JSON.
"""

import functools
import json
import re

import pytest
import torch

import oracle as O
import p0circuit as p0
from p0circuit.studies.analysis import AnalysisSettings, analyze
from p0circuit.studies.analysis import run as analysis_run
from p0circuit.studies.analysis import steps
from p0circuit.studies.analysis.setting import Setting
from p0circuit.core.record import ABSENT
from p0circuit.surfaces.cli import main
from p0circuit.core import memory
from p0circuit.models.planted import build_planted
from p0circuit.core.errors import NonFiniteError
from tolerance import close

SMALL = dict(n_prompts=8, length=16, lengths=(10,), neurons_keep=16)
SETTINGS16 = AnalysisSettings(n_prompts=8, length=16, seed=0)
"""8 prompts of 16 tokens, seed 0: the prompts the tests below draw as an analysis would (Setting.prompts)."""


def strict_load(path):
    def refuse(name):
        raise AssertionError(f"{path} holds {name}, which is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def untimed(x):
    """``x`` without its ``seconds`` entries (the one thing a resumed run may differ in)."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k != "seconds"}
    return [untimed(v) for v in x] if isinstance(x, list) else x


@pytest.fixture(scope="session")
def rope_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rope")
    pm = build_planted()
    return pm, analyze(pm, out=out, progress=False, bos=(False,), **SMALL), out


@pytest.fixture(scope="session")
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
    sink = onset["sink_circuit"]  # the sink's own circuit, for the first sink heads: the same nodes, and the amplifier
    assert sink["heads"] == ["A2.H0"] and not sink["only_sink"] and not sink["only_norm"]  # into their keys
    into_keys = {e.name for e in pm.truth.edges if f"A{e.dst.layer}.H{e.dst.head}" in sink["heads"]}
    assert set(sink["into_keys"]) == into_keys and set(sink["circuit"]["nodes"]) == {n.name for n in pm.truth.writers}
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


def test_records_doc_names_the_keys_the_file_has(rope_run):
    """docs/records.md lists analysis.json's top-level keys and an onset row's keys between markers: every key
    it names is in the planted model's file (a line saying "only" may be absent from it), every key the file has
    is named, the lists are the records' fields, and its version is the one the files carry."""
    import dataclasses
    import re
    from pathlib import Path

    from p0circuit.studies.analysis.records import SCHEMA_VERSION, AnalysisRecord, OnsetRow

    _, _, out = rope_run
    doc = (Path(__file__).resolve().parent.parent / "docs" / "records.md").read_text()
    data = strict_load(out / "analysis.json")
    assert data["schema"] == strict_load(out / analysis_run.STATE)["schema"] == SCHEMA_VERSION
    assert f'"schema": {SCHEMA_VERSION}' in doc
    for block, record, found in (("analysis", AnalysisRecord, data), ("onset", OnsetRow, data["onsets"]["without_bos"][0])):
        body = re.search(rf"<!-- records:{block} -->\n(.*?)<!-- /records:{block} -->", doc, re.S).group(1)
        lines = dict(re.findall(r"^- `(\w+)`: (.*)$", body, re.M))
        assert len(lines) == body.count("\n- ") + 1, f"docs/records.md's {block} block: a line is not '- `key`: ...'"
        fields = {f.name for f in dataclasses.fields(record)}
        assert set(lines) == fields, (block, set(lines) ^ fields)
        missing = sorted(k for k, text in lines.items() if k not in found and "(only " not in text)
        assert not missing, f"docs/records.md names {missing} ({block}), which the planted analysis.json lacks"
        assert set(found) <= set(lines), f"docs/records.md leaves out {sorted(set(found) - set(lines))} ({block})"


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
    real_edges = steps.circuit_edges

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(steps, "circuit_edges", interrupted)
    with pytest.raises(KeyboardInterrupt):
        analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)
    state = strict_load(tmp_path / analysis_run.STATE)
    assert list(state["steps"]) == [analysis_run.UNIT, "without_bos/sinks", "first_tokens@L1", "weights",
                                    "without_bos/P0@L1/keyed", "without_bos/P0@L1/nodes"]
    unit = state["steps"][analysis_run.UNIT]["seconds"]  # the cost unit the finished steps were timed against
    assert calls["faithfulness"] == 1 and not (tmp_path / "analysis.json").exists()
    monkeypatch.setattr(steps, "circuit_edges", real_edges)
    resumed = analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)
    runs = resumed["timing"]["processes"]  # each process' steps against its own unit forward, never mixed
    assert [(p["run"], p["steps"]) for p in runs] == [(0, 5), (1, len(resumed["timing"]["steps"]) - 5)]
    assert runs[0]["unit_s"] == round(unit, 4) and runs[1]["unit_s"] == resumed["timing"]["forward_s"]
    assert resumed["timing"]["slowdown"] == runs[1]["slowdown"] and resumed["timing"]["load_s"] is None
    assert strict_load(tmp_path / analysis_run.STATE)["steps"][analysis_run.UNIT]["seconds"] == unit  # kept
    assert resumed["timing"]["report_s"] > 0 and "in 2 processes (resumed), each timed against its own forward: 5 steps" in str(resumed)
    assert calls["faithfulness"] == 1  # the finished node step was read back, not run again
    fresh = analyze(pm, progress=False, bos=(False,), **SMALL)
    assert untimed(resumed["onsets"]) == untimed(fresh["onsets"]) and resumed["sinks"] == fresh["sinks"]
    again = analyze(pm, out=tmp_path, progress=False, bos=(False,), **SMALL)  # everything read back
    assert untimed(again["onsets"]) == untimed(fresh["onsets"]) and again["verdict"] == fresh["verdict"]


def test_another_analysis_is_refused_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    assert main(["analyze", "--model", "planted:rope", "--out", str(tmp_path), "--n-prompts", "4", "--length", "8",
                 "--bos", "without", "--quiet"]) == 0
    timing = json.loads((tmp_path / "analysis.json").read_text())["timing"]  # what the steps did not pay for, too
    assert timing["load_s"] > 0 and timing["import_s"] >= 0 and timing["report_s"] > 0, timing
    from p0circuit.models import resolve

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the directory was checked")

    monkeypatch.setattr(resolve, "load_model", no_build)
    code = main(["analyze", "--model", "planted:nope", "--out", str(tmp_path), "--quiet"])
    assert code == 2  # refused before load_model (no_build would have raised)
    err = capsys.readouterr().err
    assert "holds an analysis of 'planted:rope'" in err and "--fresh" in err


def test_analyze_leaves_the_grad_mode_alone(rope_run):
    import torch

    assert torch.is_grad_enabled()  # the module's analyses ran in this process before


def test_bad_settings_are_refused_by_name():
    with pytest.raises(p0.ConfigError, match=r"n_prompts \(--n-prompts\) must be a whole number >= 2"):
        AnalysisSettings(n_prompts=1)
    with pytest.raises(p0.ConfigError, match=r"ig_steps \(--ig-steps\) is 65, more than 64"):  # before any step
        AnalysisSettings(ig_steps=65)
    AnalysisSettings(ig_steps=64)
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


def test_the_model_is_checked_once_where_it_enters(planted, monkeypatch):
    """analyze and a discovery check the model's weights once, where it enters, and carry it as
    checked through every step; outside them each call checks again (a weight may have changed)."""
    from p0circuit.models import checks
    from p0circuit.models.resolve import Resolved
    from p0circuit.studies.discovery.session import run_discovery

    calls = []
    real = checks.check_finite_weights
    monkeypatch.setattr(checks, "check_finite_weights", lambda m: calls.append(m) or real(m))
    analyze(planted, progress=False, bos=(False,), **SMALL)
    assert len(calls) == 1
    calls.clear()
    toks = p0.probe_tokens(planted.model, 4, 8, seed=0)
    run_discovery(Resolved("planted", planted.model, "plant"), toks, methods=["activation", "path"], corruption="shift",
                  metric=p0.AttnToP0(heads=list(planted.sink_heads)))
    assert len(calls) == 1
    calls.clear()
    p0.sink_report(planted.model, toks, bos=False)
    p0.sink_report(planted.model, toks, bos=False)
    assert len(calls) == 2  # outside a study, every call checks
    weight = next(planted.model.parameters())
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    try:
        with pytest.raises(NonFiniteError):
            p0.sink_report(planted.model, toks, bos=False)
    finally:
        with torch.no_grad():
            weight.copy_(saved)


@pytest.mark.parametrize("variant,bos,corruption", [
    ("rope", False, "shift"), ("nope", False, "shift"), ("learned", False, "shift"), ("layer2", False, "shift"),
    ("bos", True, "swap"), ("rope", False, "zero"),
])
def test_the_faithful_circuit_of_each_plant_is_its_truth(planted_models, variant, bos, corruption):
    """ACDC-style pruning keeps exactly the plant's writers (its detector and amplifiers), with every
    other candidate corrupted, in both directions; the single-node list alone is only a screen."""
    from p0circuit.patching.corruptions import get_corruption

    pm = planted_models(variant)
    layer = pm.spec.circuit_layer + 1
    toks = Setting(pm.model, SETTINGS16, bos).prompts()
    # the oracle's corruptions spell out their filler and swap token: the same ones here
    chosen = {"swap": p0.Swap(position=0, token=O.FILLER), "shift": p0.Shift(filler=(O.FILLER,))}.get(
        corruption) or get_corruption(corruption)
    res, _ = steps.nodes(p0.Setup.of(pm.model, toks, corruption=chosen, metric=p0.NormRatio(layer), bos=bos), layer, 0.1)
    circuit = p0.faithful_circuit(res)
    found = circuit.search  # the search's record: its nodes strongest first, its three shares
    assert circuit.node_names == set(found.nodes) and circuit.result is res
    truth = {n.name for n in pm.truth.writers}
    if variant == "layer2":  # see below: block 0-1 content heads also write at P0, how much depends on the filler
        extra = set(found.nodes) - truth
        assert truth <= set(found.nodes) and all(n.startswith(("A0.", "A1.")) and n.endswith("@0") for n in extra), found
    else:
        assert set(found.nodes) == truth, found
    assert found.faithful and found.completeness >= 0.99
    # the plant guarantees its mechanism, not every bit of P0's norm: with the circuit at blocks 2-3, the
    # content heads of blocks 0-1 also write at P0 (A0.H0@0 alone +0.04 of the change), so noising all of
    # them leaves the truth 0.955 of the change (measured); where the circuit starts at block 0, 0.99
    assert found.faithfulness >= (0.95 if variant == "layer2" else 0.99), found
    if corruption == "zero":
        assert found.denoising is None  # an ablation has no corrupted run to restore the circuit into
    else:
        assert found.denoising >= 0.99
    assert found.candidates == len(res.raw) and 0 < found.settings["evaluations"] <= 2 * found.candidates + 2
    # the three shares again with plain TransformerLens hooks (tests/oracle.py), sharing no code with the search
    corr, metric = O.Corr(corruption), O.Metric("norm_ratio", layer=layer)
    names = list(res.raw)
    clean, corrupted = O.references(pm.model, toks, names, corr, metric)
    share = lambda v: (v - corrupted) / (clean - corrupted)  # noqa: E731
    rest = [n for n in names if n not in found.nodes]
    assert close(share(O.together(pm.model, toks, rest, corr, metric, O.named_of(names))), found.faithfulness, rel=1e-3)
    assert close(1 - share(O.together(pm.model, toks, found.nodes, corr, metric, O.named_of(names))),
                 found.completeness, rel=1e-3)
    if found.denoising is not None:
        runs = O.Runs(pm.model, toks, corr)
        base, at, _ = runs.base("denoise")
        fwd = [h for n in found.nodes for h in O.node_hooks(runs, n, "denoise", O.named_of(names))]
        assert close(share(O.measure(pm.model, base, metric, at, fwd)), found.denoising, rel=1e-3)

    # then its edges: the plant's edges into the blocks up to the metric's, and the amplifier's direct
    # write into the residual stream the metric reads
    with_edges = p0.faithful_edges(circuit)
    edges = with_edges.edge_search
    assert with_edges.edge_names >= set(edges.edges) and with_edges.search is found
    amp = pm.truth.writers[-1]
    want = {e.name for e in pm.truth.edges if e.dst.layer <= layer} | {f"{amp.name}->R{layer}@0.resid"}
    if variant == "learned":  # the flag also reaches M1's input through its RMSNorm scale (alone -0.09 of the change)
        assert want <= set(edges.edges) and all(abs(edges.effects[e]) < 0.1 for e in set(edges.edges) - want), edges
    elif variant != "layer2":
        assert set(edges.edges) == want, edges
    else:
        assert want <= set(edges.edges), edges
    assert edges.faithful and edges.faithfulness >= 0.95 and edges.completeness >= 0.99, edges
    # the search's starting point (every edge kept) is the node circuit, measured by another path
    assert close(edges.settings["nodes_only_faithfulness"], found.faithfulness, rel=1e-3)
    # faithfulness and completeness again with plain hooks: ACDC's edge corruption written out in oracle.py
    cands = list(edges.effects)
    dropped = [e for e in cands if e not in edges.edges]
    assert close(share(O.edges_together(pm.model, toks, rest, dropped, corr, metric, O.named_of(names))),
                 edges.faithfulness, rel=1e-3)
    assert close(1 - share(O.edges_together(pm.model, toks, [], edges.edges, corr, metric, O.named_of(names))),
                 edges.completeness, rel=1e-3)


def test_faithful_edges_refuses_what_it_cannot_search_before_any_work(planted):
    """Bad bounds, a circuit made by hand, other tokens: refused with the fix. Too many candidate edges:
    nothing searched, and the record says so (no number it did not measure)."""
    import dataclasses

    from p0circuit.patching.setup import Setup

    toks = Setting(planted.model, SETTINGS16, False).prompts()
    metric = p0.NormRatio(1)
    res = p0.activation_patch(planted.model, toks, corruption="shift", metric=metric, bos=False)
    found = p0.faithful_circuit(res)
    for bad, msg in ((dict(target=5), "target must be a number in"), (dict(tolerance=-1), "tolerance must be"),
                     (dict(max_candidates=0), "max_candidates must be")):
        with pytest.raises(p0.BadInputError, match=msg):
            p0.faithful_edges(found, **bad)
    for made in (dataclasses.replace(found, result=None), p0.prune(found, top_k=2), res.to_circuit()):
        with pytest.raises(p0.BadInputError, match="carries no node search and result"):
            p0.faithful_edges(made)
    with pytest.raises(p0.BadInputError, match="are not the ones its search found"):
        p0.faithful_edges(dataclasses.replace(found, nodes=found.nodes[:1]))
    assert p0.faithful_edges(p0.faithful_edges(found)).edge_names == p0.faithful_edges(found).edge_names  # again: same
    pruned = p0.prune(found, top_k=1)  # a part of the circuit: its search's measures are not carried over
    assert not {"faithful", "faithfulness", "completeness"} & set(pruned.settings) and pruned.settings["pruned"]
    assert "faithful: faithfulness" in str(found) and "(circuit.search)" in str(found) and "faithfulness" not in str(pruned)
    with pytest.raises(AttributeError, match="numbers are on circuit.search.faithfulness"):
        found.faithfulness  # noqa: B018
    for bad in (found, p0.Circuit, "nodes", {"nodes": ["M0@0"]}):
        with pytest.raises(p0.BadInputError, match="search= is what a circuit search attaches"):
            p0.Circuit(nodes=found.nodes, search=bad)
    with pytest.raises(p0.BadInputError, match=r"is not Circuit; pass a p0circuit.Circuit \(from faithful_circuit"):
        p0.faithful_edges(res)
    other = Setup.of(planted.model, Setting(planted.model, SETTINGS16, False).prompts(seed=1), corruption="shift",
                     metric=metric, bos=False)
    with pytest.raises(p0.BadInputError, match="another setup .*tokens"):
        p0.faithful_edges(found, setup=other)
    capped = p0.faithful_edges(found, max_candidates=2).edge_search
    assert not capped.searched and capped.faithfulness is None and capped.completeness is None
    assert "more than max_candidates=2 (an analysis' --max-edges): not searched" in capped.why and capped.edges == []


def test_a_circuit_that_cannot_be_faithful_says_so(planted):
    """A budget below the truth's size: the search reports the best set it found and why it falls short."""
    toks = Setting(planted.model, SETTINGS16, False).prompts()
    metric = p0.NormRatio(1)
    res = p0.activation_patch(planted.model, toks, corruption="shift", metric=metric, bos=False)
    found = p0.faithful_circuit(res, max_size=2).search
    assert not found.faithful and "more than the budget of 2" in found.why and found.size == 3
    zero = p0.Setup.of(planted.model, toks, corruption="zero", metric=metric, bos=False)
    with pytest.raises(p0.BadInputError, match="corruption: the result's 'shift', given 'zero'"):
        p0.faithful_circuit(res, setup=zero)
    with pytest.raises(p0.BadInputError, match="target"):
        p0.faithful_circuit(res, target=1.5)


def test_the_verdict_judges_the_whole_claim_as_the_plants_are_built(rope_run, bos_run, planted_models):
    """Five parts, each as the plant is built: the position-keyed plant holds in (a)-(d) (its state keyed on
    position, with no other token before it) and fails (e): its sink heads read the normalized state, its direction
    (RMSNorm), not its norm; the BOS-keyed plant fails (a) without BOS, where (b)-(e) have no onset to judge (not
    applicable), and with BOS (a) is partially supported (a sink at position 0 that follows BOS when moved), its
    circuit where the paper puts it, its direction stable across
    layers (across prompts not applicable: one first token); the plant whose circuit sits at blocks 2 and 3 has (b) and (c) partially
    supported, the record saying where they were found; the plant whose sink heads need the norm (a large vector
    written at every position after the amplifier) has (e) hold."""
    _, rope, _ = rope_run
    parts = rope["verdict"]["parts"]["without_bos"]
    assert [parts[k]["status"] for k in ("sink", "circuit", "amplification", "direction", "reads")] == \
        ["holds"] * 4 + ["fails"]
    assert rope["verdict"]["holds"] is False and rope["verdict"]["claim"].count("holds") == 4
    assert "keyed on position (no other token before it)" in parts["sink"]["evidence"]
    assert "the direction" in parts["reads"]["evidence"] and "onset line (5)" in parts["sink"]["evidence"]
    _, bos, _ = bos_run
    no_bos = bos["verdict"]["parts"]["without_bos"]
    assert no_bos["sink"]["status"] == "fails"  # its sink follows the BOS token
    assert [no_bos[k]["status"] for k in ("circuit", "amplification", "direction", "reads")] == ["not applicable"] * 4
    assert all("no onset" in no_bos[k]["why"] for k in ("circuit", "amplification", "direction", "reads"))
    assert bos["verdict"]["holds"] is False
    with_bos = bos["verdict"]["parts"]["with_bos"]  # a sink at position 0, made by the token that stands there
    assert [with_bos[k]["status"] for k in ("sink", "circuit", "amplification", "direction")] == \
        ["partially supported"] * 2 + ["holds", "partially supported"]
    # with BOS first h_0 is one vector in every prompt: its cosine across prompts is 1 by construction, not a finding
    assert with_bos["direction"]["partly"].endswith("fixed across prompts not applicable: one first token (BOS)")
    assert "cosine across prompts is 1 by construction" in with_bos["direction"]["evidence"]
    assert with_bos["sink"]["found_at"].startswith("position 0, follows BOS when moved")
    assert with_bos["circuit"]["found_at"].endswith("no attention step at position 0 in block 0")  # the BOS token's embedding does it
    late = analyze(planted_models("layer2"), progress=False, bos=(False,), **SMALL)  # the circuit at blocks 2 and 3
    parts = late["verdict"]["parts"]["without_bos"]
    assert parts["sink"]["status"] == "holds"
    assert parts["circuit"]["status"] == "partially supported" and "attention of blocks 2" in parts["circuit"]["found_at"]
    assert "no attention step at position 0 in block 0" in parts["circuit"]["found_at"]
    assert "attention of block 2" in parts["circuit"]["evidence"] and "MLP of block 3" in parts["circuit"]["evidence"]
    assert parts["amplification"]["status"] == "partially supported"
    assert parts["amplification"]["found_at"] == "MLPs of blocks 2, 3"
    assert late["verdict"]["holds"] is False and "(b) partially supported (found at" in late["verdict"]["claim"]
    text = str(late)
    assert "(b) **partially supported (found at" in text and "Faithful circuit (ACDC-style pruning" in text
    norm = analyze(planted_models("norm"), progress=False, bos=(False,), **SMALL)
    reads = norm["verdict"]["parts"]["without_bos"]["reads"]
    assert reads["status"] == "holds" and "read both" in reads["evidence"]


def test_variations_use_the_corruption_the_analysis_chose(planted_models):
    """The position-keyed plant with a BOS token first: replacing the BOS token does not touch its sink,
    so the analysis chooses shift, and every other-length row must be patched with shift too (a
    hard-coded swap there gave normalized effects of a change that was not the sink's)."""
    result = analyze(planted_models("rope"), progress=False, bos=(True,), bos_token=0, **SMALL)
    (onset,) = result["onsets"]["with_bos"]
    assert onset["corruption"] == "shift" and onset["corruption_choice"]["chosen"] == "shift"
    v = result["variations"]["with_bos"]
    assert v["chosen_corruption"] == "shift"
    for row in v["length"].values():
        assert row["corruption"] == "shift" and row["metric"] == onset["metric"] and "clean" in row
        assert row["prompts"].startswith("8 regular random-id prompts x ") and row["prompts"].endswith("a BOS token first")
    assert "each patched with the corruption chosen above (`shift`)" in str(result)
    assert "regular random-id prompts x 16 tokens" in str(result)


def test_a_normalization_that_does_not_carry_is_flagged_with_the_raw_changes():
    from p0circuit.patching.result import PatchResult
    from p0circuit.studies.analysis.summaries import CorruptionVariation
    from p0circuit.studies.analysis.write import _effects

    def made(clean, corrupted, normalized, raw):
        return PatchResult(method="activation", level="node", corruption="shift", metric="norm_ratio@L2",
                           direction="noise", clean_metric=clean, corrupted_metric=corrupted, raw=raw,
                           normalized=normalized, signal=True)

    weak = made(8.80, 8.79, {"A2.H0@0": 28.5, "A2.H2@0": -16.2}, {"A2.H0@0": 8.515, "A2.H2@0": 8.962})
    norm = steps.normalization(weak)
    assert not norm["stable"] and "below 5%" in norm["why"] and "reaches 28.5" in norm["why"]
    assert norm["raw_changes"] == {"A2.H0@0": -0.285, "A2.H2@0": 0.162}
    row = lambda nodes, norm: CorruptionVariation.from_dict({"nodes": nodes, "normalization": norm})  # noqa: E731
    shown = _effects(row(weak.normalized, norm))
    assert "normalized effects not shown" in shown and "+28.5" not in shown and "-0.285" in shown
    fine = made(8.0, 1.0, {"M1@0": 0.9}, {"M1@0": 1.7})
    assert steps.normalization(fine)["stable"] and _effects(row({"M1@0": 0.9}, steps.normalization(fine))) == "M1@0 +0.9"


CHROMIUM = __import__("shutil").which("chromium")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
@pytest.mark.parametrize("width", [1280, 420])
def test_the_analysis_report_in_a_headless_browser(rope_run, tmp_path, width):
    """report.html as a reader sees it: each onset's effect maps @0 and @rest with the faithfulness curve,
    its faithful circuit shown once, drawn (red where it carries the change) and interactive (hover names a
    node), the terms in italics (no literal asterisks), each verdict part's answer in bold above its evidence
    in plain type, nothing wider than a phone's window."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from browser import Browser

    _, _, out = rope_run
    with Browser(tmp_path / "profile") as b:
        b.open((out / "report.html").resolve().as_uri(), width, 900)
        assert not b.errors, b.errors
        alts = b.js("[...document.images].map(i => i.alt)")
        assert "node effects at P0 and elsewhere, and faithfulness" in alts
        assert not any("circuit" in a for a in alts), alts  # the circuit is the one interactive figure, not a copy
        names = b.js("[...document.querySelectorAll('figure.circuit')].map(f => f.getAttribute('aria-label'))")
        assert len(names) == 1 and names[0].startswith("faithful circuit, layer-1 onset"), names
        assert b.js("document.querySelectorAll('details, .p0-circuit').length") == 1
        inner = b.js("innerWidth")
        assert b.js("document.documentElement.scrollWidth") <= inner
        assert max(b.js("[...document.querySelectorAll('img, svg')].map(i => i.getBoundingClientRect().right)")) <= inner
        figure = "document.querySelector('figure.circuit .p0-circuit')"
        box = b.js(f"(() => {{ const r = {figure}.querySelector('svg').getBoundingClientRect(); "
                   "return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()")
        shot = b.screenshot(tuple(box))
        red = sum(1 for p in shot.getdata() if p[0] > p[1] + 60 and p[0] > p[2] + 60)
        assert red > 30  # the planted nodes carry the change: drawn red
        node = f"{figure}.querySelector('[id=\"node:M1@0\"]')"
        b.js(f"(() => {{ const r = {node}.getBoundingClientRect(); {node}.dispatchEvent(new MouseEvent('mousemove', "
             "{bubbles: true, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2})); })()")
        assert b.js(f"{figure}.querySelector('.tip').textContent").startswith("M1@0")
        text = b.js("document.body.innerText")
        assert "(b) holds" in text and "Faithful circuit (ACDC-style pruning" in text
        terms = b.js("[...document.querySelectorAll('p')].find(p => p.innerText.startsWith('Terms:')).innerText")
        assert "*" not in terms and "onset" in b.js("[...document.querySelectorAll('p em')].map(e => e.innerText)")
        weight = "(s => getComputedStyle(document.querySelector(s)).fontWeight)"
        assert int(b.js(f"{weight}('.verdict .answer')")) >= 600 and int(b.js(f"{weight}('.verdict .evidence')")) < 600


def test_a_screened_onset_reports_exact_effects_only_and_its_circuit_corrupts_every_candidate(planted, monkeypatch):
    """``exact_nodes`` below an onset's candidates: attribution ranks them, the top and a sample are patched
    exactly, the rest report nothing; the circuit search is over every candidate, its faithfulness held to
    plain hooks that corrupt every candidate outside the circuit."""
    model, layer = planted.model, 1
    monkeypatch.setattr(steps, "SCREEN_TOP", 3)
    monkeypatch.setattr(steps, "SCREEN_SAMPLE", 2)
    toks = Setting(model, SETTINGS16, False).prompts()
    corruption = p0.Shift(filler=(O.FILLER,))
    res, out = steps.nodes(p0.Setup.of(model, toks, corruption=corruption, metric=p0.NormRatio(layer), bos=False), layer,
                           0.1, exact_nodes=3, seed=0)
    cands = [n.name for n in steps.onset_nodes(model, layer, corruption)]
    assert out["screen"]["exact_top"] == 3 and out["screen"]["sampled"] == 2
    assert out["screen"]["unexamined"] == len(cands) - 5
    assert set(out["effects"]) <= {n for n, v in res.normalized.items() if v == v}
    found = steps.circuit(res)
    assert found["candidates"] == len(cands)
    rest = [n for n in cands if n not in found["nodes"]]
    gap = res.clean_metric - res.corrupted_metric
    plain = O.together(model, toks, rest, O.Corr("shift"), O.Metric("norm_ratio", layer=layer), O.named_of(cands))
    assert close(plain, res.corrupted_metric + found["faithfulness"] * gap, res.clean_metric)
    # a variation (every corruption side by side) screens the same way but draws no sample: the onset's pass checks
    by = steps.by_corruption(p0.Setup.of(model, toks, corruption=corruption, metric=p0.NormRatio(layer), bos=False),
                             layer, ["shift", "swap"], 0.1, seed=0, exact_nodes=3)
    assert [by[c]["screen"]["sampled"] for c in ("shift", "swap")] == [0, 0]
    assert by["shift"]["screen"]["exact_top"] == 3 and by["shift"]["screen"]["unexamined"] == len(cands) - 3


def test_the_progress_bar_counts_each_planned_step_once(planted, monkeypatch):
    """The bar's units are the cost model's forwards: it shows no total before the plan (the sink report
    decides it), ends at its total (every planned step counted once, a skipped one too), never goes
    back, and the analysis records its estimate of the time (:mod:`.eta`)."""
    bars = []

    class Recorder:
        def __init__(self, total=None, **kw):
            self.totals, self.shown = [total], []
            bars.append(self)

        @property
        def total(self):
            return self.totals[-1]

        @total.setter
        def total(self, value):
            self.totals.append(value)

        @property
        def n(self):
            return self.shown[-1] if self.shown else 0.0

        @n.setter
        def n(self, value):
            self.shown.append(value)

        def set_postfix_str(self, s, refresh=True):
            pass

        def refresh(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(analysis_run, "tqdm", Recorder)
    result = analyze(planted, progress=True, bos=(False, True), bos_token=0, **SMALL)
    (bar,) = bars
    assert bar.totals[0] is None and len(bar.totals) == 2 and bar.totals[-1] > 0  # one total: the final plan's
    assert bar.n == pytest.approx(bar.total, abs=0.5)
    assert bar.shown == sorted(bar.shown)
    eta = result["timing"]["eta"]
    assert len(eta) >= 10 and eta[-1][0] == eta[-1][1] and eta[-1][0] >= result["timing"]["seconds"] - 0.5


@pytest.mark.skipif(not memory.reset_peak(), reason="the peak of resident memory cannot be reset here (not Linux)")
def test_each_step_records_its_own_peak_memory(planted, monkeypatch):
    """A step that holds 400 MB records a peak at least that far above the others' (the peak is reset
    before each step, so an earlier step's peak does not carry into a later one's)."""
    real_sinks, calls = steps.sinks, []

    def heavy(*args, **kwargs):  # the first sink report only (the other lengths' steps run one too)
        held = torch.ones(100 * 2**20) if not calls else None  # 400 MB, every page touched
        calls.append(1)
        out = real_sinks(*args, **kwargs)
        del held
        return out

    monkeypatch.setattr(steps, "sinks", heavy)
    mem = analyze(planted, progress=False, bos=(False,), **SMALL)["memory"]
    weights = sum(p.numel() * p.element_size() for p in planted.model.parameters()) / 2**30
    assert mem["weights"] >= weights
    others = [v for k, v in mem["steps"].items() if k != "without_bos/sinks"]
    assert others and mem["steps"]["without_bos/sinks"] >= max(others) + 0.3  # 0.37 GiB held; a carried peak: 0


def test_a_later_p0_onset_samples_its_first_tokens():
    """The first P0 onset of each BOS setting maps ``first_tokens``; a later one ``later_first_tokens`` (at most
    ``first_tokens``; 0: as ``first_tokens``), and the cost model predicts the map it runs."""
    from p0circuit.studies.analysis.run import _first_token_count
    plans = {False: [{"where": "P0", "layer": 2, "first": True}, {"where": "P0", "layer": 11}],
             True: [{"where": "P0", "layer": 5, "first": True}, {"where": "first ','", "layer": 1}]}
    s = p0.AnalysisSettings()
    count = functools.partial(_first_token_count, plans)
    assert [count(layer, s) for layer in (2, 5, 11)] == [65536, 65536, 8192]
    assert count(11, p0.AnalysisSettings(first_tokens=1000)) == 1000
    assert count(11, p0.AnalysisSettings(later_first_tokens=0)) == 65536
    assert count(11, p0.AnalysisSettings(first_tokens=0)) == 8192
    with pytest.raises(p0.ConfigError, match="later_first_tokens"):
        p0.AnalysisSettings(later_first_tokens=-1)


def test_a_sampled_first_token_map_is_predicted_at_one_round_and_its_margin_is_checked():
    """``first_tokens_margin``: a sampled map (a vocabulary larger than ``first_tokens``) is predicted at one round of
    draws, where a share near 0 or 1 stops it; 0 draws (and predicts) all ``first_tokens``; a vocabulary no larger is
    mapped whole either way. A bad margin is refused naming its option, before any model is loaded."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from p0circuit.studies.analysis import cost
    from p0circuit.studies.experiments.first_tokens import ROUND

    def model(vocab: int) -> HookedTransformer:
        return HookedTransformer(HookedTransformerConfig(n_layers=4, d_model=16, d_head=4, n_heads=4, d_mlp=64,
                                                         d_vocab=vocab, n_ctx=32, act_fn="gelu"))
    big, small = model(200_000), model(30_000)
    per_token = cost.first_tokens(big, 2, p0.AnalysisSettings(first_tokens=0), 0) / 200_000
    assert cost.first_tokens(big, 2, p0.AnalysisSettings(), 65536) == pytest.approx(per_token * ROUND)
    assert cost.first_tokens(big, 2, p0.AnalysisSettings(first_tokens_margin=0), 65536) == pytest.approx(per_token * 65536)
    small_token = cost.first_tokens(small, 2, p0.AnalysisSettings(first_tokens=0), 0) / 30_000
    assert cost.first_tokens(small, 2, p0.AnalysisSettings(), 65536) == pytest.approx(small_token * 30_000)
    for bad in (-0.01, 0.5, float("nan"), True, "0.01", None):
        with pytest.raises(p0.ConfigError, match=re.escape("first_tokens_margin (--first-tokens-margin) must be a number")):
            p0.AnalysisSettings(first_tokens_margin=bad)


def test_a_setting_refuses_what_it_cannot_draw(planted_models):
    """A BOS setting (what every analysis step of one setting reads) refuses a wrong model, settings object or BOS
    choice when made, and a prompt count, length or seed it cannot draw, by name, before any forward; with a start
    token its prompts are one longer and start with it, and the words say so."""
    m = planted_models("bos").model  # (a plant with a start token)
    for kwargs, said in ((dict(model="gpt2"), "HookedTransformer"), (dict(s={"n_prompts": 8}), "AnalysisSettings"),
                         (dict(bos=1), "bos=1 must be True or False")):
        with pytest.raises(p0.BadInputError, match=said):
            Setting(**{"model": m, "s": SETTINGS16, "bos": False, **kwargs})
    setting = Setting(m, SETTINGS16, False)
    for kwargs, said in ((dict(n=0), "n=0"), (dict(n=True), "n=True"), (dict(length=2.5), "length=2.5"),
                         (dict(seed=-1), "seed=-1"), (dict(length=m.cfg.n_ctx + 1), "exceed the model's context")):
        with pytest.raises(p0.BadInputError, match=said):
            setting.prompts(**kwargs)
    with pytest.raises(p0.BadInputError, match="exceed the model's context"):
        Setting(m, SETTINGS16, True).prompts(length=m.cfg.n_ctx)  # the start token needs one more position
    plain, with_bos = setting.prompts(), Setting(m, SETTINGS16, True).prompts()
    assert plain.shape == (8, 16) and with_bos.shape == (8, 17) and bool((with_bos[:, 0] == with_bos[0, 0]).all())
    assert setting.describe() == "8 regular random-id prompts x 16 tokens, no BOS"
    assert Setting(m, SETTINGS16, True).describe(4, 10) == "4 regular random-id prompts x 10 tokens, a BOS token first"


def test_the_result_reads_as_its_typed_record(rope_run):
    """``analyze`` returns the typed record: its attributes are the record's fields, typed all the way down (an onset
    row, its circuit, the verdict's parts), the same values as ``analysis.json``; an attribute it lacks says what it
    has."""
    from p0circuit.studies.analysis.passes import NodeCircuit
    from p0circuit.studies.analysis.records import AnalysisRecord, OnsetRow

    result = rope_run[1]
    assert isinstance(result.record, AnalysisRecord) and result.data == strict_load(rope_run[2] / "analysis.json")
    first = result.onsets["without_bos"][0]
    assert isinstance(first, OnsetRow) and first.at == 0 and first.token is None and first.where == "P0"
    assert isinstance(first.circuit, NodeCircuit) and first.circuit.nodes == result["onsets"]["without_bos"][0]["circuit"]["nodes"]
    assert result.verdict.parts["without_bos"].sink.status == result["verdict"]["parts"]["without_bos"]["sink"]["status"]
    assert result.sinks["without_bos"].bos is False and result.timing.forwards == result["timing"]["forwards"]
    with pytest.raises(AttributeError, match="an Analysis has no 'verdikt': its record's fields are"):
        result.verdikt
    assert "verdict" in result and "verdikt" not in result and "timing" in list(result)  # reads as a dict too
    pm = rope_run[0]
    circuit = first.to_circuit()  # the row's circuit with every candidate's effect, for compare/prune/figures
    assert set(first.circuit.nodes) <= {n.name for n in circuit.nodes}  # (and its edges' ends)
    assert set(first.circuit.edge_circuit.edges) <= {e.name for e in circuit.edges}
    assert circuit.node_effects == first.effects and circuit.settings["corruption"] == first.corruption
    truth = {e.name for e in pm.truth.edges}
    scores = p0.compare(first, pm.truth)
    assert scores["edge_recall"] == pytest.approx(len(truth & {e.name for e in circuit.edges}) / len(truth))
    effects = first.circuit.edge_circuit.effects
    kept = first.circuit.edge_circuit.edges
    strongest = sorted(kept, key=lambda e: -abs(effects[e]))[:2]
    assert {e.name for e in p0.prune(first, top_k=2).edges} == set(strongest)  # by the effects, not only the names
    bare = p0.compare(first.circuit, pm.truth)  # the search record alone: kept names, no effects
    assert bare["edge_recall"] == scores["edge_recall"] and "edge_auroc" in scores
    with pytest.raises(p0.BadInputError, match="has no faithful circuit"):
        first.replace(circuit=ABSENT).to_circuit()
