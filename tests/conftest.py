"""Shared fixtures: planted models are built once per session (each build takes ~1-3 s)."""

import os

import pytest

import typecheck
from tiers import FAST

typecheck.install()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch and p0circuit are imported where they are used (below, and by the test modules): under pytest -n N the
# controlling process, which collects no test, then starts the workers without paying for importing them


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # pytest -n N: the cores shared out, here and in subprocesses
        import torch  # noqa: F401

        from p0circuit.core.threads import set_threads  # a fixed share each: p0circuit does not adapt it

        set_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

@pytest.fixture(autouse=True)
def _an_empty_working_directory(tmp_path_factory, monkeypatch):
    """Every test runs in an empty directory of its own: none reads or writes the directory the suite was started
    in, so what a user left there (the ``runs/`` of the README's ``p0circuit discover``) changes no result, and no
    test leaves files behind in it. Tests read the repository's files by their path (``docblocks.ROOT``)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


REAL_MODULES = {"test_real.py", "test_gemma3.py", "test_qwen.py", "test_hf_oracle_real.py"}
"""Modules whose tests load a real model (marker ``real``)."""
REAL_NOTEBOOKS = ("05_", "06_")
"""Notebooks that load a real model."""
PROCESS_TESTS = {"test_reliability.py", "test_determinism.py", "test_load_memory.py", "test_sweep.py::test_killed_sweep_resumes",
                 "test_hostile_inputs.py::test_a_failing_cell_with_two_workers_keeps_the_others",
                 "test_names.py::test_cheap_refusals_take_a_fraction_of_a_model_build",
                 "test_checkpoints.py::test_pythia_checkpoint_index_path_offline",
                 "test_report.py::test_report_in_a_headless_browser",
                 "test_analysis.py::test_the_analysis_report_in_a_headless_browser"}
"""Tests that kill, spawn or pool processes (marker ``processes``): fresh Python processes timed as a user meets
them, a headless browser."""
SURFACE_TESTS = {"test_cli.py", "test_report.py", "test_docs_figures.py",
                 "test_names.py::test_discover_defaults_to_a_directory_per_model_and_never_overwrites_another",
                 "test_names.py::test_discover_writes_strict_json_and_says_once_when_svg_is_skipped",
                 "test_hostile_inputs.py::test_the_valid_arguments_run",
                 "test_hostile_inputs.py::test_cli_read_only_directory",
                 "test_user_corruption.py::test_it_reaches_discover_advice_analyze_sweeps_and_the_cli",
                 "test_guarded.py::test_a_planted_discovery_that_misses_the_truth_says_why"}
"""The command line's and the sweep report's end-to-end tests (marker ``surfaces``): whole commands with their
files, figures and messages, over the engine the fast tier tests directly."""
TIER_MARKERS = ("real", "notebook", "processes", "surfaces")
"""What the fast tier leaves out."""

if FAST:  # modules the fast tier leaves out whole are not even imported
    collect_ignore = sorted(REAL_MODULES | {m for m in PROCESS_TESTS | SURFACE_TESTS if "::" not in m})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    """The tiers: ``real``, ``notebook``, ``processes`` and ``surfaces`` mark what the fast tier (``P0_FAST=1
    python -m pytest``, docs/contributing.md) leaves out; every engine, oracle and differential test
    stays in it (``tiers``). The markers also select on their own (``-m real``)."""
    for item in items:
        module = item.path.name
        if module in REAL_MODULES or (module == "test_notebooks.py" and any(n in item.name for n in REAL_NOTEBOOKS)):
            item.add_marker(pytest.mark.real)
        if module == "test_notebooks.py" and item.name != "test_a_changed_printed_value_is_caught":
            item.add_marker(pytest.mark.notebook)
        if module in PROCESS_TESTS or f"{module}::{item.originalname}" in PROCESS_TESTS:
            item.add_marker(pytest.mark.processes)
        if module in SURFACE_TESTS or f"{module}::{item.originalname}" in SURFACE_TESTS:
            item.add_marker(pytest.mark.surfaces)
        if module in REAL_MODULES:  # pytest -n N --dist loadgroup: each real model loaded by one worker
            _group(config, item, module)
        if module == "test_differential.py":  # its budget test reads what the comparison counted, in that process
            _group(config, item, module)
    items.sort(key=lambda i: not (i.get_closest_marker("real") or i.get_closest_marker("notebook")))
    # (stable: the longest work, the real models' groups and the notebooks, is handed out first, so that no
    # worker is left with a long test while the other has finished)
    if FAST:
        heavy = [i for i in items if any(i.get_closest_marker(m) for m in TIER_MARKERS)]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [i for i in items if i not in heavy]


def _group(config, item, name):
    """Put ``item`` in xdist group ``name``. pytest-xdist (3.8) tells the controller an item's group by appending
    ``@name`` to its node id on the worker, through ``item._nodeid``; pytest 9.2 builds the node id from ``item._id``
    instead, so the suffix never reached the controller, and each group's tests were spread over both workers (each
    loading the real model: measured on 2026-12-04). The suffix is put on ``_id`` here, on workers that group."""
    item.add_marker(pytest.mark.xdist_group(name))
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup") and hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{name}")


from p0circuit.core.entries import VARIANTS  # noqa: E402 (after the type checker is installed; imports no torch)

PLANT_VARIANTS = {**VARIANTS, "sink1": {"sink_pos": 1}, "sink1_nope": {"sink_pos": 1, "pos": "nope"}}
"""The named plants (``planted:<variant>``) and two the tests build besides (the transition-stage sink at position 1)."""


@pytest.fixture(scope="session")
def planted_models():
    """Lazily built planted models keyed by variant name."""
    built = {}

    def get(name):
        if name not in built:
            from p0circuit.models.planted import build_planted

            built[name] = build_planted(**PLANT_VARIANTS[name])
        return built[name]

    return get


@pytest.fixture(scope="session")
def planted(planted_models):
    """The default planted model (RoPE, circuit at layers 0-1, sink at position 0)."""
    return planted_models("rope")


@pytest.fixture
def gguf_parsed_once(monkeypatch):
    """transformers' GGUF load builds one ``gguf.GGUFReader`` for the config and another for the
    weights, each parsing the whole file again (Gemma 3's metadata: about 14 s a parse here); in a
    test that uses this fixture, one reader per (path, mode) serves every call."""
    import functools

    import gguf

    monkeypatch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))


@pytest.fixture(scope="module")
def user_corruption():
    """A user's corruption from its own file (``tests/plugins/trade_first_two.py``), registered
    through :func:`p0circuit.core.plugins.load_plugin` for the tests of one module and unregistered after,
    so that tests which list the built-in corruptions see only those."""
    from pathlib import Path

    from p0circuit.patching.corruptions import CORRUPTIONS
    from p0circuit.core.plugins import load_plugin

    cls = load_plugin(str(Path(__file__).parent / "plugins" / "trade_first_two.py")).TradeFirstTwo
    CORRUPTIONS[cls.name] = cls  # the module is imported once per process; register it again after a teardown
    yield cls
    CORRUPTIONS.pop(cls.name, None)


def random_tokens(n, length, vocab, seed):
    """Uniform random prompts."""
    import torch

    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: a refusal (of a damaged state, another version) must come first."""
    from p0circuit.models import resolve
    from p0circuit.studies.analysis import run as analysis_run

    def no_build(*args, **kwargs):
        raise AssertionError("the model was loaded before the analysis' inputs and state file were checked")

    monkeypatch.setattr(resolve, "load_model", no_build)
    monkeypatch.setattr(analysis_run, "load_model", no_build)
