"""A newcomer adds a corruption in one file of their own and it reaches the command line,
``discover``, ``analyze``'s comparison, sweeps and the advice a "no signal" result gives: nothing in
p0circuit lists corruptions by hand (each list is read from the registry)."""

import json
import textwrap

import pytest

import p0circuit as p0
from p0circuit.patching.corruptions import CORRUPTIONS, advice
from p0circuit.core.plugins import load_plugin
from p0circuit.surfaces.cli import main
from p0circuit.surfaces.sweep import SweepConfig, run_sweep

PLUGIN = textwrap.dedent('''
    """My corruption: the first token replaced by token 3, every position kept."""
    from dataclasses import dataclass
    from typing import ClassVar

    from p0circuit import Corruption
    from p0circuit.patching.corruptions import Prepared


    @dataclass(frozen=True)
    class FirstToThree(Corruption):
        name: ClassVar[str] = "first_to_three"
        summary: ClassVar[str] = "puts token 3 at position 0"
        sees_bos_token: ClassVar[bool] = True

        def prepare(self, model, tokens):
            corrupt = tokens.clone()
            corrupt[:, 0] = 3
            return Prepared(self, tokens, corrupt)
''')


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mine") / "my_corruption.py"
    path.write_text(PLUGIN)
    cls = load_plugin(str(path)).FirstToThree
    CORRUPTIONS[cls.name] = cls
    yield path
    CORRUPTIONS.pop(cls.name, None)


def test_it_reaches_discover_advice_analyze_sweeps_and_the_cli(plugin_file, planted_models, tmp_path):
    pm = planted_models("bos")  # a sink built on the BOS token: the plugin's corruption sees it
    toks = p0.probe_tokens(pm.model, 8, 12, seed=0, regular=True, bos=True)
    circuit = p0.discover(pm.model, toks, method="activation", corruption="first_to_three", metric="norm_ratio:1", bos=True)
    assert circuit.settings["corruption"] == "first_to_three" and circuit.nodes

    assert "'first_to_three' (puts token 3 at position 0)" in advice("shift", bos_at_p0=True)

    result = p0.analyze(pm, out=tmp_path / "analysis", progress=False, bos=(True,), n_prompts=8, length=12,
                        lengths=(), neurons_keep=4)
    compared = result["variations"]["with_bos"]["corruption"]
    assert "first_to_three" in compared and compared["first_to_three"].get("signal") is not None

    config = SweepConfig(models=["planted:bos"], corruptions=["first_to_three"], methods=["activation"],
                         metrics=["norm_ratio:1"], n_prompts=4, seq_len=10, plugins=[str(plugin_file)])
    run_sweep(config, tmp_path / "sweep", progress=False)
    (record,) = [json.loads(line) for line in (tmp_path / "sweep" / "results.jsonl").read_text().splitlines()]
    assert record["cell"]["corruption"] == "first_to_three"

    assert main(["discover", "--plugin", str(plugin_file), "--model", "planted:bos", "--bos", "--corruption",
                 "first_to_three", "--metric", "norm_ratio:1", "--methods", "activation", "--out", str(tmp_path / "cli"), "--quiet"]) in (0, 1)  # 1: ran, not the plant's exact circuit
    assert json.loads(next((tmp_path / "cli").rglob("circuit_activation.json")).read_text())["settings"][
        "corruption"] == "first_to_three"


def test_a_sweep_checks_a_user_corruption_that_lengthens_prompts(tmp_path):
    """The sweep's length check asks the corruption itself (its prepared prompts), not a list of names."""
    import torch
    from dataclasses import dataclass
    from typing import ClassVar

    from p0circuit.patching.corruptions import Prepared
    from p0circuit.surfaces.sweep.runner import CellsFailed

    @dataclass(frozen=True)
    class PrependTwo(p0.Corruption):
        name: ClassVar[str] = "prepend_two_test"

        def prepare(self, model, tokens):
            return Prepared(self, tokens, torch.cat([tokens[:, :2], tokens], dim=1), offset=2)

    try:
        config = SweepConfig(models=["planted:rope"], corruptions=["prepend_two_test"], methods=["activation"],
                             n_prompts=2, seq_len=63)  # the planted model's n_ctx is 64
        with pytest.raises(CellsFailed, match="under 'prepend_two_test', whose corrupted prompts are longer by 2 "
                                              "tokens: set seq_len <= 62"):
            run_sweep(config, tmp_path, progress=False)
    finally:
        CORRUPTIONS.pop("prepend_two_test", None)
