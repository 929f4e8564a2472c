"""The analysis' records (``p0circuit/studies/analysis/records.py``): a state file or an ``analysis.json``
of another schema version, or with none, is refused with what to do, a state before any model is loaded;
``from_dict`` names a missing or unknown key. (That docs/records.md names only keys the planted model's
``analysis.json`` has is checked in tests/test_analysis.py, on its analysis.)"""

import json
from dataclasses import asdict

import pytest

import p0circuit as p0
from p0circuit.studies.analysis import AnalysisSettings, analyze
from p0circuit.studies.analysis import run as analysis_run
from p0circuit.studies.analysis.atlas import page
from p0circuit.studies.analysis.records import (ABSENT, SCHEMA_VERSION, AnalysisRecord, OnsetRow, StateFile,
                                                StateHeader)
from p0circuit.studies.analysis.settings import STATE, precheck, read_state
from p0circuit.studies.analysis.summaries import Memory, Threads, Timing, Verdict
from p0circuit.studies.analysis.write import markdown
from p0circuit.surfaces.cli import main

SMALL = dict(n_prompts=4, length=8, bos=(False,))


def _header(settings: AnalysisSettings, model: str = "planted:rope") -> dict:
    return {"model": model, "settings": json.loads(json.dumps(asdict(settings))),
            "prompt_source": "4 regular random-id prompts", "prompts": {"without_bos": "0123456789abcdef"}}


def _write_state(tmp_path, **extra) -> None:
    """A state file as p0circuit wrote it before the records were versioned, plus ``extra`` keys."""
    steps = {analysis_run.UNIT: {"value": None, "seconds": 0.01}}
    (tmp_path / STATE).write_text(json.dumps({**extra, "header": _header(AnalysisSettings(**SMALL)), "steps": steps}))



def test_a_state_without_a_version_is_refused_before_the_model_loads(tmp_path, no_model, capsys):
    _write_state(tmp_path)  # today's matching header and settings: only the version is wrong
    said = [f"{tmp_path / STATE} has no schema version", f"reads schema version {SCHEMA_VERSION} only",
            "--fresh"]
    with pytest.raises(p0.ConfigError) as err:
        precheck(tmp_path, "planted:rope", AnalysisSettings(**SMALL), resume=True)
    assert all(s in str(err.value) for s in said), str(err.value)
    with pytest.raises(p0.ConfigError, match="has no schema version"):
        analyze("planted:rope", out=tmp_path, progress=False, **SMALL)
    code = main(["analyze", "--model", "planted:rope", "--out", str(tmp_path), "--n-prompts", "4", "--length", "8",
                 "--bos", "without", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said), err
    precheck(tmp_path, "planted:rope", AnalysisSettings(**SMALL), resume=False)  # --fresh: replaced, not read


def test_a_state_of_a_newer_version_is_refused_before_the_model_loads(tmp_path, no_model):
    _write_state(tmp_path, schema=SCHEMA_VERSION + 1)
    with pytest.raises(p0.ConfigError) as err:
        analyze("planted:rope", out=tmp_path, progress=False, **SMALL)
    text = str(err.value)
    assert f"has schema version {SCHEMA_VERSION + 1}" in text and "newer p0circuit" in text, text
    assert f"reads schema version {SCHEMA_VERSION} only" in text and "--fresh" in text, text
    for bad in ("1", True, 0):  # not the version: a string, a bool, an older number
        _write_state(tmp_path, schema=bad)
        with pytest.raises(p0.ConfigError, match=f"has schema version {bad!r}"):
            read_state(tmp_path / STATE)


def test_a_state_of_this_version_reads_back_as_its_record(tmp_path):
    _write_state(tmp_path, schema=SCHEMA_VERSION)
    state = read_state(tmp_path / STATE)
    assert isinstance(state, StateFile) and isinstance(state.header, StateHeader)
    assert state.header.model == "planted:rope" and list(state.steps) == [analysis_run.UNIT]
    assert state.to_dict() == json.loads((tmp_path / STATE).read_text())
    assert list(state.to_dict())[0] == "schema"
    precheck(tmp_path, "planted:rope", AnalysisSettings(**SMALL), resume=True)  # the same analysis: no refusal
    (tmp_path / STATE).write_text("[1, 2]")
    with pytest.raises(p0.ConfigError, match="holds a JSON list, not an object"):
        read_state(tmp_path / STATE)
    (tmp_path / STATE).write_text("{")
    with pytest.raises(p0.ConfigError, match="not valid JSON"):
        read_state(tmp_path / STATE)


def test_from_dict_names_an_unknown_or_missing_key():
    row = {"layer": 2, "where": "first ','", "at": 5, "token": ",", "prompt_set": "8 passages",
           "skipped": "no prompt holds ','"}
    skipped = OnsetRow.from_dict(row)
    assert skipped.nodes is ABSENT and skipped.to_dict() == row  # an absent key stays absent
    with pytest.raises(p0.ConfigError, match=r"unknown key\(s\) \['bogus'\]"):
        OnsetRow.from_dict({**row, "bogus": 1})
    with pytest.raises(p0.ConfigError, match=r"lacks the key\(s\) \['where'\]"):
        OnsetRow.from_dict({k: v for k, v in row.items() if k != "where"})
    state = {"schema": SCHEMA_VERSION, "header": _header(AnalysisSettings()), "steps": {}}
    with pytest.raises(p0.ConfigError, match=r"its 'header' has the unknown key\(s\) \['extra'\]"):
        StateFile.from_dict({**state, "header": {**state["header"], "extra": 0}})
    with pytest.raises(p0.ConfigError, match=r"lacks the key\(s\) \['steps'\]"):
        StateFile.from_dict({"schema": SCHEMA_VERSION, "header": state["header"]})


def _analysis(**changes) -> dict:
    """A small analysis.json of this version (no onset measured)."""
    d = AnalysisRecord(model="planted:rope", settings=json.loads(json.dumps(asdict(AnalysisSettings()))),
                       prompt_source="8 regular random-id prompts", n_layers=4, n_heads=4, sinks={}, onsets={},
                       variations={}, verdict=Verdict(claim="not measured (no run without BOS)", parts={}),
                       timing=Timing(seconds=0.0, this_call=0.0, forward_s=0.01, import_s=0.0, load_s=None,
                                     threads=Threads(threads=1, policy="fixed", others_cores=0.0, dropped=0, cpus=2),
                                     forwards=0.0, with_grad=0.0, forwards_by_step={}, timed_forwards=0.0, slowdown=None,
                                     others_cores=0.0, processes=[], onsets_left_out={}, sinks_left_out={}, steps={},
                                     predicted_forwards={}, parts={}, eta=[]),
                       memory=Memory(weights=None, at_start=None, process_peak=None, steps={}), bos_token=None).to_dict()
    return {**d, **changes}


def test_an_analysis_of_another_version_is_refused_by_its_readers(tmp_path):
    good = _analysis()
    assert good["schema"] == SCHEMA_VERSION and "truth" not in good
    assert AnalysisRecord.from_dict(good).to_dict() == good
    assert "P0-sink analysis of planted:rope" in markdown(good) and "planted:rope" in page([good])
    old = {k: v for k, v in good.items() if k != "schema"}
    for reader in (markdown, lambda d: page([d]), AnalysisRecord.from_dict):
        with pytest.raises(p0.ConfigError, match=f"has no schema version.*reads schema version {SCHEMA_VERSION}"):
            reader(old)
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(_analysis(schema=SCHEMA_VERSION + 1)))
    with pytest.raises(p0.ConfigError, match=f"{path} has schema version {SCHEMA_VERSION + 1}.*--fresh"):
        AnalysisRecord.read(path)
    bad_row = _analysis(onsets={"without_bos": [{"layer": 1, "where": "P0", "at": 0, "token": None, "prompt_set": "x",
                                                 "nodez": {}}]})
    with pytest.raises(p0.ConfigError, match=r"onsets\['without_bos'\]\[0\]\"? has the unknown key\(s\) \['nodez'\]"):
        AnalysisRecord.from_dict(bad_row)
    with pytest.raises(p0.ConfigError, match=r"unknown key\(s\) \['extra'\]"):
        AnalysisRecord.from_dict(_analysis(extra=1))


def test_records_doc_lists_the_studies_records():
    """docs/records.md's list of the studies' records is the classes of ``p0circuit/studies/findings.py``, every key
    with its type and docstring (written from them: ``P0_WRITE_DOCS=1``)."""
    import dataclasses

    import docblocks
    from p0circuit.core.record import Record, describe_records
    from p0circuit.studies import findings

    classes = [c for c in vars(findings).values() if isinstance(c, type) and issubclass(c, Record) and c is not Record
               and dataclasses.is_dataclass(c) and c.__module__ == findings.__name__]
    assert len(classes) >= 15
    docblocks.check("docs/records.md", "findings", describe_records(classes))


def test_records_doc_lists_the_analysis_parts():
    """docs/records.md's list of the records nested in an onset row and at the top level of analysis.json (the passes,
    the variations, the verdict, timing, memory, a sink position) and of a sweep cell's record is the classes of
    ``passes.py``, ``summaries.py`` and ``surfaces/sweep/record.py``, every key with its type and docstring (written from
    them: ``P0_WRITE_DOCS=1``); every one of them is reached from AnalysisRecord's fields, so none is documented and
    never read."""
    import dataclasses
    import typing

    import docblocks
    from p0circuit.core.record import Record, describe_records
    from p0circuit.studies.analysis import passes, summaries
    from p0circuit.surfaces.sweep import record as sweep_record

    def own(module):
        return [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Record)
                and dataclasses.is_dataclass(c) and c.__module__ == module.__name__]

    classes = own(passes) + own(summaries)
    docblocks.check("docs/records.md", "parts", describe_records(classes))
    docblocks.check("docs/records.md", "sweep", describe_records(own(sweep_record)))
    reached, todo = set(), [AnalysisRecord]
    while todo:  # every record class a field of AnalysisRecord reaches, however deep
        cls = todo.pop()
        for hint in typing.get_type_hints(cls).values():
            stack = [hint]
            while stack:
                h = stack.pop()
                stack += list(typing.get_args(h))
                if isinstance(h, type) and issubclass(h, Record) and h not in reached:
                    reached.add(h)
                    todo.append(h)
    unread = [c.__name__ for c in classes if not any(issubclass(r, c) for r in reached)]  # (a base: by its records)
    assert not unread, unread


def test_a_fact_said_twice_in_a_record_must_agree():
    """A search record's ``size`` is the count of what it keeps (counted when left out; a wrong one, or kept names that
    are not names, refused when made and by key path when read); a sink summary's ``bos`` is its setting's key (refused
    by key path in analysis.json and in the state file)."""
    from p0circuit.core.searches import EdgeSearch, NodeSearch
    from p0circuit.studies.analysis.passes import NodeCircuit

    made = dict(nodes=["A0.H0@0", "M0@0"], candidates=5, faithfulness=0.95, denoising=None, completeness=0.9,
                faithful=True)
    assert NodeSearch(**made).size == 2 and NodeSearch(**made).to_dict()["size"] == 2
    assert EdgeSearch(edges=[], candidates=0, faithfulness=None, completeness=None, faithful=False).size == 0
    assert NodeSearch(**made).replace(nodes=["M0@0"]).size == 1 and NodeSearch(**made).replace(why="x").size == 2
    for bad, said in ((dict(size=3), "size=3 but it keeps 2 nodes"), (dict(size=True), "size=True")):
        with pytest.raises(p0.BadInputError, match=said):
            NodeSearch(**{**made, **bad})
    row = {"layer": 1, "where": "P0", "at": 0, "token": None, "prompt_set": "x",
           "circuit": {**NodeSearch(**made).to_dict(), "size": 7}}
    with pytest.raises(p0.ConfigError, match=r"its key circuit must be NodeCircuit with keys that agree, got NodeCircuit: "
                                             r"size=7 but it keeps 2 nodes"):
        OnsetRow.from_dict(row)
    assert isinstance(OnsetRow.from_dict({**row, "circuit": NodeSearch(**made).to_dict()}).circuit, NodeCircuit)
    good = json.loads(json.dumps(_analysis(sinks={"without_bos": _summary(bos=False)})))
    AnalysisRecord.from_dict(good)
    with pytest.raises(p0.ConfigError, match=r"its key sinks\['without_bos'\]\.bos must be False \(the setting "
                                             r"'without_bos'\), got True"):
        AnalysisRecord.from_dict(_analysis(sinks={"without_bos": _summary(bos=True)}))
    state = {"schema": SCHEMA_VERSION, "header": _header(AnalysisSettings()),
             "steps": {"with_bos/sinks": {"value": _summary(bos=False), "seconds": 1.0}}}
    with pytest.raises(p0.ConfigError, match=r"steps\['with_bos/sinks'\]\.value\.bos must be True"):
        StateFile.from_dict(state)


def _summary(bos: bool) -> dict:
    """A sink summary of two blocks (a SinkSummary's JSON)."""
    return {"bos": bos, "sink_rate": 0.5, "norm_stages": [["onset", 1, 6.0]], "massive_dims": [], "sink_positions": [],
            "norm_ratio": [1.0, 6.0], "alpha": [[0.2], [0.9]], "sink_rate_per_layer": [0.0, 0.5],
            "direction_stability": None, "direction_to_onset": None, "direction_stability_ordinary": None,
            "direction_stability_unmassive": None, "n_prompts": 8, "seq_len": 16}


def test_a_record_read_as_a_circuit_or_a_cell_refuses_what_is_not_one():
    """``to_circuit`` of a search record that keeps a name which is no node, and a sweep cell record's ``grid`` whose
    coordinates name an unknown model, raise p0circuit's errors naming the fix, never a raw exception."""
    from p0circuit.core.searches import NodeSearch
    from p0circuit.surfaces.sweep.record import CellRecord

    bad = NodeSearch(nodes=["bogus"], candidates=1, faithfulness=1.0, denoising=None, completeness=1.0, faithful=True)
    with pytest.raises(p0.BadInputError, match="unknown node name 'bogus'; expected e.g. 'A0.H1@0'"):
        bad.to_circuit()
    cell = {"model": "planted:nope_x", "prompts": "auto", "corruption": "shift", "method": "path", "metric": "attn_to_p0",
            "n_prompts": 4, "seq_len": 8, "seed": 0, "threshold": 0.1}
    record = CellRecord.from_dict({"schema": 1, "key": "k", "cell": cell, "prompts": "x", "n_prompts": 4, "seq_len": 8,
                                   "circuit": p0.Circuit(nodes=()).to_dict(), "signal": True, "interpretation": "",
                                   "sink_report": {}, "seconds": 0.1})
    with pytest.raises(p0.ConfigError, match="did you mean 'planted:nope'"):
        record.grid  # noqa: B018
