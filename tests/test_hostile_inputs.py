"""The hostile-input catalogue (issue 14): every case a careless or hostile user can type, by class.

Class 4 (every public parameter is validated) is the table ``_entries``: for each public entry
point, valid arguments and, per parameter, values that are wrong (wrong type, NaN/inf, out of
range, a bool for a count, a huge int, the wrong object). Every row goes through every rule in
``RULES`` (one check each: the call raises one of p0circuit's own errors, never a traceback from
inside torch, json or Python and never a result; its message names the parameter or the value),
one test per entry point that lists every violation. The hypothesis test at the end throws random values at the same
entry points. Classes 1, 2, 3, 5 and 7 have their own modules (test_verify.py, test_numerics.py,
test_config_matrix.py, test_cli.py, test_notebooks.py); ``OTHER_CLASSES`` below lists further
cases of classes 1, 2, 5 and 6 so that this file alone counts every kind of input the issue names.

``CATALOGUE_SIZE`` is written into docs/reliability.md by ``test_catalogue_size``. The contract over the whole
public API (tests/contract.py, tests/test_contract.py: the surface read from the package, hostile values by kind)
holds every public callable to the same ``RULES``; this table keeps the cases that need an entry's own valid
arguments (a metric object inside a patching call, a sweep on disk).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import p0circuit as p0
from contract import RULES  # the rules a refusal is held to, shared with the contract over the whole API
from p0circuit.core.errors import P0CircuitError
from p0circuit.models.qwen import qwen25_path

HUGE = 10**30
BAD_INT = [None, "3", 2.5, math.nan, True, [1], HUGE]
BAD_FLOAT = [None, "0.1", math.nan, math.inf, -math.inf, [0.1]]
BAD_MODEL = [None, "model", 3, torch.nn.Linear(2, 2)]
BAD_TOKENS = [None, "text", [[1, 2]], torch.zeros(4, 8), torch.zeros(1, 4, 8, dtype=torch.long),
              torch.full((4, 8), -1), torch.full((4, 8), 10**6), torch.zeros(0, 8, dtype=torch.long),
              torch.zeros(4, 0, dtype=torch.long), torch.zeros(2, 200, dtype=torch.long)]
BAD_NAMES = [5, [3], ["garbage"], [None], "A0.H0@0", []]


class Ctx:
    """Valid objects the cases start from (built once)."""

    def __init__(self) -> None:
        self.pm = p0.build_planted()
        self.model = self.pm.model
        self.tokens = p0.probe_tokens(self.model, 4, 8, regular=True)
        self.result = p0.activation_patch(self.model, self.tokens)
        self.circuit = self.result.to_circuit(0.1)
        import tempfile

        from family_configs import make_checkpoint

        self.checkpoint = make_checkpoint("gpt2", Path(tempfile.mkdtemp(prefix="p0hostile")), with_tokenizer=True)
        self.text_model = p0.load_checkpoint(self.checkpoint)  # has a tokenizer
        self.one_prompt, self.short = self.tokens[:1], self.tokens[:, :4]
        self.path = p0.discover(self.model, self.tokens, method="path",
                                edges=["A0.H0@0->M0@0.mlp_in", "M0@0->M1@0.mlp_in", "M1@0->A2.H0@0.k"])


CTX: dict = {}


def ctx() -> Ctx:
    if "ctx" not in CTX:
        CTX["ctx"] = Ctx()
    return CTX["ctx"]


class _Names:
    """Stands in for :class:`Ctx` when only the table's shape is read (entry names, case count):
    collecting the tests builds nothing."""

    def __getattr__(self, name):
        return _Names()

    def __iter__(self):
        return iter(())

    def __call__(self, *args, **kwargs):
        return _Names()


def _entries(c=None):
    """(entry name, call(**kwargs), valid kwargs, {parameter: bad values}): the catalogue's table."""
    c = ctx() if c is None else c
    m, t = c.model, c.tokens
    patch = {"direction": [None, 3, "up"], "corruption": [None, 3, "nope", 2.5], "metric": [3, "norm", {}],
             "min_signal": BAD_FLOAT + [-1.0], "rows_per_forward": [0, -1, 2.5, True], "bos": ["yes", 3]}
    return [
        ("discover", lambda **k: p0.discover(**k), dict(model=m, tokens=t),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, method=[None, 3, "nope", ""], threshold=BAD_FLOAT + [-1.0],
              nodes=BAD_NAMES, **patch)),
        ("activation_patch", lambda **k: p0.activation_patch(**k), dict(model=m, tokens=t),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS[:4], nodes=BAD_NAMES, **patch)),
        ("path_patch", lambda **k: p0.path_patch(**k), dict(model=m, tokens=t, edges=["M0@0->M1@0.mlp_in"]),
         dict(edges=BAD_NAMES + ["M1@0->M0@0.mlp_in"], direction=patch["direction"], corruption=patch["corruption"])),
        ("attribution_patch", lambda **k: p0.attribution_patch(**k), dict(model=m, tokens=t),
         dict(nodes=BAD_NAMES, metric=[3, p0.LogitMetric(fn=lambda logits: 1.0)], corruption=patch["corruption"])),
        ("sink_report", lambda **k: p0.sink_report(**k), dict(model=m, tokens=t),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, eps=BAD_FLOAT + [2.0, -0.1], norm_threshold=BAD_FLOAT + [-1.0],
              massive_ratio=BAD_FLOAT + [-1.0], bos=[3, "yes"])),
        ("probe_tokens", lambda **k: p0.probe_tokens(**k), dict(model=m, n=2, length=4),
         dict(model=BAD_MODEL, n=BAD_INT + [0, -1], length=BAD_INT + [0, 1000], seed=BAD_INT + [-1],
              regular=["yes", 3], bos=["yes", 3])),
        ("to_tokens", lambda **k: p0.to_tokens(**k), dict(model=c.text_model, text="hi", prepend_bos=False),
         dict(model=BAD_MODEL, text=[None, 3, ["a", 3], b"bytes", "hello world " * 100, ["hi", "hello there"], "", []],
              prepend_bos=[None, "no", 3])),
        ("make_prompts", lambda **k: p0.make_prompts(**k), dict(model=m, n=2, length=4),
         dict(n=BAD_INT + [0], length=BAD_INT + [0, 1000], source=[None, 3, "nope"], seed=BAD_INT, bos=["yes"])),
        ("prune", lambda **k: p0.prune(**k), dict(circuit=c.circuit, threshold=0.1),
         dict(circuit=[None, "c", {}, c.pm], threshold=BAD_FLOAT[1:] + [-1.0], top_k=BAD_INT[1:] + [0, -2])),
        ("compare", lambda **k: p0.compare(**k), dict(circuit=c.circuit, truth=c.pm.truth),
         dict(circuit=[None, "c", {}, c.pm], truth=[None, "c", {}, c.pm])),
        ("auroc", lambda **k: p0.auroc(**k), dict(scores=[0.1, 0.2], labels=[True, False]),
         dict(scores=[None, "ab", [math.nan, 1.0], [1.0], [[1, 2]], [1.0, math.inf]],
              labels=[None, [1, 2], ["a", "b"], [True]])),
        ("interpret", lambda **k: p0.interpret(**k), dict(result=c.result, threshold=0.1),
         dict(result=[None, c.circuit, "r"], threshold=BAD_FLOAT + [-0.5])),
        ("Circuit.from_json", lambda **k: p0.Circuit.from_json(**k), dict(text=c.circuit.to_json()),
         dict(text=[None, 3, "{", '{"nodes": ["A0.H0@0"', "[]", "{}", '{"nodes": 3}', '{"nodes": ["X"]}',
                    '{"nodes": [], "edges": [["A0.H0@0"]]}', '{"nodes": [], "node_effects": {"A0.H0@0": "big"}}',
                    '{"nodes": [], "colour": 1}', '{"nodes": [], "settings": 3}'])),
        ("Circuit", lambda **k: p0.Circuit(**k), dict(nodes=()),
         dict(nodes=[None, "A0.H0@0", [3], ["A0.H0@0"]], edges=[3, ["M0@0->M1@0.mlp_in"]],
              node_effects=[3, {"A0.H0@0": "a"}, {3: 0.1}], settings=[3])),
        ("Node.parse", lambda **k: p0.Node.parse(**k), dict(name="A0.H0@0"),
         dict(name=[None, 3, "", "A0", "A-1.H0@0", "A0.H0@x", "Z0@0", "M0.N-1@0", "A0.H0@-1", "A+0.H0@0", "M 1@0",
                    "A\u0663.H0@0", "A01.H0@0", "M1@\u0660"])),
        ("Edge.parse", lambda **k: p0.Edge.parse(**k), dict(name="M0@0->M1@0.mlp_in"),
         dict(name=[None, 3, "", "A0.H0@0", "A0.H0@0->", "M0@0->M1@0.x", "M0@0->M1@0", "M0@0->M+1@0.mlp_in"])),
        ("AnalysisSettings", lambda **k: p0.AnalysisSettings(**k), {},
         dict(norm_threshold=[0.5, 1.0, 1, math.nan, -2.0, "5"], threshold=[0.0, math.inf], n_prompts=[1, 2.5, True],
              lengths=[(1,), "12"], bos=[(), (True, True), "both"])),
        ("Node", lambda **k: p0.Node(**k), dict(kind=p0.Kind.HEAD, layer=0, head=0),
         dict(kind=["head", 3, None], layer=["0", 2.5, -5], head=["0", -3], pos=[2.5, "x", None, -1])),
        ("ModelSpec", lambda **k: p0.ModelSpec(**k), {},
         dict(n_layers=BAD_INT + [0], d_model=BAD_INT + [0], n_heads=BAD_INT + [0], d_mlp=[-1, "8"],
              d_vocab=[0, 2.0], n_ctx=[0, "64"], pos=[None, 3, "alibi"], norm=["batch", None], mlp=["moe"],
              act_fn=["tanhh"], parallel=["yes", 2, None], window=[0, "4", 2.5], rotary_dim=[3, 64, "8"],
              n_kv_heads=[3, 0, "2"], seed=["1", 2.5, -1, 2**64])),
        ("ModelSpec.build", lambda **k: p0.ModelSpec(n_layers=1).build(**k), {},
         dict(device=["nodevice", "cuda:7", 3, ""])),
        ("build_planted", lambda **k: p0.build_planted(**k), {},
         dict(pos=[None, 3, "alibi"], n_layers=BAD_INT + [2], circuit_layer=[9, -1, "0"], sink_pos=[2, 100, "0"],
              norm_ratio=BAD_FLOAT + [0.5], seed=BAD_INT, key=["token", 3], n_heads=[1, 10**6], d_vocab=[7, 10],
              theta=[0.2, 1.5], bogus=[1])),
        ("Shift", lambda **k: p0.Shift(**k), {}, dict(k=BAD_INT + [0, -1], seed=BAD_INT + [-1], filler=[3, "ab"])),
        ("Shift.prepare", lambda **k: p0.activation_patch(c.model, c.tokens, corruption=p0.Shift(**k)), dict(k=1),
         dict(filler=[(-1,), (10**6,), (1, 2)], k=[70])),
        ("Resample", lambda **k: p0.activation_patch(c.model, c.tokens, corruption=p0.Resample(**k)), {},
         dict(seed=BAD_INT, tokens=["a", torch.zeros(4, 8), torch.full((4, 8), -1), torch.full((4, 8), 10**6),
                                    torch.zeros(4, 5, dtype=torch.long)])),
        ("PosMean", lambda **k: p0.activation_patch(c.model, c.tokens, corruption=p0.PosMean(**k)), {},
         dict(position=BAD_INT + [-1, 8])),
        ("NormRatio", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.NormRatio(**k)), dict(layer=1),
         dict(layer=BAD_INT + [-1, 99], pos=BAD_INT + [-1, 99])),
        ("ResidDim", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.ResidDim(**k)), dict(layer=1, dim=0),
         dict(layer=[-1, 99, "1"], dim=[-1, 10**6, 2.5])),
        ("AttnToP0", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.AttnToP0(**k)), dict(heads=[(2, 0)]),
         dict(heads=[3, "A0.H0", [(0,)], [(0, 1, 2)], [("a", 1)], [(9, 0)], [(0, 9)], [(2, 0), ("a", 1)], [(2, 0), (2.5, 0)]],
              layers=[3, "1", [None], [99], [2, "3"], [2, True]])),
        ("LogitMetric", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.LogitMetric(**k)),
         dict(fn=lambda logits: logits[:, -1, 0].mean()),
         dict(fn=[lambda logits: "x", lambda logits: logits, lambda logits: None, 3, lambda logits: [1.0]],
              label=[3, None])),
        ("CacheMetric", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.CacheMetric(**k)),
         dict(fn=lambda acts, p0_: acts["blocks.1.hook_resid_post"][:, p0_].norm(),
              hooks_needed=[(1, "blocks.1.hook_resid_post")]),
         dict(fn=[lambda acts, p0_: "x", lambda acts, p0_: acts["blocks.3.hook_resid_post"].sum(), 3],
              hooks_needed=[[(1, "nope")], "x", [(0, "blocks.1.hook_resid_post")], [(1,)],
                            [(1, "blocks.1.hook_resid_post"), (1,)], [(1, "blocks.1.hook_resid_post"), ("1", "x")]])),
        ("candidate_nodes", lambda **k: p0.candidate_nodes(**k), dict(model=m),
         dict(model=BAD_MODEL, positions=[3, "0", [-99], [None], [2.5]], rest=["yes"], embed=[3])),
        ("candidate_edges", lambda **k: p0.candidate_edges(**k), dict(model=m, senders=[p0.Node.parse("M0@0")]),
         dict(model=BAD_MODEL, senders=[None, "A0.H0@0", [3], [p0.Node.parse("M0@0"), 3]], qkv=["x", ["z"], 3, ["q", 3]],
              receiver_layers=["1", -1, 99, 2.5, 0])),
        ("candidate_neurons", lambda **k: p0.candidate_neurons(**k), dict(model=m, layers=[0]),
         dict(model=BAD_MODEL, layers=[None, 3, [99], ["a"]], positions=[3, ["a"]])),
        ("faithfulness_curve", lambda **k: p0.faithfulness_curve(**k),
         dict(result=c.result),
         dict(result=[None, c.circuit, m], fractions=[[2.0], [math.nan], "a", [-0.1], [0.5, "a"], [0.5, None], []],
              setup=[3, "shift", c.result])),
        ("check_attribution", lambda **k: p0.check_attribution(**k), dict(model=m, tokens=t),
         dict(level=[None, 3, "neuron"], corruption=[None, "nope"])),
        ("load_checkpoint", lambda **k: p0.load_checkpoint(**k), dict(path=c.checkpoint),
         dict(path=[None, 3, "/nonexistent/dir", "/etc/hostname", ""], device=["nodevice", 3], dtype=["float16", torch.int32, 3])),
        ("load_model", lambda **k: p0.load_model(**k), dict(entry="planted:rope"),
         dict(entry=[None, 3, "", "nope:x", "spec:{", "checkpoint:/nonexistent", "real:nope"], seed=BAD_INT,
              device=["nodevice", "cuda:9"])),
        ("set_bos", lambda **k: p0.set_bos(**k), dict(model=m, token=0), dict(token=[None, -1, 10**6, 2.5, "notatoken"])),
        ("text_windows", lambda **k: p0.text_windows(**k), dict(model=c.text_model, text="a b " * 50, n=2, length=4, prepend_bos=False),
         dict(text=[None, 3], n=BAD_INT + [0], length=BAD_INT + [0])),
        ("regular_prompts", lambda **k: p0.regular_prompts(**k), dict(tokens=t),
         dict(tokens=[None, "text", torch.zeros(4, 8)], theta=BAD_FLOAT + [-1.0, 1.5])),
        ("p0_like_positions", lambda **k: p0.p0_like_positions(**k), dict(tokens=t),
         dict(tokens=[None, "text", torch.zeros(4, 8)], theta=BAD_FLOAT + [-1.0])),
        ("to_dot", lambda **k: p0.to_dot(**k), dict(circuit=c.circuit), dict(circuit=[None, "c"], title=[3])),
        ("to_networkx", lambda **k: p0.to_networkx(**k), dict(circuit=c.circuit), dict(circuit=[None, {}])),
        ("positional_kind", lambda **k: p0.positional_kind(**k), dict(model=m), dict(model=BAD_MODEL)),
        ("bos_label", lambda **k: p0.bos_label(**k), dict(model=m), dict(model=BAD_MODEL)),
        ("sink_reads", lambda **k: p0.sink_reads(**k), dict(model=m, tokens=t, layer=1, bos=False),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, layer=BAD_INT + [-1, 3, 99], bos=[None, "no", 3],
              dims=[3, "507", [-1], [10**6], [1, 1], [2.5]], eps=BAD_FLOAT + [-0.1, 1.5], keep=BAD_FLOAT + [0.0, 1.0, 2.0],
              window=BAD_INT + [0], seed=BAD_INT + [-1])),
        ("diagonal_attention", lambda **k: p0.diagonal_attention(**k), dict(model=m, tokens=t, layer=1, bos=False),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, layer=BAD_INT + [-1, 4], bos=[None, 3], keep=BAD_FLOAT + [0.0, 1.5],
              cos=BAD_FLOAT + [0.0, 2.0])),
        ("super_weights", lambda **k: p0.super_weights(**k),
         dict(model=m, tokens=t, layer=1, neurons=["M1.N64@0"], dims=[69], bos=False),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, layer=BAD_INT + [-1, 4], neurons=[None, "M1.N64@0", ["A0.H0@0"],
              ["M9.N0@0"], ["M1.N9999@0"], ["garbage"], [3]], dims=[None, [-1], [10**6], "69"], bos=[None, 3],
              massive=[[-1], "x"], eps=BAD_FLOAT + [1.5])),
        ("weight_outliers", lambda **k: p0.weight_outliers(**k), dict(model=m),
         dict(model=BAD_MODEL, massive=[[-1], "x", [10**6]], z=BAD_FLOAT + [0.0, -3.0], per_block=BAD_INT + [0])),
        ("first_token_map", lambda **k: p0.first_token_map(**k), dict(model=m, reference=t, layer=1),
         dict(model=BAD_MODEL, reference=BAD_TOKENS, layer=BAD_INT + [-1, 4], threshold=BAD_FLOAT + [0.5, 1.0],
              cos=BAD_FLOAT + [0.0, 1.5], most=BAD_INT + [-1], seed=BAD_INT + [-1])),
        ("keyed_on", lambda **k: p0.keyed_on(**k), dict(model=m, tokens=t, at=0, layer=1, bos=False),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS + [c.one_prompt, c.short], at=BAD_INT + [-1, 7, 99], layer=BAD_INT + [-1, 4],
              bos=[None, 3], seed=BAD_INT + [-1], threshold=BAD_FLOAT + [0.5, 1.0], keep=BAD_FLOAT + [0.0, 1.0],
              contexts=["x", torch.zeros(4, 8), torch.full((4, 8), -1), c.short])),
        ("special_tokens", lambda **k: p0.special_tokens(**k), dict(model=m, tokens=t, bos=False, ids=[0]),
         dict(model=BAD_MODEL, tokens=BAD_TOKENS, bos=[None, 3], ids=[3, [-1], [10**6], ["a"], [2.5]],
              at=BAD_INT[1:] + [0, 7, -1], threshold=BAD_FLOAT, eps=BAD_FLOAT + [1.5])),
        ("Copies", lambda **k: p0.activation_patch(c.model, c.tokens, corruption=p0.Copies(**k)), {},
         dict(k=BAD_INT + [0, -1, 70])),
        ("SinkRate", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.SinkRate(**k)), dict(layers=[2]),
         dict(layers=[3, "2", [], [99], [-1], [2.5]], eps=BAD_FLOAT + [1.0, -0.1])),
        ("PerPrompt", lambda **k: p0.activation_patch(c.model, c.tokens, metric=p0.PerPrompt(**k)),
         dict(metric=p0.NormRatio(1)),
         dict(metric=[None, 3, "norm_ratio:1", p0.LogitMetric(fn=lambda logits: logits[:, -1, 0].mean())])),
        ("load_qwen25", lambda **k: p0.load_qwen25(**k), {},
         dict(device=["nodevice", 3, None], n_ctx=BAD_INT + [0, -1], cache=["yes", 3, None])),
        ("qwen25_path", lambda **k: qwen25_path(**k), {}, dict(bogus=[1], root=["/tmp"])),
    ]


LOADS_A_MODEL = {"load_qwen25"}
"""Entries whose valid arguments load a real model (seconds from the conversion cache, a minute without): random
values, some of them valid, are not thrown at them; their bad values are all refused before the load."""


SHAPE = [(name, {param: len(values) for param, values in bad.items()}) for name, _, _, bad in _entries(_Names())]
"""(entry, {parameter: number of bad values}) without building anything."""
PARAMETER_CASES = sum(n for _, params in SHAPE for n in params.values())
"""How many (entry, parameter, bad value) rows the table holds."""


def _raised(call, kwargs):
    """What the call raised (None when it returned)."""
    try:
        call(**kwargs)
    except Exception as err:  # noqa: BLE001 - the rules below judge what was raised
        return err
    return None




@pytest.mark.parametrize("entry", [name for name, _ in SHAPE])
def test_bad_parameters(entry):
    """Each bad value of each parameter of ``entry``, through every rule; every violation is listed."""
    (name, call, good, bad), = [e for e in _entries() if e[0] == entry]
    broken = []
    for param, values in bad.items():
        for i, value in enumerate(values):
            err = _raised(call, {**good, param: value})
            for rule, holds in RULES.items():
                if not holds(err, param, value):
                    shown = "returned a value" if err is None else f"{type(err).__name__}: {str(err)[:160]}"
                    broken.append(f"{param}[{i}]={value!r:.40}: {rule}; got {shown}")
    assert not broken, f"{entry}: {len(broken)} violation(s):\n" + "\n".join(broken)


def test_the_valid_arguments_run():
    """Each entry's valid arguments run: a case fails because of its one bad value, not the rest."""
    for name, call, good, _ in _entries():
        assert call(**good) is not None, name  # each entry returns what it computes


# ---- class 6: records that tell the truth --------------------------------------------------------------

def test_path_circuit_is_scored_over_edges_only():
    scores = p0.compare(ctx().path, ctx().pm.truth)
    assert set(scores) <= {"edge_precision", "edge_recall", "edge_auroc"} and "edge_precision" in scores
    assert all(math.isfinite(v) for v in scores.values())


def test_node_circuit_without_effects_has_no_auroc():
    bare = p0.Circuit(nodes=(p0.Node.parse("A0.H0@0"),))
    assert set(p0.compare(bare, ctx().pm.truth)) == {"node_precision", "node_recall"}


def test_regular_probes_always_return_n_rows():
    m = ctx().model
    for seed in range(20):
        assert p0.probe_tokens(m, 2, 6, seed=seed, regular=True).shape == (2, 6)


# ---- the property-based test: random values at every entry point ----------------------------------------

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=6),
    st.lists(st.integers(-5, 70), max_size=4), st.lists(st.text(max_size=8), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.builds(lambda shape, dtype, fill: torch.full(shape, fill, dtype=dtype),
              st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
              st.sampled_from([torch.long, torch.float32, torch.bool]), st.integers(-3, 100)),
)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_values_raise_only_our_errors(data):
    """Any value for any one parameter: the call returns, or raises one of p0circuit's errors."""
    entries = [e for e in _entries() if e[0] not in LOADS_A_MODEL]
    name, call, good, bad = data.draw(st.sampled_from(entries), label="entry")
    param = data.draw(st.sampled_from(sorted(bad)), label="param")
    value = data.draw(ANYTHING, label="value")
    try:
        call(**{**good, param: value})
    except P0CircuitError:
        pass


# ---- classes 1, 2, 5, 6: inputs beyond parameters ------------------------------------------------------

def _cli(*argv):
    """The command line in a fresh process (what a user runs)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "p0circuit", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


class _Run:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _main(capsys, *argv):
    """The command line in this process (the same ``main``, without a second start-up)."""
    from p0circuit.surfaces.cli import main

    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return _Run(code, out.out, out.err)


def _one_line_error(proc):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("p0circuit: error:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


SWEEP = """[sweep]
models = ["planted:rope"]
corruptions = ["shift"]
methods = ["activation"]
metrics = ["sink_heads"]
n_prompts = 4
seq_len = {seq_len}
"""


@pytest.mark.parametrize("command", [["discover"], ["train", "--steps", "2"], ["survey"]])
def test_cli_read_only_directory(tmp_path, capsys, command):
    """A directory the user cannot write fails at once (before the analysis), in one line. Root
    ignores permission bits, so as root the read-only place is sysfs, which refuses even root."""
    if os.geteuid() == 0:
        proc = _main(capsys, *command, "--out", "/sys/p0circuit-test/run")
        _one_line_error(proc)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _one_line_error(_main(capsys, *command, "--out", str(ro / "run")))
    finally:
        ro.chmod(0o700)


def test_cli_output_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _cli("discover", "--out", str(tmp_path / "file" / "run"))
    _one_line_error(proc)
    assert "lies under" in proc.stderr and "patching" not in proc.stderr  # refused before any work


def test_a_failed_run_leaves_no_empty_directories(tmp_path, capsys):
    proc = _main(capsys, "discover", "--out", str(tmp_path / "a" / "b"), "--metric", "norm_ratio:99")
    assert proc.returncode == 2 and not (tmp_path / "a").exists()


@pytest.mark.parametrize("text", [
    "[sweep]\nmodels = 3\n", "[sweep]\nseed = \"1\"\n", "[sweep]\nseed = 1.5\n", "[sweep]\nn_prompts = 0\n",
    "[sweep]\nseq_len = -4\n", "[sweep]\nthreshold = nan\n", "[sweep]\nmethods = [\"nope\"]\n", "[sweep\n",
    "[other]\nx = 1\n", "[sweep]\ncolour = 1\n", "[sweep]\nmodels = []\n",
])
def test_cli_bad_sweep_configs(tmp_path, capsys, text):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    _one_line_error(_main(capsys, "sweep", str(cfg), "--out", str(tmp_path / "out")))
    assert not (tmp_path / "out" / "cells").exists() or not any((tmp_path / "out" / "cells").iterdir())


def test_sweep_seq_len_beyond_context_is_refused_not_clipped(tmp_path):
    from p0circuit.surfaces.sweep import SweepConfig, run_sweep
    from p0circuit.surfaces.sweep.runner import CellsFailed

    config = SweepConfig.from_dict({"models": ["planted:rope"], "methods": ["activation"], "corruptions": ["shift"],
                                    "n_prompts": 2, "seq_len": 64})  # the planted model's n_ctx is 64
    with pytest.raises(CellsFailed, match=r"shifting prompts of length 64 by k=1 needs n_ctx >= 65, but the model's n_ctx is 64"):
        run_sweep(config, tmp_path, progress=False)
    failed = list((tmp_path / "failed").glob("*.json"))
    assert len(failed) == 1 and json.loads(failed[0].read_text())["ours"] is True
    assert not list((tmp_path / "cells").glob("*.json"))


def test_two_configs_in_one_directory_are_refused(tmp_path):
    from p0circuit.surfaces.sweep import SweepConfig, run_sweep

    base = {"models": ["planted:rope"], "methods": ["activation"], "corruptions": ["shift"], "n_prompts": 2, "seq_len": 8}
    run_sweep(SweepConfig.from_dict(base), tmp_path, progress=False)
    with pytest.raises(p0.ConfigError, match=r"holds a sweep of another config \(it differs in seq_len\)"):
        run_sweep(SweepConfig.from_dict({**base, "seq_len": 12}), tmp_path, progress=False)
    assert len(run_sweep(SweepConfig.from_dict(base), tmp_path, progress=False)) == 1  # the same config resumes


def test_a_failing_cell_with_two_workers_keeps_the_others(tmp_path, capsys):
    """One cell fails (its seq_len does not fit under shift), the pos_mean cell finishes: it is kept,
    the failure is written, exit status 1, and a rerun retries only the failed cell."""
    cfg = tmp_path / "mixed.toml"
    cfg.write_text(SWEEP.format(seq_len=64).replace('["shift"]', '["shift", "pos_mean"]'))
    out = tmp_path / "out"
    proc = _main(capsys, "sweep", str(cfg), "--out", str(out), "--workers", "2", "--quiet")  # the pool: fresh processes
    assert proc.returncode == 1, proc.stderr
    assert "1 of 2 cells failed" in proc.stderr and "Traceback" not in proc.stderr
    assert len(list((out / "cells").glob("*.json"))) == 1 and len(list((out / "failed").glob("*.json"))) == 1
    assert "1 of 2 cells done" in proc.stdout
    again = _main(capsys, "sweep", str(cfg), "--out", str(out), "--dry-run")
    assert again.stdout.count("  todo  ") == 1 and again.stdout.count("  done  ") == 1


CATALOGUE_SIZE = PARAMETER_CASES + 11 + 3 + 9
"""Parameter cases, the bad sweep configs and the other cases above (docs/reliability.md quotes it)."""


def test_catalogue_size():
    """docs/reliability.md quotes the catalogue's size from this test (docblocks: no figure kept by hand)."""
    import docblocks

    assert CATALOGUE_SIZE >= 150
    docblocks.check("docs/reliability.md", "hostile-inputs",
                    f"**{CATALOGUE_SIZE} hostile inputs** ({PARAMETER_CASES} bad parameter values, a table driven "
                    "through one check per rule, one test per entry point; the rest: broken sweep configs, "
                    "read-only and impossible output paths, failing sweep cells, a sweep config changed under a "
                    "results directory)")
