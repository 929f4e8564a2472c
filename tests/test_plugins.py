"""Extensions from a module outside p0circuit (issue 22): a corruption that swaps the first two
tokens, a metric entry, a method and a model family, written to a scratch file and used from
Python (both directions, fast and reference, checked against plain TransformerLens hooks), a sweep
config and the command line, without touching p0circuit."""

import json
import pickle
import sys
import textwrap

import pytest
import torch

import p0circuit as p0
from p0circuit.core import entries
from p0circuit.surfaces.cli import main
from p0circuit.patching import CORRUPTIONS, METHODS
from p0circuit.core.plugins import load_plugin, load_plugins
from tolerance import close

PLUGIN = textwrap.dedent('''
    """A user's own p0circuit extensions (nothing here is part of p0circuit)."""
    from dataclasses import dataclass
    from typing import ClassVar

    import p0circuit as p0
    from p0circuit.core.entries import register_family, register_metric
    from p0circuit.patching.corruptions import Corruption, Prepared
    from p0circuit.patching.registry import Method, register


    @dataclass(frozen=True)
    class SwapFirstTwo(Corruption):
        """The first two tokens trade places: clean position 0 is corrupted position 1 and back."""

        name: ClassVar[str] = "swap_first_two"

        def prepare(self, model, tokens):
            corrupt = tokens.clone()
            corrupt[:, [0, 1]] = tokens[:, [1, 0]]
            return Prepared(self, tokens, corrupt, align=(1, 0, *range(2, tokens.shape[1])))


    def p0_share(model, block):
        """Share of the residual norm at P0 after ``block``: ||h_0|| / sum_t ||h_t||."""
        hook = f"blocks.{block}.hook_resid_post"

        def share(acts, at):
            norms = acts[hook].norm(dim=-1)[:, at:]
            return (norms[:, 0] / norms.sum(-1)).mean()

        return p0.CacheMetric(share, [(block, hook)], label=f"p0_share@L{block}")


    register_metric("p0_share", p0_share, takes_block=True)


    @p0.takes_options()
    def mlp_activation(model, tokens, *, options):
        """Activation patching of the MLP outputs only."""
        nodes = [n for n in p0.candidate_nodes(model) if n.kind.value == "mlp"]
        return p0.activation_patch(model, tokens, nodes=nodes, options=options)


    register(Method("mlp_activation", mlp_activation, "node", summary="activation patching of MLP outputs"))
    register_family("two_blocks", n_layers=2)
''')


@pytest.fixture
def plugin(tmp_path):
    """The scratch module, loaded; the registries are restored afterwards."""
    saved = (dict(CORRUPTIONS), dict(METHODS), dict(entries.METRICS), dict(entries.SPEC_FAMILIES))
    path = tmp_path / "my_extensions.py"
    path.write_text(PLUGIN)
    load_plugin(str(path))
    yield path
    for registry, old in zip((CORRUPTIONS, METHODS, entries.METRICS, entries.SPEC_FAMILIES), saved):
        registry.clear()
        registry.update(old)


def _plain(model, tokens, node, direction, layer):
    """The norm ratio after ``layer`` with one head output or MLP output patched, written with plain
    TransformerLens hooks: the corrupted prompts swap the first two tokens, clean position p is
    corrupted position (1, 0, 2, 3, ...)[p], and the metric is read where the clean first token sits."""
    corrupt = tokens.clone()
    corrupt[:, [0, 1]] = tokens[:, [1, 0]]
    where = [1, 0, *range(2, tokens.shape[1])]
    comp, pos = node.split("@")
    name, head = ((f"blocks.{comp[1:].split('.H')[0]}.attn.hook_z", int(comp.split(".H")[1])) if comp.startswith("A")
                  else (f"blocks.{comp[1:]}.hook_mlp_out", None))
    clean_pos = [int(pos)]
    base, source = (tokens, corrupt) if direction == "noise" else (corrupt, tokens)
    into = clean_pos if direction == "noise" else [where[p] for p in clean_pos]
    read = [where[p] for p in clean_pos] if direction == "noise" else clean_pos
    _, cache = model.run_with_cache(source)
    value = cache[name][:, read]
    got = {}

    def patch(act, hook):
        if head is None:
            act[:, into] = value
        else:
            act[:, into, head] = value[:, :, head]
        return act

    def grab(act, hook):
        got["h"] = act.detach()

    model.run_with_hooks(base, fwd_hooks=[(name, patch), (f"blocks.{layer}.hook_resid_post", grab)])
    at = 0 if direction == "noise" else where[0]
    norms = got["h"].norm(dim=-1)[:, at:]
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


def _plain_edge(model, tokens, edge, direction, layer):
    """The norm ratio after ``layer`` with one sender's change (read off its ``hook_attn_out`` /
    ``hook_mlp_out`` in both runs) added to one MLP's input only, with plain TransformerLens hooks;
    the first two tokens swapped as in :func:`_plain`."""
    corrupt = tokens.clone()
    corrupt[:, [0, 1]] = tokens[:, [1, 0]]
    where = [1, 0, *range(2, tokens.shape[1])]
    src, rest = edge.split("->")
    dst = rest.rsplit(".", 1)[0]
    comp, pos = src.split("@")
    p = int(pos)
    if comp.startswith("A"):  # one head's output: its z through W_O
        layer_s, head = (int(x) for x in comp[1:].split(".H"))
        hook_s = f"blocks.{layer_s}.attn.hook_z"
        out = lambda c, q: c[hook_s][:, q, head] @ model.blocks[layer_s].attn.W_O[head]  # noqa: E731
    else:
        hook_s = f"blocks.{comp[1:]}.hook_mlp_out"
        out = lambda c, q: c[hook_s][:, q]  # noqa: E731
    _, clean = model.run_with_cache(tokens)
    _, corr = model.run_with_cache(corrupt)
    if direction == "noise":
        base, at, change = tokens, p, out(corr, where[p]) - out(clean, p)
    else:
        base, at, change = corrupt, where[p], out(clean, p) - out(corr, where[p])
    got = {}

    def add(act, hook):
        act[:, at] = act[:, at] + change
        return act

    def grab(act, hook):
        got["h"] = act.detach()

    was = model.cfg.use_hook_mlp_in
    model.set_use_hook_mlp_in(True)
    try:
        model.run_with_hooks(base, fwd_hooks=[(f"blocks.{dst.split('@')[0][1:]}.hook_mlp_in", add),
                                              (f"blocks.{layer}.hook_resid_post", grab)])
    finally:
        model.set_use_hook_mlp_in(was)
    first = 0 if direction == "noise" else where[0]
    norms = got["h"].norm(dim=-1)[:, first:]
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_a_corruption_from_a_scratch_module_is_exact_both_directions(plugin, planted, direction):
    tokens = p0.probe_tokens(planted.model, 6, 10, seed=0, regular=True)
    nodes = ["A0.H0@0", "A0.H1@1", "M0@0", "M0@1", "M1@1", "M1@2"]
    kw = dict(corruption="swap_first_two", metric="norm_ratio:1", nodes=nodes, direction=direction)
    fast = p0.activation_patch(planted.model, tokens, **kw)
    slow = p0.activation_patch(planted.model, tokens, reference=True, **kw)
    with torch.no_grad():
        plain = {n: _plain(planted.model, tokens, n, direction, 1) for n in nodes}
    for n in nodes:
        assert close(fast.raw[n], plain[n], fast.clean_metric), (n, direction)
        assert close(slow.raw[n], plain[n], fast.clean_metric), (n, direction)
    names = ["M0@1->M1@1.mlp_in", "M0@0->M1@0.mlp_in", "A0.H0@0->M0@0.mlp_in"]
    edges = p0.path_patch(planted.model, tokens, corruption="swap_first_two", metric="norm_ratio:1",
                          edges=names, direction=direction)
    again = p0.path_patch(planted.model, tokens, corruption="swap_first_two", metric="norm_ratio:1",
                          edges=names, direction=direction, reference=True)
    with torch.no_grad():
        plain_edges = {e: _plain_edge(planted.model, tokens, e, direction, 1) for e in names}
    for e in names:
        assert close(edges.raw[e], plain_edges[e], edges.clean_metric), (e, direction)
        assert close(again.raw[e], plain_edges[e], edges.clean_metric), (e, direction)


def test_a_metric_method_and_family_from_a_scratch_module(plugin, planted, tmp_path, capsys):
    tokens = p0.probe_tokens(planted.model, 6, 10, seed=0, regular=True)
    circuit = p0.discover(planted.model, tokens, method="mlp_activation", corruption="shift", metric="p0_share:1")
    assert circuit.settings["metric"] == "p0_share@L1" and circuit.node_names == {"M0@0", "M1@0"}
    model = p0.load_model("spec:two_blocks").model
    assert model.cfg.n_layers == 2 and entries.entry_layers("spec:two_blocks") == 2
    with pytest.raises(p0.ConfigError, match="p0_share takes a block number"):
        entries.check_metric_entry("p0_share")
    # the command line: --plugin makes every name a choice, and the cheap checks know the family's size
    out = tmp_path / "cli"
    argv = ["--plugin", str(plugin), "discover", "--model", "spec:two_blocks", "--corruption", "swap_first_two",
            "--methods", "mlp_activation", "--metric", "p0_share:1", "--n-prompts", "4", "--seq-len", "8",
            "--quiet", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((out / "circuit_mlp_activation.json").read_text())["settings"]["corruption"] == "swap_first_two"
    assert main(["--plugin", str(plugin), "discover", "--model", "spec:two_blocks", "--metric", "p0_share:2",
                 "--out", str(tmp_path / "x")]) == 2  # refused before the model is built
    assert "the model has blocks 0..1" in capsys.readouterr().err
    # a sweep config
    from p0circuit.surfaces.sweep import SweepConfig, run_sweep

    config = SweepConfig(plugins=[str(plugin)], models=["spec:two_blocks"], corruptions=["swap_first_two"],
                         methods=["mlp_activation"], metrics=["p0_share:1"], n_prompts=4, seq_len=8)
    records = run_sweep(config, tmp_path / "sweep", progress=False)
    assert [r["cell"]["corruption"] for r in records] == ["swap_first_two"]
    # read in a fresh process, before any plugin is loaded: the records read, and the report (which loads the
    # config's plugins) is written
    import subprocess
    import sys

    code = ("from pathlib import Path; from p0circuit.surfaces.sweep.store import read_records, done_keys; "
            "from p0circuit.surfaces.sweep_report import write_report; "
            f"out = Path({str(tmp_path / 'sweep')!r}); records, notes = read_records(out); "
            "print(len(records), notes, len(done_keys(out)), write_report(out, attention=False).name)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.split() == ["1", "[]", "1", "report.html"], run.stderr[-800:]


def test_a_plugin_that_is_not_there_is_one_line(tmp_path, capsys):
    assert main(["--plugin", "no_such_module_p0", "discover"]) == 2
    assert "plugin module 'no_such_module_p0' cannot be imported" in capsys.readouterr().err
    assert main(["--plugin", str(tmp_path / "absent.py"), "discover"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_installed_plugin_is_found_by_its_entry_point(tmp_path, monkeypatch, capsys):
    """A package that declares ``[project.entry-points."p0circuit.core.plugins"]`` is loaded by the command
    line without --plugin (here a dist-info directory on sys.path, as pip installs one)."""
    saved = (dict(CORRUPTIONS), dict(METHODS), dict(entries.METRICS), dict(entries.SPEC_FAMILIES))
    (tmp_path / "my_p0_extensions.py").write_text(PLUGIN)
    info = tmp_path / "my_p0_extensions-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-p0-extensions\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[p0circuit.core.plugins]\nmine = my_p0_extensions\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "swap_first_two" not in CORRUPTIONS
        assert main(["discover", "--model", "spec:two_blocks", "--corruption", "swap_first_two", "--methods",
                     "mlp_activation", "--n-prompts", "4",
                     "--seq-len", "8", "--quiet", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
        assert "swap_first_two" in CORRUPTIONS and "mlp_activation" in METHODS
    finally:
        for registry, old in zip((CORRUPTIONS, METHODS, entries.METRICS, entries.SPEC_FAMILIES), saved):
            registry.clear()
            registry.update(old)


def test_a_ray_task_loads_the_configs_plugins_first(tmp_path, monkeypatch):
    """The function a Ray worker runs for a cell loads the sweep's plugins before the cell (a Ray
    worker is a fresh process: without this, a plugin corruption is unknown there)."""
    from p0circuit.surfaces.sweep import runner

    saved = (dict(CORRUPTIONS), dict(METHODS), dict(entries.METRICS), dict(entries.SPEC_FAMILIES))
    path = tmp_path / "ray_extensions.py"
    path.write_text(PLUGIN)
    monkeypatch.setattr(runner, "run_cell", lambda cell: {"known": cell.corruption in CORRUPTIONS})
    try:
        assert "swap_first_two" not in CORRUPTIONS
        load_plugins([str(path)])  # the driver has loaded them: it makes (and checks) the cell
        cell = runner.Cell("spec:two_blocks", "auto", "swap_first_two", "activation", "norm_ratio:1", 4, 8, 0, 0.1)
        shipped = pickle.dumps(cell)
        for registry, old in zip((CORRUPTIONS, METHODS, entries.METRICS, entries.SPEC_FAMILIES), saved):
            registry.clear()  # a Ray worker: a fresh process, no plugin loaded yet
            registry.update(old)
        for key in [k for k in sys.modules if k.startswith("p0circuit_plugin_ray_extensions")]:
            del sys.modules[key]
        assert "swap_first_two" not in CORRUPTIONS
        assert runner._run_with_plugins([str(path)], pickle.loads(shipped)) == {"known": True}
    finally:
        for registry, old in zip((CORRUPTIONS, METHODS, entries.METRICS, entries.SPEC_FAMILIES), saved):
            registry.clear()
            registry.update(old)
