"""The design's promises: facts said once (levels, registries), keyword-only entry points, one
model resolver, one probe maker, open extension points (a corruption or a method is one class or
one file), and the three bugs the design review found."""

import inspect
import json
from pathlib import Path
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import p0circuit as p0
from p0circuit.surfaces.cli import build_parser, main
from p0circuit.studies.discovery.locate import locate
from p0circuit.core.entries import check_metric_entry, check_model_entry
from p0circuit.models.resolve import load_any_checkpoint, load_model
from p0circuit.patching import CORRUPTIONS, METHODS, Corruption, Method, register
from p0circuit.patching.corruptions import Prepared
from p0circuit.patching.metrics import metric_from_entry
from p0circuit.surfaces.sweep import SweepConfig
from p0circuit.models.tokens import p0_like_positions, probe_tokens
from tolerance import close

GENERIC = p0.ModelSpec(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=50, n_ctx=24, seed=1)


@pytest.fixture(scope="module")
def generic():
    return GENERIC.build()


def plant_tokens(pm, n=16, length=24):
    return probe_tokens(pm.model, n, length, seed=0, regular=True)


# --- the three bugs of the review -------------------------------------------------------------


def test_attribution_edges_through_discover_gives_an_edge_circuit(planted, generic):
    metric = p0.AttnToP0(heads=list(planted.sink_heads))
    circuit = p0.discover(planted.model, plant_tokens(planted), method="attribution_edges", corruption="shift",
                          metric=metric, threshold=1e-6)
    assert circuit.level == "edge" and circuit.edges and not circuit.node_effects
    assert all("->" in name for name in circuit.edge_effects)
    toks = torch.randint(0, 50, (4, 10), generator=torch.Generator().manual_seed(1))
    other = p0.discover(generic, toks, method="attribution_edges", corruption="shift", metric=p0.NormRatio(1),
                        threshold=0.05)
    assert other.level == "edge" and other.edges and set(other.node_names) == {
        n.name for e in other.edges for n in (e.src, e.dst)}


@pytest.mark.parametrize("fn", [p0.activation_patch, p0.path_patch, p0.attribution_patch, p0.discover,
                                p0.check_attribution])
def test_everything_after_tokens_is_keyword_only(fn):
    params = list(inspect.signature(fn).parameters.values())
    assert [p.name for p in params[:2]] == ["model", "tokens"]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[2:])


@pytest.mark.parametrize("fn", [p0.faithful_circuit, p0.faithful_edges, p0.faithfulness_curve, locate])
def test_a_search_takes_what_it_searches_and_keywords(fn):
    """A search reads its setup from the result (or circuit) it is given, or takes the setup itself: nothing else
    positional."""
    params = list(inspect.signature(fn).parameters.values())
    assert params[0].name in ("result", "circuit", "setup") and "setup" in [p.name for p in params]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[1:])


def test_the_positional_trap_is_a_type_error_not_a_wrong_call(planted):
    toks = plant_tokens(planted, 4, 12)
    with pytest.raises(TypeError, match="positional"):
        p0.attribution_patch(planted.model, toks, None, "shift", p0.NormRatio(1))
    result = p0.attribution_patch(planted.model, toks, nodes=None, corruption="shift", metric=p0.NormRatio(1))
    assert result.level == "node" and result.corruption == "shift"


def test_discover_on_a_training_checkpoint_from_the_cli(tmp_path, capsys):
    train = ["train", "--steps", "4", "--checkpoints", "1", "--warmup", "1", "--layers", "1", "--d-model", "16",
             "--heads", "2", "--d-head", "8", "--seq-len", "16", "--batch-size", "4", "--out", str(tmp_path / "t"),
             "--quiet"]
    assert main(train) == 0
    out = tmp_path / "d"
    assert main(["discover", "--checkpoint", str(tmp_path / "t" / "step_4"), "--out", str(out), "--n-prompts", "4",
                 "--seq-len", "8", "--methods", "activation"]) == 0
    saved = json.loads((out / "circuit_activation.json").read_text())
    assert saved["settings"]["level"] == "node" and saved["node_effects"]
    assert "checkpoint" in capsys.readouterr().out


def test_a_sweep_cell_on_a_training_checkpoint(tmp_path):
    from p0circuit.surfaces.sweep import run_sweep

    assert main(["train", "--steps", "2", "--checkpoints", "1", "--warmup", "1", "--layers", "1", "--d-model", "16",
                 "--heads", "2", "--d-head", "8", "--seq-len", "8", "--batch-size", "2", "--out",
                 str(tmp_path / "t"), "--quiet"]) == 0
    config = SweepConfig(models=[f"checkpoint:{tmp_path / 't' / 'step_2'}"], metrics=["norm_ratio:0"], n_prompts=2,
                         seq_len=6)
    (record,) = run_sweep(config, tmp_path / "sweep", progress=False)
    assert record["circuit"]["settings"]["level"] == "node" and "scores" not in record


# --- registries and levels ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_method_runs_through_discover(planted, name):
    method = METHODS[name]
    circuit = p0.discover(planted.model, plant_tokens(planted, 6, 12), method=name, corruption="shift",
                          metric=p0.NormRatio(1), threshold=0)
    assert circuit.level == method.level == circuit.settings["level"]
    effects = circuit.edge_effects if method.level == "edge" else circuit.node_effects
    assert effects and (circuit.edges if method.level == "edge" else circuit.nodes)
    assert circuit.settings["method"] == name and circuit.interpretation


def test_discover_refuses_options_its_method_does_not_take(planted):
    toks = plant_tokens(planted, 4, 12)
    with pytest.raises(p0.ConfigError, match=r"does not take edges=; methods that do: \['attribution'"):
        p0.discover(planted.model, toks, method="activation", edges=["M0@0->M1@0.mlp_in"], metric=p0.NormRatio(1))
    with pytest.raises(p0.ConfigError, match="unknown method 'acdc'"):
        p0.discover(planted.model, toks, method="acdc")


def test_a_corruption_is_one_class(planted):
    @dataclass(frozen=True)
    class FirstToken(Corruption):
        """A corruption written in a test: every prompt's first token replaced by ``token``."""

        token: int = 1
        name: ClassVar[str] = "first_token_test"

        def prepare(self, model, tokens):
            corrupt = tokens.clone()
            corrupt[:, 0] = self.token
            return Prepared(self, tokens, corrupt)

    try:
        assert CORRUPTIONS["first_token_test"] is FirstToken
        circuit = p0.discover(planted.model, plant_tokens(planted, 6, 12), corruption="first_token_test",
                              metric=p0.NormRatio(1), threshold=0)
        assert circuit.settings["corruption"] == "first_token_test"
        assert "first_token_test" in build_parser()._subparsers._group_actions[0].choices["discover"].format_help()
        assert SweepConfig(corruptions=["first_token_test"]).corruptions == ["first_token_test"]
    finally:
        CORRUPTIONS.pop("first_token_test")


def test_a_method_is_one_registration(planted):
    @p0.takes_options()
    def mlps_only(model, tokens, *, options):
        nodes = [n for n in p0.candidate_nodes(model) if n.kind == p0.Kind.MLP]
        return p0.activation_patch(model, tokens, nodes=nodes, options=options)

    register(Method("mlps_only_test", mlps_only, "node"))
    try:
        circuit = p0.discover(planted.model, plant_tokens(planted, 6, 12), method="mlps_only_test",
                              metric=p0.NormRatio(1))
        assert circuit.node_names == {"M0@0", "M1@0"}
        assert SweepConfig(methods=["mlps_only_test"]).methods == ["mlps_only_test"]
        with pytest.raises(p0.ConfigError, match="already registered"):
            register(Method("mlps_only_test", p0.activation_patch, "node"))
    finally:
        METHODS.pop("mlps_only_test")


def test_one_metric_entry_parser(planted, generic):
    assert metric_from_entry("norm_ratio:1", generic).name == "norm_ratio@L1"
    with pytest.raises(p0.ConfigError, match=r"metric 'norm_ratio:2': the model has blocks 0..1"):
        metric_from_entry("norm_ratio:2", generic)  # past the model's last block: refused here, not deep inside
    with pytest.raises(p0.ConfigError, match=r"sweep.metrics: metric 'norm_ratio:4': the model has blocks 0..3"):
        SweepConfig(metrics=["norm_ratio:4"])  # planted:rope's size is known without building it
    assert metric_from_entry("sink_heads", planted.model, planted.sink_heads).heads == list(planted.sink_heads)
    for bad in ("norm", 3):
        with pytest.raises(p0.ConfigError, match="not valid.*; use one of"):
            check_metric_entry(bad)
    with pytest.raises(p0.ConfigError, match="norm_ratio takes a block number"):
        check_metric_entry("norm_ratio:x")
    with pytest.raises(p0.ConfigError, match=r"sweep.metrics: metric 'norm' not valid"):
        SweepConfig(metrics=["norm"])
    with pytest.raises(p0.ConfigError, match="needs a planted model"):
        metric_from_entry("sink_heads", generic)


# --- views of a result ---------------------------------------------------------------------------


def test_result_table_and_tensor_shaped_like_the_model(planted):
    toks = plant_tokens(planted, 6, 12)
    result = p0.activation_patch(planted.model, toks, metric=p0.NormRatio(1))
    frame = result.to_frame()
    assert list(frame.index[:3]) == sorted(result.names, key=lambda n: -abs(result.normalized[n]))[:3]
    assert frame.loc["M0@0", "kind"] == "mlp" and frame.loc["A0.H1@rest", "head"] == 1
    heads = result.to_tensor("head")
    cfg = planted.model.cfg
    assert heads.shape == (cfg.n_layers, 2, cfg.n_heads) and result.positions == [0, "rest"]
    assert heads[0, 0, 0] == result.normalized["A0.H0@0"] and heads[2, 1, 1] == result.normalized["A2.H1@rest"]
    mlps = result.to_tensor("mlp", normalized=False)
    assert mlps.shape == (cfg.n_layers, 2) and mlps[1, 0] == result.raw["M1@0"]
    partial = p0.activation_patch(planted.model, toks, nodes=["A0.H0@0"], metric=p0.NormRatio(1)).to_tensor()
    assert partial.isnan().sum() == partial.numel() - 1
    edges = p0.path_patch(planted.model, toks, edges=["M0@0->M1@0.mlp_in"], metric=p0.NormRatio(1))
    assert edges.to_frame().loc["M0@0->M1@0.mlp_in", "sender"] == "M0@0"
    with pytest.raises(p0.BadInputError, match="node-level"):
        edges.to_tensor()


def test_str_shows_enough_digits(planted):
    result = p0.activation_patch(planted.model, plant_tokens(planted, 4, 12), nodes=["M0@0"], metric=p0.NormRatio(1))
    assert f"{result.normalized['M0@0']:+.4g}" in str(result)


# --- one resolver, one probe maker --------------------------------------------------------------


def test_model_entries_resolve_in_one_place(tmp_path):
    planted = load_model("planted:rope")
    assert planted.truth is not None and planted.sink_heads and planted.model.cfg.n_layers == 4
    spec = load_model("spec:nope", seed=3)
    assert spec.truth is None and spec.model.cfg.positional_embedding_type == "standard"
    for bad in ("planted:alibi", "spec:mamba", "checkpoint:", "gpt2", 7):
        with pytest.raises(p0.ConfigError, match="not valid|not a string"):
            check_model_entry(bad)
    with pytest.raises(p0.CheckpointError, match="neither spec.json"):
        load_any_checkpoint(tmp_path)
    with pytest.raises(p0.CheckpointError, match="GGUF file .* does not exist"):
        load_any_checkpoint(tmp_path / "model.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(p0.CheckpointError, match="not a readable GGUF file"):
        load_any_checkpoint(tmp_path / "broken.gguf")


def test_probe_tokens_one_meaning_of_regular():
    model = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=3, n_ctx=40).build()
    toks = probe_tokens(model, 64, 40, seed=0, regular=True)
    assert toks.shape == (64, 40)  # every row comes back, none is dropped
    assert not p0_like_positions(toks)[:, 1:].any()  # only position 0 looks like a start
    assert torch.equal(toks, probe_tokens(model, 64, 40, seed=0, regular=True))
    model.p0circuit_bos_id = 2
    plain = probe_tokens(model, 32, 10, seed=1)
    assert not (plain == 2).any()
    with_bos = probe_tokens(model, 32, 10, seed=1, bos=True)
    assert (with_bos[:, 0] == 2).all() and not (with_bos[:, 1:] == 2).any()


# --- renamed rooms answer with their new address --------------------------------------------------


@pytest.mark.parametrize("old,new", [("p0circuit.faithfulness", "p0circuit.patching.faithfulness"),
                                     ("p0circuit.validation", "p0circuit.models.checks"),
                                     ("p0circuit.patching.runs", "PatchJob"),
                                     ("p0circuit.experiments.plotting", "p0circuit.figures.plotting")])
def test_moved_modules_name_their_replacement(old, new):
    with pytest.raises(ImportError, match=new):
        __import__(old)


@pytest.mark.parametrize("old,new,name", [("p0circuit.cli", "p0circuit.surfaces.cli", "main"),
                                          ("p0circuit.metrics.report", "p0circuit.measures.sink_report", "sink_report"),
                                          ("p0circuit.find", "p0circuit.studies.discovery.discover", "discover"),
                                          ("p0circuit.planted.build", "p0circuit.models.planted.build", "build_planted")])
def test_modules_moved_into_layers_still_import_for_a_release(old, new, name):
    """An old path gives the new module, with a FutureWarning that names it (this release only)."""
    import importlib
    import sys

    for key in [k for k in sys.modules if k == old or k.startswith(old + ".")]:
        del sys.modules[key]
    with pytest.warns(FutureWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and hasattr(module, name)


def test_from_an_old_package_import_a_moved_submodule():
    import sys

    for key in [k for k in sys.modules if k.startswith("p0circuit.metrics") or k == "p0circuit.measures.report"]:
        del sys.modules[key]
    with pytest.warns(FutureWarning):
        from p0circuit.metrics import report  # noqa: F401  (the old package, the old submodule name)
    assert report.sink_report is p0.sink_report


def test_removed_names_name_their_replacement():
    with pytest.raises(AttributeError, match="check_attribution"):
        p0.disagreements  # noqa: B018
    from p0circuit.patching import setup

    with pytest.warns(FutureWarning, match="PatchInputs is the former name of p0circuit.Setup"):
        assert setup.PatchInputs is p0.Setup  # one name for one thing; the old one for a release
    with pytest.raises(AttributeError, match="has no attribute 'PatchInput'"):
        setup.PatchInput  # noqa: B018


def test_the_contributor_guide_examples_run(planted):
    """The corruption and the method written out in docs/contributing.md work as the guide says."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "contributing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    try:
        for block in blocks:
            exec(compile(block, "docs/contributing.md", "exec"), {})
        toks = plant_tokens(planted, 6, 12)
        repeated = p0.discover(planted.model, toks, corruption="repeat_first", metric=p0.NormRatio(1), threshold=0)
        assert repeated.settings["corruption"] == "repeat_first" and repeated.node_effects
        mlps = p0.discover(planted.model, toks, method="mlp", metric=p0.NormRatio(1))
        assert mlps.level == "node" and set(mlps.node_effects) == {f"M{l}@{p}" for l in range(4) for p in (0, "rest")}
    finally:
        CORRUPTIONS.pop("repeat_first", None)
        METHODS.pop("mlp", None)


def test_methods_take_exactly_what_they_use_and_reference_changes_only_how(planted):
    """Issue 22: an argument a method cannot use is an error, never dropped; the reference path
    patches the same candidates as the fast path."""
    toks = plant_tokens(planted, 4, 10)
    metric = p0.NormRatio(1)
    with pytest.raises(p0.BadInputError, match="edges= is for edge attribution"):
        p0.discover(planted.model, toks, method="attribution", edges=["M0@0->M1@0.mlp_in"], metric=metric)
    with pytest.raises(p0.BadInputError, match="not both"):
        p0.attribution_patch(planted.model, toks, level="edge", nodes=["M0@0"], edges=["M0@0->M1@0.mlp_in"],
                             metric=metric)
    with pytest.raises(p0.ConfigError, match="does not take reference="):
        p0.discover(planted.model, toks, method="triage", reference=True, metric=metric)
    fast = p0.path_patch(planted.model, toks, metric=metric)
    slow = p0.path_patch(planted.model, toks, metric=metric, reference=True)
    assert fast.names == slow.names  # the same candidates (receivers the metric can see), however computed
    assert all(close(fast.raw[k], slow.raw[k], slow.clean_metric) for k in slow.raw) and fast.raw.keys() == slow.raw.keys()
    assert p0.discover(planted.model, toks, method="attribution", metric=metric, progress=True).level == "node"


def test_no_module_imports_one_that_imports_it_back():
    """Issue 22: no import cycle among p0circuit's modules, counting imports inside functions too
    (the errors <-> args cycle was one of those)."""
    import ast
    from pathlib import Path

    root = Path(p0.__file__).parent
    graph = {}
    for path in root.rglob("*.py"):
        name = ".".join(("p0circuit",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("p0circuit") and not node.level:
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("p0circuit")}
        graph[name] = targets
    # a package imports its own submodules through its __init__ by design; the pairs below are cycles
    pairs = [(a, b) for a, deps in graph.items() for b in deps
             if a != b and a in graph.get(b, set()) and not (b.startswith(a + ".") or a.startswith(b + "."))]
    assert not pairs, pairs
    assert "p0circuit.core.args" not in graph["p0circuit.core.errors"]


def test_ci_runs_exactly_the_readme_test_command():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    command = next(line.split("#")[0].strip() for line in readme.splitlines() if line.rstrip().endswith(
        "# run the tests (two worker processes)"))
    ci = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()]
    assert command.startswith("python -m pytest") and command in ci, (command, ci[-3:])
    assert ci[-1] == command  # the last thing CI does, so its exit status is CI's


def test_every_measured_block_of_the_docs_is_filled_by_its_benchmark_or_test():
    """A figure in the docs sits in a block that a benchmark or test writes (tests/docblocks.py); an
    empty block, or one whose benchmark does not write it, means a figure was never measured or is
    kept by hand."""
    import re

    root = Path(__file__).resolve().parent.parent
    writers = {p.name: p.read_text() for p in [*(root / "benchmarks").glob("*.py"), *(root / "tests").glob("test_*.py")]}
    found = 0
    for doc in [root / "README.md", *(root / "docs").glob("*.md")]:
        for name, body in re.findall(r"<!-- measured:([\w-]+) -->\n(.*?)<!-- /measured:\1 -->", doc.read_text(), re.S):
            found += 1
            assert body.strip(), f"{doc.name}: block {name!r} is empty; run the benchmark that writes it with --write-docs"
            script = re.search(r"`python benchmarks/(\w+\.py)", body)
            spelled = [n for n, text in writers.items() if f'"{name}"' in text or f"'{name}'" in text
                       or f'"{name.rsplit("-", 1)[0]}-' in text]
            assert spelled, f"{doc.name}: no benchmark or test names block {name!r}"
            if script:
                assert script.group(1) in spelled, (doc.name, name, script.group(1), spelled)
    assert found >= 8


def _study_functions(package: Path) -> list[tuple[str, str, set[str]]]:
    """(module path, function name, parameter names) of every function defined in the package, read by AST."""
    import ast

    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                out.append((str(path.relative_to(package.parent)), node.name,
                            {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}))
    return out


BOS_IN_STUDIES = 9
"""Functions of ``studies/`` that take a ``bos`` argument (issue 51's count: 48 before the studies took a Setup, 34
before the analysis took one :class:`~p0circuit.studies.analysis.setting.Setting` per BOS setting). What is left are
the public experiments that take tokens with their explicit BOS claim (eight) and the keyed test's inner form, which
takes the spread's cached state. The test fails when the count grows: lower it as it falls."""


def test_the_studies_hold_one_setup():
    """Issue 51, item 1: no function outside ``patching/`` takes the model, tokens, BOS choice and corruption one by
    one (the studies take a checked :class:`p0circuit.Setup` and what varies); ``bos`` parameters in ``studies/``
    do not grow."""
    package = Path(p0.__file__).resolve().parent
    functions = _study_functions(package)
    def named(params: set[str], *names: str) -> bool:  # a parameter under any of these names
        return bool(params & set(names))

    loose = [f"{m}:{f}" for m, f, params in functions if "/patching/" not in f"/{m}" and named(params, "model")
             and named(params, "tokens", "toks", "prompts", "ids") and named(params, "bos", "prepend_bos")
             and named(params, "corruption", "corrupt", "corr")]
    assert loose == [], f"these take model, tokens, bos and corruption one by one (take a Setup): {loose}"
    bos = [f"{m}:{f}" for m, f, params in functions if "/studies/" in f"/{m}" and "bos" in params]
    assert len(bos) <= BOS_IN_STUDIES, f"{len(bos)} functions of studies/ take bos (at most {BOS_IN_STUDIES}): {bos}"


def test_one_circuit_class_in_the_public_api():
    """Issue 51, item 2: both searches return the one :class:`p0circuit.Circuit` (their typed records attached as
    ``search``/``edge_search``); no other public class is a circuit; the old class names mean Circuit for a release,
    with a FutureWarning that says what the searches return."""
    import warnings

    import p0circuit.patching as patching
    for search in (p0.faithful_circuit, p0.faithful_edges):
        assert inspect.signature(search).return_annotation is p0.Circuit, search.__name__
    assert inspect.signature(p0.faithful_edges).parameters["circuit"].annotation is p0.Circuit
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the public names resolve without the old names' warning
        classes = [n for n in p0.__all__ if isinstance(getattr(p0, n), type) and n.endswith("Circuit")]
    assert classes == ["Circuit"], classes
    for name in ("FaithfulCircuit", "EdgeCircuit"):
        with pytest.warns(FutureWarning, match=f"{name} is gone: faithful_(circuit|edges) returns the one p0circuit.Circuit"):
            assert getattr(p0, name) is p0.Circuit
        assert not hasattr(patching, name)


SHAPE_FACTS = {"parallel_attn_mlp", "attn_only", "num_experts", "experts_per_token", "gated_mlp",
               "use_normalization_before_and_after", "n_key_value_heads"}
"""The configuration fields that say what a block is made of: :class:`p0circuit.patching.shape.BlockShape` reads
them, and no other module of the package does (``models/`` writes them when it builds a configuration)."""


def test_block_shapes_are_read_in_one_place():
    """Issue 51, item 5: one home for block shapes. An AST scan for ``<anything>.cfg.<fact>`` and ``cfg.<fact>`` reads
    of :data:`SHAPE_FACTS` outside ``patching/shape.py`` and ``models/``; and BlockShape gives what the configuration
    says on a grouped-query, a parallel, an attention-only and a post-norm configuration."""
    import ast
    from transformer_lens import HookedTransformerConfig
    from p0circuit.patching.shape import BlockShape

    package = Path(p0.__file__).resolve().parent
    reads = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == "patching/shape.py" or rel.startswith("models/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SHAPE_FACTS:
                owner = node.value
                if (isinstance(owner, ast.Attribute) and owner.attr == "cfg") or (
                        isinstance(owner, ast.Name) and owner.id == "cfg"):
                    reads.append(f"{rel}:{node.lineno} .{node.attr}")
    assert reads == [], f"read the block's shape through BlockShape.of(model): {reads}"

    class M:  # BlockShape reads the configuration alone
        def __init__(self, **kw):
            self.cfg = HookedTransformerConfig(n_layers=2, d_model=16, d_head=4, n_heads=4, d_mlp=32, n_ctx=8,
                                               d_vocab=10, act_fn="silu", **kw)
    gqa = BlockShape.of(M(n_key_value_heads=2, gated_mlp=True))
    assert (gqa.kv_heads, gqa.kv_weights, gqa.gated, gqa.parallel, gqa.mlp_sees_heads) == (2, 2, True, False, True)
    ungrouped = M(n_key_value_heads=2)
    ungrouped.cfg.ungroup_grouped_query_attention = True
    assert (BlockShape.of(ungrouped).kv_heads, BlockShape.of(ungrouped).kv_weights) == (4, 2)
    par = BlockShape.of(M(parallel_attn_mlp=True))
    assert par.parallel and not par.mlp_sees_heads and par.mlp_input(1) == "blocks.1.hook_resid_pre"
    assert BlockShape.of(M()).mlp_input(1) == "blocks.1.hook_resid_mid"
    only = BlockShape.of(M(attn_only=True))
    assert only.attn_only and not only.has_mlp and not only.mlp_sees_heads
    around = BlockShape.of(M(use_normalization_before_and_after=True))
    assert around.norms_around and not around.post_norm
    assert BlockShape.of(M(original_architecture="Olmo2ForCausalLM")).post_norm


def test_block_shape_and_scan_lengths_refuse_what_they_cannot_read():
    """Hostile input to the helpers added with issue 51/52: BlockShape.of on no model, mlp_input past the blocks,
    scan_lengths and the spread's cost with lengths that are not token counts: a p0circuit error naming the fix."""
    from p0circuit.patching.shape import BlockShape
    from p0circuit.studies.analysis import cost
    from p0circuit.studies.analysis.spread import scan_lengths, scan_prompts

    pm = p0.build_planted()
    for bad in (None, "real:smollm2", pm, torch.zeros(3)):
        with pytest.raises(p0.BadInputError, match="BlockShape.of takes a HookedTransformer"):
            BlockShape.of(bad)
    shape = BlockShape.of(pm.model)
    for layer in (-1, shape.n_layers, 1.0, True, "1"):
        with pytest.raises(p0.BadInputError, match="mlp_input: layer="):
            shape.mlp_input(layer)
    assert scan_lengths(64) == [8, 16, 32, 64] and scan_lengths(63) == [8, 16, 32] and scan_lengths(-5) == []
    for room, lengths in ((1.5, (8,)), (None, (8,)), (64, (0,)), (64, (8.0,)), (64, (True,))):
        with pytest.raises(p0.BadInputError, match="scan_lengths: "):
            scan_lengths(room, lengths)
    with pytest.raises(p0.BadInputError, match="scan_lengths: lengths hold -8"):
        cost.spread(pm.model, 1, p0.AnalysisSettings(), [-8])
    s = p0.AnalysisSettings()
    assert cost.spread(pm.model, 1, s, [8, 10**6]) == cost.spread(pm.model, 1, s, [8])  # past the context: not run
    assert scan_prompts(8) == 4 and scan_prompts(1) == 2  # half the prompts, at least two
    for bad in (0, -3, 2.0, True, None, "8"):
        with pytest.raises(p0.BadInputError, match="scan_prompts: n_prompts="):
            scan_prompts(bad)


def test_a_sweep_summary_takes_cell_records_and_names_what_it_cannot_read():
    """summary_table (issue 51's versioned sweep records) refuses what is not a list of cell records, by index and key,
    with what to pass; a record of another version is refused by its version."""
    from p0circuit.surfaces.sweep.runner import summary_table

    for bad, said in (({"key": "x"}, "takes a list of cell records"), ([{"key": "x"}], r"records\[0\] has no schema"),
                      ([{"key": "x", "schema": 1}], r"records\[0\] lacks the key\(s\)"),
                      ([{"schema": 99}], "has schema version 99"), ([3], r"records\[0\] holds a JSON int, not an object")):
        with pytest.raises(p0.BadInputError, match=said):
            summary_table(bad)
    assert summary_table([]).startswith("model")
