import json

import pytest

from p0circuit.studies.analysis.settings import number_fields

from p0circuit.surfaces.cli import main


def test_discover_on_the_plant(tmp_path, capsys):
    status = main(["discover", "--out", str(tmp_path), "--n-prompts", "8", "--seq-len", "16"])
    out = capsys.readouterr().out
    assert status == 0
    assert "node_precision=1.000, node_recall=1.000, node_auroc=1.000" in out
    assert "edge_precision=1.000, edge_recall=1.000, edge_auroc=1.000" in out
    saved = json.loads((tmp_path / "circuit_path.json").read_text())
    assert "M1@0->A2.H0@0.k" in saved["edges"]
    assert (tmp_path / "circuit_activation.dot").exists() and (tmp_path / "sink_report.json").exists()


def test_discover_bad_checkpoint(tmp_path, capsys):
    assert main(["discover", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("p0circuit: error: model entry 'checkpoint:") and "missing' does not exist" in err


def test_survey_with_a_local_checkpoint(tmp_path, capsys):
    from family_configs import make_checkpoint

    path = make_checkpoint("llama", tmp_path / "ck", with_tokenizer=True)
    assert main(["survey", "--checkpoint", str(path), "--out", str(tmp_path), "--n-prompts", "4"]) == 0
    assert "wrote" in capsys.readouterr().out
    import pandas as pd

    frame = pd.read_csv(tmp_path / "survey.csv", index_col="model")
    assert len(frame) == 11  # 10 built-in models + the checkpoint
    assert frame.loc["planted learned", "identified_by"] == "position embedding"
    assert frame.loc[str(path), "kind"] == "checkpoint" and frame.loc[str(path), "positions"] == "rope"


def test_discover_options_and_budgets(tmp_path, capsys):
    """--layers/--nodes narrow the candidates; the edge budget prunes path candidates through an
    activation pass; the node budget refuses with the ways to narrow."""
    out = tmp_path / "d"
    args = ["discover", "--out", str(out), "--n-prompts", "6", "--seq-len", "12", "--quiet"]
    assert main(args + ["--layers", "0-1", "--methods", "activation", "--metric", "norm_ratio:1"]) == 0  # finds the truth
    saved = json.loads((out / "circuit_activation.json").read_text())
    assert saved["node_effects"] and all(n.startswith(("A0", "A1", "M0", "M1")) for n in saved["node_effects"])
    assert main(args + ["--methods", "path", "--edge-budget", "10"]) == 2  # other settings: never silently over it
    assert "with other settings (layers='0-1', methods=['activation'], metric='norm_ratio:1')" in capsys.readouterr().err
    args.append("--force")
    assert main(args + ["--methods", "path", "--edge-budget", "10"]) == 0
    saved = json.loads((out / "circuit_path.json").read_text())
    assert "activation pass" in saved["settings"]["candidates"] and "M1@0->A2.H0@0.k" in saved["edges"]
    assert main(args + ["--node-budget", "5"]) == 2
    assert "more than the node budget of 5" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["out_is_a_file", "seed_string", "seed_too_big", "not_utf8", "n_prompts_zero",
                                  "lr_nan", "lr_inf"])
def test_the_command_line_never_shows_a_traceback(tmp_path, capsys, case):
    """Issue 14, class 5: one line on stderr naming the problem and the fix, exit status 2."""
    from p0circuit.surfaces.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    config = tmp_path / "c.toml"
    argv = {
        "out_is_a_file": ["discover", "--out", str(afile), "--quiet"],
        "seed_string": ["sweep", str(config)],
        "seed_too_big": ["sweep", str(config)],
        "not_utf8": ["sweep", str(config)],
        "n_prompts_zero": ["discover", "--n-prompts", "0", "--quiet", "--out", str(tmp_path / "o")],
        "lr_nan": ["train", "--lr", "nan", "--out", str(tmp_path / "t")],
        "lr_inf": ["train", "--lr", "inf", "--out", str(tmp_path / "t")],
    }[case]
    if case == "seed_string":
        config.write_text('[sweep]\nmodels = ["planted:rope"]\nseed = "abc"\n')
    elif case == "seed_too_big":
        config.write_text('[sweep]\nmodels = ["planted:rope"]\nseed = 18446744073709551615\n')
    elif case == "not_utf8":
        config.write_bytes(b"\xff\xfe[sweep]")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("p0circuit: error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "t").exists()  # no partial output


def test_help_needs_no_torch():
    """``p0circuit --help`` answers at once: the command line imports neither torch nor
    TransformerLens until a subcommand runs (it took about 6 s when it did)."""
    import subprocess
    import sys

    code = "import sys, p0circuit.surfaces.cli as c; c.build_parser(); print(sorted(m for m in ('torch', 'transformer_lens') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_analysis_settings_are_refused_before_torch(tmp_path):
    """``p0circuit analyze`` checks its settings (and its model entry) before it imports torch: a bad option
    is refused in well under a second, naming the option."""
    import subprocess
    import sys

    code = ("import sys; from p0circuit.surfaces.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    for flag, value, words in (("--ig-steps", "65", "ig_steps (--ig-steps) is 65, more than 64"),
                               ("--n-prompts", "1", "n_prompts (--n-prompts) must be a whole number >= 2")):
        done = subprocess.run([sys.executable, "-c", code, "analyze", flag, value, "--out", str(tmp_path / "a")],
                              capture_output=True, text=True, check=True)
        assert done.stdout.split() == ["2", "False"] and words in done.stderr, (done.stdout, done.stderr)


def test_the_command_line_offers_what_the_registries_hold():
    from p0circuit.core import choices
    from p0circuit.patching import CORRUPTIONS, METHODS

    # read from the defining modules' source (no list of names to keep in step), equal to the registries
    assert list(choices.builtin("METHODS")) == sorted(METHODS) and list(choices.builtin("CORRUPTIONS")) == sorted(CORRUPTIONS)


def test_the_analyze_options_are_the_settings_fields():
    """``p0circuit analyze``'s number options, defaults and help are ``AnalysisSettings``' own (every number
    field, those whose default is a shared constant included)."""
    from dataclasses import fields

    from p0circuit.studies.analysis.settings import AnalysisSettings

    numbers = {f.name: f.default for f in fields(AnalysisSettings) if type(f.default) in (int, float)}
    assert {k: d for k, (d, _) in number_fields().items()} == numbers
    assert all(doc for _, doc in number_fields().values())


def test_analyze_help_names_options_not_python(capsys):
    """The analysis settings' help comes from their docstrings: a setting named there reads as its option
    (``first_tokens`` -> --first-tokens) and no reStructuredText backticks reach the terminal."""
    from p0circuit.surfaces.cli import main

    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out
    assert "--first-tokens;" in " ".join(out.split())


def test_a_newcomers_mistakes_are_named_with_the_option_and_a_next_step(tmp_path, capsys):
    """A prompt count or length below its least is refused by its option's name before any model is built (was: the
    internal make_prompts, after the load); a missing sweep config names the configs beside it; --workers 0 says
    what the option is."""
    import subprocess
    import sys

    from p0circuit.surfaces.cli import main

    code = ("import sys; from p0circuit.surfaces.cli import main; code = main(['discover', '--n-prompts', '-1', '--out', "
            f"{str(tmp_path / 'o')!r}]); print(code, sorted(m for m in ('torch',) if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.split() == ["2", "[]"] and "--n-prompts -1: must be a whole number >= 1" in run.stderr
    assert main(["discover", "--seq-len", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "--seq-len 1: must be a whole number >= 2" in capsys.readouterr().err
    (tmp_path / "small.toml").write_text('[sweep]\nmodels = ["planted:rope"]\n')
    assert main(["sweep", str(tmp_path / "smal.toml"), "--dry-run"]) == 2
    assert f"does not exist; {tmp_path} holds small.toml" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "small.toml"), "--workers", "0", "--out", str(tmp_path / "s")]) == 2
    assert "workers=0 must be >= 1 (--workers: processes running cells at once)" in capsys.readouterr().err


def test_a_misspelled_command_or_option_names_the_nearest(capsys):
    """argparse's own errors for a command or option that does not exist name the nearest valid one (exit 2, one line,
    no traceback); a word near nothing gets no guess."""
    from p0circuit.surfaces.cli import main

    for argv, said in ((["analyse"], "did you mean 'analyze'?"), (["analyze", "--modle", "real:smollm2"],
                                                                   "did you mean '--model'?"),
                       (["sweep", "x.toml", "--dry-rn"], "did you mean '--dry-run'?")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and said in err and "Traceback" not in err, err
    with pytest.raises(SystemExit):
        main(["qqqqqq"])
    assert "did you mean" not in capsys.readouterr().err
