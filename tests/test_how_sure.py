"""How sure a finding is (issue 48): the verdict's thresholds swept (a plant whose onset is unambiguous is stable, a
plant built near the onset line flips exactly there), intervals over prompts, controls that can fail, and no circuit
"explaining" a sink that is not there."""

import warnings

import pytest
import torch

import p0circuit as p0
from p0circuit.measures.spread import cosine_interval, interval
from p0circuit.studies.analysis import analyze
from p0circuit.studies.analysis.sensitivity import ONSET_LINES, first_onsets, stages, sweeps
from p0circuit.studies.analysis.verdict import judge

SMALL = dict(n_prompts=8, length=16, lengths=(), neurons_keep=16, spread_prompts=16)


def _sweep(result, name, tag="without_bos"):
    return next(s for s in result["sensitivity"][tag]["sweeps"] if s["threshold"] == name)


@pytest.fixture(scope="module")
def rope():
    return analyze("planted:rope", progress=False, bos=(False,), **SMALL)


def test_an_unambiguous_onset_is_stable_over_the_lines_below_it(rope):
    """The rope plant's P0 ratio is at least 1.1 x norm_ratio (11) on every probe prompt: every onset line up to 10
    gives the same onset and the same labels; 16 finds no onset."""
    sw = _sweep(rope, "onset line")
    for part, labels in sw["parts"].items():
        below = [lab for v, lab in zip(sw["values"], labels) if v <= 10]
        assert len(set(below)) == 1, (part, labels)
    assert all(f.endswith("at 16") for f in sw["flips"])
    for name in ("sink line", "keep line", "cosine line", "faithfulness target", "node budget", "effect line"):
        assert _sweep(rope, name)["flips"] == [], name


def test_a_plant_built_near_the_line_flips_there():
    """A plant whose onset ratio sits between two lines of the sweep: (a) holds at the lower and not at the upper."""
    pm = p0.build_planted(norm_ratio=4.8)
    result = analyze(pm, progress=False, bos=(False,), **SMALL)
    ratio = max(result["sinks"]["without_bos"]["norm_ratio"])
    low = max(v for v in ONSET_LINES if v <= ratio)
    high = min(v for v in ONSET_LINES if v > ratio)
    sw = _sweep(result, "onset line")
    labels = dict(zip(sw["values"], sw["parts"]["sink"]))
    assert labels[low] == "holds" and not labels[high].startswith("holds"), (ratio, labels)
    assert f"(a) holds at {low:g}, partially supported at {high:g}" in sw["flips"]


def test_the_stages_of_another_line():
    ratios = [1.0, 3.5, 7.0, 4.0, 9.0]
    assert stages(ratios, 5) == [["onset", 2, 7.0], ["erasure", 3, 4.0], ["onset", 4, 9.0]]
    assert first_onsets(ratios)[3.0] == 1 and first_onsets(ratios)[8.0] == 4 and first_onsets(ratios)[10.0] is None


def test_a_block_the_analysis_did_not_patch_is_said_so():
    """With an onset line that moves the onset past what the analysis patched, the parts that need the row say
    'not measured', never a label judged from another block's row."""
    from p0circuit.studies.analysis.records import SinkSummary

    summary = SinkSummary.from_dict({
        "norm_ratio": [1.0, 6.0, 12.0], "norm_stages": [["onset", 1, 6.0]], "alpha": [[0.2], [0.9], [0.9]],
        "sink_rate": 0.5, "sink_positions": [], "direction_stability": [0.5, 0.99, 0.99],
        "direction_to_onset": [0.1, 1.0, 0.99], "direction_stability_ordinary": [0.5, 0.5, 0.5],
        "direction_stability_unmassive": [0.5, 0.9, 0.9], "bos": False, "massive_dims": [],
        "sink_rate_per_layer": [0.0, 0.5, 0.5], "n_prompts": 8, "seq_len": 16})
    sw = {s.threshold: s for s in sweeps(summary, None, {}, {"norm_threshold": 5.0, "threshold": 0.1})}
    at10 = {k: v[sw["onset line"].values.index(10.0)] for k, v in sw["onset line"].parts.items()}
    assert at10["circuit"].startswith("not measured (the onset moves to block 2")
    assert judge(summary, None).circuit.status == "not applicable"


def test_intervals():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    low, high = interval([values], seed=0)
    # the percentile bootstrap of a mean of 4: its 2.5% and 97.5% quantiles are 1.5 and 3.5 (sums of 6 and 14 of 4
    # draws, each about 2.7% likely in the tails); a wrong quantile or a resample of the wrong axis misses them
    assert (low, high) == pytest.approx((1.5, 3.5), abs=0.25)
    assert interval([torch.full((8,), 2.0)]) == (2.0, 2.0)
    ratio = interval([torch.tensor([2.0, 4.0]), torch.tensor([4.0, 8.0])], lambda a, b: a / b)
    assert ratio == pytest.approx((0.5, 0.5))
    vectors = torch.tensor([[1.0, 0.0], [1.0, 0.1], [1.0, -0.1]])
    low, high = cosine_interval(vectors)
    assert 0.98 < low <= high <= 1.0
    with pytest.raises(p0.BadInputError, match="at least 2 prompts"):
        interval([torch.tensor([1.0])])
    with pytest.raises(p0.BadInputError, match="one value per prompt"):
        interval([torch.ones(3), torch.ones(4)])


def test_the_spread_and_the_controls_on_the_plant(rope):
    sp = rope["spread"]["without_bos"]
    for key in ("ratio", "faithfulness", "neuron", "direction"):
        x = sp[key]
        assert x["low"] <= x["mean"] <= x["high"] and x["n"] == 16, key
        assert x["high"] - x["low"] < 0.5 * max(abs(x["mean"]), 1e-9), key  # 16 prompts of one plant: a narrow interval
    assert sp["faithfulness"]["mean"] > 0.9 and sp["reaches"] == 1.0 and sp["keyed"]["verdict"] == "position"
    assert [r["length"] for r in sp["lengths"]] == [8, 16, 32, 64] and all(r["onset"] == 1 for r in sp["lengths"])
    controls = {c["name"]: c for c in rope["controls"]["without_bos"]}
    assert all(c["passed"] for c in controls.values())
    assert controls["copies"]["kind"] == "negative" and controls["random direction"]["kind"] == "positive"


def test_the_copies_control_sees_an_absolute_position(planted_models):
    """The learned-position plant keys its detector on row 0 of its position embedding: copies of the first token put
    in front leave the clean first token at position 3, where the flag is not; the control predicts that signal
    there, and the keyed test says 'the absolute position'."""
    result = analyze(planted_models("learned"), progress=False, bos=(False,), **SMALL)
    copies = next(c for c in result["controls"]["without_bos"] if c["name"] == "copies")
    assert copies["kind"] == "positive" and copies["passed"] and "99.9% of the onset's own change" in copies["observed"]
    assert result["onsets"]["without_bos"][0]["keyed_on"]["means"] == "the absolute position"


def test_discover_says_when_there_is_no_sink():
    """A random tiny model has no P0 sink: discover's reading says the circuit explains the metric's change, not a
    sink, warns at the caller's line, and records why; the plant's reading names what identifies P0."""
    g = p0.ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=50, n_ctx=24, seed=1).build()
    t = torch.randint(0, 50, (4, 10), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = p0.discover(g, t, corruption="shift", metric=p0.NormRatio(1))
    (w,) = [x for x in caught if "no P0 sink" in str(x.message)]
    assert w.filename == __file__  # the user's line, not a wrapper's inside p0circuit
    assert c.interpretation.startswith("no P0 sink on these prompts") and "not a sink" in c.interpretation
    assert "P0 is identified by" not in c.interpretation and "no_sink" in c.settings
    pm = p0.build_planted()
    c = p0.discover(pm.model, p0.probe_tokens(pm.model, 8, 16, regular=True), corruption="shift")
    assert c.interpretation.startswith("P0 is identified by attention") and "no_sink" not in c.settings


def test_the_positive_control_with_no_share_to_read(planted_models):
    """Where the reads study recorded its edits but no kept share (no sink heads' excess to divide by: the share is
    NaN, written as null), the random-direction control says 'not measured' rather than failing to format it."""
    from p0circuit.studies.analysis.run import _controls

    reads = {"reads": "not applicable (no head after block 1 gives position 0 an alpha_0 above 0.3)",
             "edits": {"random_direction": {"kept": None, "attention": 0.1}}}
    out = {c["name"]: c for c in _controls(planted_models("rope").model, {"clean": 2.0, "corrupted": 1.0,
                                                                          "reads": reads}, {})}
    assert out["random direction"]["passed"] is None and out["random direction"]["meaning"] == "not measured"
    assert out["random direction"]["observed"].startswith("not applicable")


def test_the_length_scan_reads_each_length_on_its_own_prefix(planted_models):
    """One forward of the longest prompts serves every length: each length's ratios equal a plain TransformerLens run of
    that length's prompts alone (the first n tokens), P0's norm over the mean of the others computed here by hand."""
    from p0circuit.studies.analysis.spread import length_scan

    from p0circuit.studies.analysis.setting import Setting

    model = planted_models("rope").model
    made = []

    class Counted(Setting):
        def prompts(self, n=None, length=None, seed=None):
            made.append(length)
            return super().prompts(n, length, seed)

    line = 2.0
    setting = Counted(model, p0.AnalysisSettings(seed=3, norm_threshold=line), False)
    rows = length_scan(setting, 4, 1, lengths=(8, 16, 32))
    assert made == [32] and [r.length for r in rows] == [8, 16, 32]  # one draw, of the longest length
    longest = p0.probe_tokens(model, 4, 32, seed=3, regular=True)  # what the setting draws, drawn here by hand
    for r in rows:
        _, cache = model.run_with_cache(longest[:, :r.length])
        ratios = []
        for l in range(model.cfg.n_layers):
            norms = cache[f"blocks.{l}.hook_resid_post"].norm(dim=-1)
            ratios.append(float((norms[:, 0] / norms[:, 1:].mean(-1)).mean()))
        assert r.at_onset == pytest.approx(ratios[1], rel=1e-5)
        assert r.onset == next((l for l, x in enumerate(ratios) if x >= line), None)
        assert r.peak == pytest.approx(max(ratios), rel=1e-5)
    assert length_scan(setting, 4, 1, lengths=(4096,)) == [] and made == [32]  # nothing within the context: no forward
