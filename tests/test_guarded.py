"""Guarded by construction (issue 50): one regression test per class of hostile input the issue's "Why" names.

Each test feeds the input that broke a layer (a traceback, a silent wrong or vacuous result, a false refusal or a
wrong fix named) and checks the refusal, or the "not measured" with why, and what its message says. The contract
over the whole public API is tests/test_contract.py; the hand table of entry points, tests/test_hostile_inputs.py.
"""

import json
import math
import re
import warnings

import pytest
import torch

import p0circuit as p0
from p0circuit.core.circuits import prune
from p0circuit.core.io import write_atomic
from p0circuit.patching.work import Count
from p0circuit.studies.analysis import AnalysisSettings, analyze
from p0circuit.studies.analysis.records import UNIT, AnalysisRecord
from p0circuit.studies.analysis.settings import STATE, precheck
from p0circuit.studies.analysis.write import markdown
from p0circuit.studies.experiments.keyed import _replacements, aligned_prompts, keyed_on
from p0circuit.surfaces.cli import main

SMALL = dict(n_prompts=4, length=8, bos=(False,), spread_prompts=0, lengths=(12,))


def _no_forward(model, call):
    """``call()``'s error, and that no forward of ``model`` ran before it."""
    with Count(model) as counted:
        with pytest.raises(p0.P0CircuitError) as err:
            call()
    assert counted.reads == 0, f"a forward ran before the refusal: {err.value}"
    return str(err.value)


# ---- functions that never checked their tokens or positions (the keyed test) ---------------------------------------

@pytest.mark.parametrize("make, said", [
    (lambda t, m: t[0], "at least 2 prompts"),  # 1-D: one prompt
    (lambda t, m: t.clone().fill_(m.cfg.d_vocab), "out of the vocabulary"),
    (lambda t, m: t.clone().fill_(-1), "negative ids"),
    (lambda t, m: torch.ones(2, m.cfg.n_ctx + 1, dtype=torch.long), "n_ctx"),
    (lambda t, m: t[:, :4], "prompts of at least 5 tokens"),  # 3 tokens put in front need more than 3
], ids=["1-D", "past vocabulary", "negative", "longer than context", "4 tokens"])
def test_the_keyed_test_refuses_tokens_before_any_forward(planted, make, said):
    m = planted.model
    toks = p0.probe_tokens(m, 4, 12, seed=0, regular=True)
    assert said in _no_forward(m, lambda: keyed_on(m, make(toks, m), 0, 1, bos=False))


@pytest.mark.parametrize("kw, said", [(dict(at=11), "at=11 must index"), (dict(at=-1), "at=-1"),
                                      (dict(layer=4), "layer=4 must be a block"), (dict(layer=-1), "layer=-1")])
def test_the_keyed_test_refuses_positions_and_layers_before_any_forward(planted, kw, said):
    m = planted.model
    toks = p0.probe_tokens(m, 4, 12, seed=0, regular=True)
    args = {"at": 0, "layer": 1, **kw}
    assert said in _no_forward(m, lambda: keyed_on(m, toks, args["at"], args["layer"], bos=False))


def test_an_analysis_of_prompts_too_short_for_the_keyed_edits_says_not_measured(tmp_path, monkeypatch):
    """``analyze --length 2`` reached the keyed test with prompts shorter than its edits (an IndexError). (The same
    run, on a machine made to look busy, shows that the busy-machine warning points at this line, not at the entry
    point's wrapper in core/args.py.)"""
    from p0circuit.core import threads

    class Busy(threads.Contention):
        busy = True

    monkeypatch.setattr(threads, "Contention", Busy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = analyze("planted:rope", out=tmp_path, progress=False, **{**SMALL, "length": 2, "lengths": (4,)})
    keyed = result["onsets"]["without_bos"][0]["keyed_on"]
    assert set(keyed) == {"error"} and "prompts of at least 5 tokens" in keyed["error"], keyed
    busy = [w for w in caught if "unit forward" in str(w.message)]
    assert busy and busy[0].filename == __file__, [(w.filename, w.lineno, str(w.message)[:40]) for w in caught]


def test_replacement_tokens_are_drawn_from_the_prompts_never_the_token_or_its_neighbours():
    """Not ``id ^ 1`` or ``(id + 1) mod V``: those fall outside an odd vocabulary, break the prompts' regularity or put
    the BOS id mid-prompt."""
    vocab = 33  # odd: 32 ^ 1 = 33 is no id of it
    gen = torch.Generator().manual_seed(0)
    toks = torch.randint(0, vocab, (16, 10), generator=gen)
    toks[:, 4] = 32
    avoid = {0}  # a BOS id
    for at in (0, 4, 9):
        new = _replacements(toks, at, avoid, seed=1)
        pool = {int(t) for t in toks[:, 1:].flatten()}
        for row, token in zip(toks.tolist(), new):
            near = {row[i] for i in (at - 1, at, at + 1) if 0 <= i < len(row)}
            assert token in pool and token not in near and token not in avoid and 0 <= token < vocab


# ---- shares divided by nothing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [1.0, 0.5, 1])
def test_a_norm_ratio_line_at_or_below_1_is_refused_everywhere(planted, line):
    m = planted.model
    toks = p0.probe_tokens(m, 4, 12, seed=0, regular=True)
    for call in (lambda: keyed_on(m, toks, 0, 1, bos=False, threshold=line),
                 lambda: p0.sink_report(m, toks, norm_threshold=line),
                 lambda: p0.first_token_map(m, toks, 1, threshold=line),
                 lambda: p0.special_tokens(m, toks, bos=False, threshold=line)):
        said = _no_forward(m, call)
        assert f"={line!r} must be > 1" in said and "excess norm" in said, said
    with pytest.raises(p0.ConfigError, match=r"norm_threshold \(--norm-threshold\) must be a finite number > 1"):
        AnalysisSettings(norm_threshold=line)


# ---- edits that changed nothing, reported as measured ------------------------------------------------------------

def test_an_edit_that_changes_nothing_is_not_counted(planted_models):
    """Identical prompts: the context edit takes each prompt's context from its own copy (a no-op), so its share is
    not read; the swap and the move are read only where they changed what they claim (here: every prompt)."""
    pm = planted_models("secondary")  # a token-keyed state on token 25 after block 2, wherever it stands
    row = p0.probe_tokens(pm.model, 1, 12, seed=0, regular=True)
    row[row == 25] = 26
    row[0, 5] = 25
    toks = row.repeat(4, 1)
    k = keyed_on(pm.model, toks, 5, 2, bos=False, contexts=toks)
    assert k.context is None and "not measured: every context taken equals the prompt's own" in k.context_note
    assert k.swapped.n == k.follows.n == k.stays.n == k.prompts == 4 and k.verdict == "token"


# ---- the carried setup's check ------------------------------------------------------------------------------------

def test_a_weight_change_only_the_corrupted_run_sees_is_refused(planted_models):
    """The carried setup compared only the clean metric: an embedding row that only the shift's filler uses changed
    nothing there, and the search ran on a model its result does not describe. It now compares a digest of what the
    runs read; a row no run reads leaves the result valid."""
    pm = planted_models("rope")
    m = pm.model
    toks = p0.probe_tokens(m, 2, 6, seed=0, regular=True)
    unused = [i for i in range(m.cfg.d_vocab) if i not in set(toks.flatten().tolist())]
    filler, untouched = unused[0], unused[1]
    res = p0.activation_patch(m, toks, corruption=p0.Shift(filler=(filler,)), metric="norm_ratio:1")
    w = m.embed.W_E
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w[untouched] += 1.0  # no run reads it: the result still holds
        assert p0.faithful_circuit(res).nodes
        with torch.no_grad():
            w.data[filler] += 1.0  # through .data: no version counter moves
        assert abs(p0.activation_patch(m, toks, corruption=p0.Shift(filler=(filler,)), metric="norm_ratio:1").clean_metric
                   - res.clean_metric) < 1e-6  # the clean metric alone cannot see it
        said = _no_forward(m, lambda: p0.faithful_circuit(res))
        assert "weights changed since the result was computed (embed.W_E" in said and "patch again" in said
    finally:
        with torch.no_grad():
            w.copy_(saved)


# ---- prune never grows a circuit ------------------------------------------------------------------------------------

def test_prune_never_grows_a_circuit(planted):
    toks = p0.probe_tokens(planted.model, 4, 8, seed=0, regular=True)
    res = p0.activation_patch(planted.model, toks, metric="norm_ratio:1")
    circuit = res.to_circuit(0.5)
    assert 0 < len(circuit.nodes) < len(res.raw)  # its effects cover more candidates than it holds
    for kept in (prune(circuit, top_k=len(res.raw)), prune(circuit, threshold=0.0)):
        assert kept.node_names == circuit.node_names
    assert prune(circuit, top_k=1).node_names <= circuit.node_names and len(prune(circuit, top_k=1).nodes) == 1


# ---- records and states read with their types --------------------------------------------------------------------

@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysed")
    analyze("planted:rope", out=out, progress=False, **SMALL)
    return out


@pytest.mark.parametrize("key, value, path", [
    ("onsets", [], "its key onsets must be an object"),
    ("sinks", [], "its key sinks must be an object"),
    ("settings", None, "its key settings must be an object"),
    ("sinks", {"without_bos": {"sink_rate": 0.5}}, "its key sinks['without_bos'] must be an object (SinkSummary)"),
])
def test_a_record_of_the_wrong_type_is_refused_by_its_readers(analysed, key, value, path):
    data = {**json.loads((analysed / "analysis.json").read_text()), key: value}
    for reader in (AnalysisRecord.from_dict, markdown):
        with pytest.raises(p0.ConfigError) as err:
            reader(data)
        assert path in str(err.value), str(err.value)


def test_an_onset_row_keyed_on_a_string_is_refused_by_key_path(analysed):
    data = json.loads((analysed / "analysis.json").read_text())
    data["onsets"]["without_bos"][0]["keyed_on"] = "token"
    with pytest.raises(p0.ConfigError, match=r"its key onsets\['without_bos'\]\[0\]\.keyed_on must be an object"):
        AnalysisRecord.from_dict(data)



@pytest.mark.parametrize("damage, said", [
    (lambda s: s["steps"]["without_bos/sinks"].__setitem__("value", "garbage"),
     "steps['without_bos/sinks'].value must be an object (SinkSummary)"),
    (lambda s: s["steps"]["without_bos/P0@L1/nodes"]["value"].pop("signal"), "one without ['signal']"),
    (lambda s: s["steps"]["without_bos/P0@L1/keyed"].pop("value"), "lacks the key(s) ['value'] (Step)"),
    (lambda s: s["steps"][UNIT].__setitem__("seconds", 0), "seconds must be a number of seconds > 0"),
    (lambda s: s["steps"]["without_bos/sinks"]["value"].__setitem__("norm_ratio", [math.inf]), "norm_ratio"),
], ids=["damaged value", "a value without a key", "a step without its value", "zero unit time", "inf"])
def test_a_damaged_state_is_refused_with_fresh_before_the_model_loads(analysed, tmp_path, no_model, damage, said):
    state = json.loads((analysed / STATE).read_text())
    damage(state)
    (tmp_path / STATE).write_text(json.dumps(state))
    for call in (lambda: precheck(tmp_path, "planted:rope", AnalysisSettings(**SMALL), resume=True),
                 lambda: analyze("planted:rope", out=tmp_path, progress=False, **SMALL)):
        with pytest.raises(p0.ConfigError) as err:
            call()
        assert said in str(err.value) and "--fresh" in str(err.value), str(err.value)
    assert main(["analyze", "--out", str(tmp_path), "--quiet", "--n-prompts", "4", "--length", "8", "--bos", "without",
                 "--spread-prompts", "0"]) == 2


def test_a_save_cut_short_leaves_no_temporary_file(analysed, tmp_path, monkeypatch):
    """Ctrl-C between the write and the rename: ``write_atomic`` removes its own temporary file; one a killed process
    left (another pid) is removed by the next run."""
    import os
    import shutil

    target = tmp_path / STATE

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "{}")
    monkeypatch.undo()
    assert not list(tmp_path.iterdir())
    dead = tmp_path / f"{STATE}.999999999.tmp"  # no such process
    dead.write_text("half")
    shutil.copy(analysed / STATE, target)  # every step done: the run restores them and writes its files
    analyze("planted:rope", out=tmp_path, progress=False, **SMALL)
    assert not dead.exists() and not list(tmp_path.glob("*.tmp"))


def test_a_circuit_is_read_back_typed_and_versioned(planted):
    circuit = planted.truth
    data = json.loads(circuit.to_json())
    assert data["schema"] == 1 and p0.Circuit.from_json(circuit.to_json()) == circuit
    assert p0.Circuit.from_dict({k: v for k, v in data.items() if k != "schema"}) == circuit  # written before versions
    for bad, said in (({**data, "schema": 2}, "schema version 2"), ({**data, "node_effects": {"A0.H0@0": "big"}},
                                                                    "node_effects['A0.H0@0'] must be"),
                      ({**data, "edges": "M0@0->M1@0.mlp_in"}, "its key edges must be a list")):
        with pytest.raises(p0.BadInputError, match=re.escape(said)):
            p0.Circuit.from_dict(bad)
    with pytest.raises(p0.BadInputError, match="must be a finite number"):
        p0.Circuit.from_json('{"nodes": [], "node_effects": {"A0.H0@0": Infinity}}')


# ---- node names parse strictly -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, meant", [("A+0.H0@0", "A0.H0@0"), ("M 1@0", "M1@0"), ("A\u0663.H0@0", "A3.H0@0"),
                                         ("A01.H0@0", "A1.H0@0"), ("M1@\u0660", "M1@0"), ("M1.N 5@0", "M1.N5@0")])
def test_a_node_name_has_one_spelling(name, meant):
    with pytest.raises(p0.BadInputError, match=f"write {meant!r}"):
        p0.Node.parse(name)
    with pytest.raises(p0.BadInputError, match=f"write {meant!r}"):
        p0.Edge.parse(f"{name}->R3@0.resid")


# ---- messages that said something false --------------------------------------------------------------------------

def test_a_search_over_a_node_past_the_last_block_names_it(planted):
    toks = p0.probe_tokens(planted.model, 4, 8, seed=0, regular=True)
    found = p0.faithful_circuit(p0.activation_patch(planted.model, toks, metric="norm_ratio:1"))
    found.search.nodes.append("A9.H0@0")  # the search record edited: refused, naming the node
    said = _no_forward(planted.model, lambda: p0.faithful_edges(found))
    assert "are not the ones its search found" in said and "A9.H0@0" in said
    import dataclasses  # and the circuit edited alike: the node is named, with the model's blocks
    found = dataclasses.replace(found, nodes=found.nodes + (p0.Node.parse("A9.H0@0"),))
    said = _no_forward(planted.model, lambda: p0.faithful_edges(found))
    assert "circuit.search.nodes holds 'A9.H0@0'" in said and "layers 0..3" in said and "no edge between" not in said


def test_set_threads_names_the_bound_it_breaks():
    for threads, said in ((10**20, "must be in [1, 4096]"), (0, "must be in [1, 4096]")):
        with pytest.raises(p0.BadInputError, match=re.escape(said)):
            p0.set_threads(threads)


def test_one_prompt_from_the_passages_is_not_refused():
    """Asking the shipped passages for one window was refused as if they held one."""
    from collections import Counter

    from p0circuit.measures.positions import token_text
    from p0circuit.models.tokens import english_lines

    model = _text_model()
    read = token_text(model)
    ids = model.tokenizer(" ".join(english_lines()), add_special_tokens=False)["input_ids"]
    common = Counter(read(i) for i in ids).most_common(1)[0][0]
    one = aligned_prompts(model, ("token", common), 1, 12, 4, bos=False, seed=0)
    two = aligned_prompts(model, ("token", common), 2, 12, 4, bos=False, seed=0)
    assert one.shape == (1, 12) and two.shape == (2, 12) and read(int(one[0, 4])) == common


def _text_model():
    import tempfile
    from pathlib import Path

    from family_configs import make_checkpoint

    return p0.load_checkpoint(make_checkpoint("gpt2", Path(tempfile.mkdtemp(prefix="p0guarded")), with_tokenizer=True))


def test_a_metric_short_of_positions_in_an_aligned_run_names_the_alignment_not_the_prompts():
    """"Use longer prompts" was the fix named when a corruption's alignment put P0 at the run's end."""
    from p0circuit.patching.metrics import NormRatio, RunView

    acts = {"blocks.1.hook_resid_post": torch.ones(2, 6, 4)}
    with pytest.raises(p0.BadInputError) as err:
        NormRatio(1).per_prompt(RunView(acts, None, p0=5))
    assert "alignment" in str(err.value) and "longer prompts" not in str(err.value), str(err.value)
    with pytest.raises(p0.BadInputError, match="use longer prompts"):
        NormRatio(1, pos=7).per_prompt(RunView(acts, None, p0=0))


def test_an_analysis_json_of_another_version_names_the_rerun_that_rebuilds_it(tmp_path):
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps({"schema": 1}))
    with pytest.raises(p0.ConfigError) as err:
        AnalysisRecord.read(path)
    said = str(err.value)
    assert "rewrites analysis.json from the finished steps" in said and said.index("again") < said.index("--fresh")


def test_a_sweep_failure_that_recurs_says_the_config_must_change():
    from pathlib import Path

    from p0circuit.surfaces.sweep.runner import CellsFailed

    refused = str(CellsFailed(1, 2, Path("out"), ["cell: BadInputError: seq_len=64 does not fit"], refused=1))
    assert "a rerun meets again: change the config" in refused and "retries only the failed ones" not in refused
    crashed = str(CellsFailed(1, 2, Path("out"), ["cell: RuntimeError: out of memory"], refused=0))
    assert "a rerun retries only the failed ones" in crashed


def test_an_old_import_path_warns_at_the_importing_line(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "p0circuit.hooks", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import p0circuit.hooks  # noqa: F401  (moved to p0circuit.core.hooks: a FutureWarning)
    moved = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert moved and moved[0].filename == __file__, [(w.filename, w.lineno) for w in caught]


# ---- tried as a new user would --------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, said", [
    (["--layers", "5-2"], "the range 5-2 runs backwards"),
    (["--layers", "0-9"], "the model has layers 0..3"),
    (["--nodes", "A9.H0@0"], "the model has blocks 0..3"),
    (["--nodes", "A+0.H0@0"], "write 'A0.H0@0'"),
])
def test_the_inputs_own_error_comes_before_a_conflict_with_earlier_output(tmp_path, monkeypatch, capsys, argv, said):
    """After the README's ``p0circuit discover`` the default --out holds a discovery; a mistyped option was refused
    with "pass --force" instead of its own error."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "discover" / "planted-rope" / "shift-default"
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"model": "planted:rope", "seed": 7}))
    assert main(["discover", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "--force" not in err, err


def test_the_suite_runs_in_an_empty_directory_of_its_own():
    """No test reads or writes the directory the suite was started in (tests/conftest.py)."""
    from pathlib import Path

    import docblocks

    assert not any(Path.cwd().iterdir()) and Path.cwd() != docblocks.ROOT


def test_a_start_token_for_no_with_bos_setting_is_refused(tmp_path, capsys):
    with pytest.raises(p0.ConfigError, match=r"bos_token \(--bos-token\) 5 is the token the with-BOS setting puts first"):
        analyze("planted:rope", bos_token=5, out=tmp_path, progress=False, **SMALL)
    (tmp_path / STATE).write_text("{}")  # a directory that would be refused too: the option's own error first
    assert main(["analyze", "--out", str(tmp_path), "--bos", "without", "--bos-token", "5", "--quiet"]) == 2
    assert "measures no with-BOS setting" in capsys.readouterr().err


def test_a_planted_discovery_that_misses_the_truth_says_why(tmp_path, capsys):
    code = main(["discover", "--quiet", "--threshold", "0.9", "--n-prompts", "4", "--seq-len", "8", "--methods",
                 "activation", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "the planted ground truth was not recovered exactly" in err and "precision" in err, err
