"""The contract of the public API (issue 50), and the machinery that checks it.

**The contract.** Every public callable (each name of ``p0circuit.__all__``, each name of the ``__all__`` of a
module that declares one, and the public class- and static methods of their classes) refuses a bad argument at its
boundary: with one of p0circuit's own errors (never an exception from inside torch, numpy, json or Python, never
a returned value), whose message names the argument or shows the value, before any forward of the model runs.

**The surface is read, not listed** (:func:`surface`): the modules are found by their ``__all__`` in the source, so
a new public function is covered the day it lands. A class is covered by its constructor unless it is an exception,
an enum, a base class users subclass (another public class derives from it) or a result (a public callable returns
it: the library makes those) that checks no fields (a class that checks its own, an entry point or one marked
``no_type_check``, is covered even when it is also returned: ``Node``, ``Circuit``); its public class- and static
methods are covered either way.

**Each argument gets a family of hostile values by its kind** (:data:`KINDS`: the kind of a parameter is read from
its name and annotation; a required parameter of no known kind fails the contract with "add a kind"). A kind has a
valid value (the call's other arguments, so that a refusal is about the one argument changed) and its hostile
values: wrong type, ``None`` where the annotation has no ``None``, NaN and inf, negative and huge numbers, empty
and wrong-rank tensors, float ids; for a callable that takes a model also the values past that model (ids past its
vocabulary, a layer past its last block, prompts longer than its context, a node of a larger model).
:func:`violations` runs every (callable, parameter, hostile value) and lists what breaks the contract.
"""

import ast
import collections.abc
import enum
import importlib
import inspect
import json
import re
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

PACKAGE = Path(__file__).parent.parent / "p0circuit"


# ---- the rules a refusal is held to (shared with the hand table, tests/test_hostile_inputs.py) -------------------

def _atoms(value: object) -> set:
    """The pieces of a value a message may quote: the value itself, its items, the parts of a
    ``kind:path`` entry."""
    if isinstance(value, (list, tuple)):
        return {repr(value)[:12]} | set().union(*(_atoms(v) for v in value)) if value else {"[]", "empty", "no "}
    if isinstance(value, dict):
        return set().union(*(_atoms(k) | _atoms(v) for k, v in value.items())) if value else {"{}"}
    text = str(value)
    atoms = {repr(value)[:12], text[:12], *(part for part in text.split(":") if part)}
    if isinstance(value, str) and value[:1] in "{[":
        try:
            atoms |= _atoms(json.loads(value))
        except ValueError:
            pass
    return atoms


WHAT_A_FUNCTION_DID = ("returned", " read ")
"""A metric function's fault is named by what it returned or read, not by the function."""


def _word(w: str, message: str) -> bool:
    """``w`` in ``message`` as a word of its own (not inside another word or number: 'int' is not in 'prints',
    '1' not in 'index 12')."""
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(w) + r"(?![A-Za-z0-9_])", message) is not None


def named(message: str, param: str, value: object) -> bool:
    """The message names the parameter or shows the value (the user sees what to change): the parameter's name (or
    its singular, or with spaces) as a word, the value's type as what it "got", the value's repr, or a piece of the
    value as a word (a number of one or two digits only where it is shown as a value: ``=5``, ``(5)``, ``got 5``,
    ``id 5``)."""
    names = {param, param.rstrip("s"), param.replace("_", " ")}
    if any(_word(w, message) for w in names if w) or f"got {type(value).__name__}" in message:
        return True
    if callable(value):
        return any(w in message for w in WHAT_A_FUNCTION_DID)
    if isinstance(value, str) and (repr(value) in message or (not value.strip() and _word("empty", message))):
        return True
    pieces = {a.strip() for a in _atoms(value)} - {""}
    shown = ("={}", "({})", "got {}", "id {}", "[{}", "{!r}", "layer {}", "block {}", "position {}", "head {}")
    return any(_word(a, message) if not (len(a) == 1 or a.startswith("-") and len(a) == 2)
               else any(_word(f.format(a), message) for f in shown) for a in pieces)


def _ours(err: Optional[BaseException]) -> bool:
    from p0circuit.core.errors import P0CircuitError

    return isinstance(err, P0CircuitError)


RULES = {
    "raises one of p0circuit's errors (never a result, never an error from inside torch or Python)":
        lambda err, param, value: _ours(err),
    "the message names the parameter or shows the value":
        lambda err, param, value: err is not None and named(str(err), param, value),
}
"""One check per rule; every hostile value goes through every rule."""


# ---- the surface ------------------------------------------------------------------------------------------------

def documented_modules() -> list[str]:
    """``p0circuit`` and every module of it whose source declares an ``__all__`` (what it exposes), by name."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
               for n in tree.body):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@dataclass(frozen=True)
class Entry:
    """One public callable: its name (``p0circuit.Node.parse``) and the callable."""

    name: str
    fn: Callable


def _classes_in(hint: Any) -> set:
    """The classes a return annotation names (``list[Weight]`` -> Weight)."""
    if isinstance(hint, type):
        return {hint}
    return set().union(*(_classes_in(a) for a in typing.get_args(hint))) if typing.get_args(hint) else set()


def _returns(fn: Callable) -> set:
    fn = inspect.unwrap(fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn)
    try:  # (typing.get_type_hints reads nothing of an entry point: it is marked no_type_check)
        hint = inspect.get_annotations(fn, eval_str=True).get("return")
    except Exception:  # an annotation that does not resolve names no class
        return set()
    return _classes_in(hint)


def _methods(cls: type) -> list[tuple[str, Callable]]:
    """The public class- and static methods ``cls`` itself defines."""
    return [(k, getattr(cls, k)) for k, v in vars(cls).items()
            if isinstance(v, (classmethod, staticmethod)) and not k.startswith("_")]


def surface(modules: Optional[list[Any]] = None) -> tuple[list[Entry], dict[str, str]]:
    """(the public callables of ``modules`` (default: :func:`documented_modules`), each once; the public names left
    out, with why). See the module docstring for what is covered."""
    modules = modules if modules is not None else [importlib.import_module(m) for m in documented_modules()]
    found: dict[str, Any] = {}
    for module in modules:
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            found.setdefault(f"{module.__name__}.{name}", obj)
    callables = [(n, o) for n, o in found.items() if callable(o)]
    classes = {o for _, o in callables if isinstance(o, type)}
    results = set()
    for _, o in callables:
        for fn in ([o] if not isinstance(o, type) else [m for _, m in _methods(o)]):
            results |= _returns(fn)
    entries: dict[int, Entry] = {}
    skipped: dict[str, str] = {}
    for name, obj in found.items():
        if not callable(obj):
            skipped[name] = "not callable (a constant)"
            continue
        if not isinstance(obj, type):
            entries.setdefault(id(inspect.unwrap(obj)), Entry(name, obj))
            continue
        for method, fn in _methods(obj):
            entries.setdefault(id(inspect.unwrap(getattr(fn, "__func__", fn))), Entry(f"{name}.{method}", fn))
        if issubclass(obj, (BaseException, enum.Enum)):
            skipped[name] = "an exception or an enum"
        elif any(c is not obj and issubclass(c, obj) for c in classes):
            skipped[name] = "a base class users subclass"
        elif obj in results and not getattr(obj, "__no_type_check__", False):
            skipped[name] = "a result (a public callable returns it; it checks no fields of its own)"
        elif obj.__name__ in ATTACHED:
            skipped[name] = "a result's record (a search attaches it to the Circuit it returns)"
        else:
            entries.setdefault(id(obj), Entry(name, obj))
    return sorted(entries.values(), key=lambda e: e.name), skipped


ATTACHED = {"NodeSearch", "EdgeSearch"}
"""Records a circuit search attaches to the :class:`~p0circuit.Circuit` it returns (``circuit.search``,
``circuit.edge_search``): results, read and never made by a user, as a returned class is."""


# ---- the kinds of argument --------------------------------------------------------------------------------------

class Ctx:
    """The valid objects the calls start from (built once): the planted model, its prompts and results, and a model
    larger than it (another model's objects)."""

    def __init__(self, tmp: Path) -> None:
        import torch

        import p0circuit as p0
        from p0circuit.patching.order import hook_order

        self.tmp = tmp
        self.pm = p0.build_planted()
        self.model = self.pm.model
        hook_order(self.model)  # the one-time trace, here: a refusal counted as a forward is the call's own
        self.tokens = p0.probe_tokens(self.model, 4, 8, seed=0, regular=True)
        self.result = p0.activation_patch(self.model, self.tokens, metric="norm_ratio:1")
        self.faithful = p0.faithful_circuit(self.result)
        self.pruned = p0.prune(self.faithful, top_k=1)  # a Circuit that lost its search
        self.setup = self.result.setup
        self.larger = p0.build_planted(n_layers=6, d_vocab=48)  # another model: more blocks, a larger vocabulary
        self.other_setup = p0.Setup.of(self.larger.model, p0.probe_tokens(self.larger.model, 4, 8, regular=True),
                                       metric="norm_ratio:1")
        self.file = tmp / "a-file"
        self.file.write_text("x")
        self.dir = tmp / "a-directory"
        self.dir.mkdir()
        self.torch = torch
        cfg = self.model.cfg
        self.n_layers, self.d_vocab, self.n_ctx, self.d_model = cfg.n_layers, cfg.d_vocab, cfg.n_ctx, cfg.d_model
        with torch.no_grad():
            _, self.cache = self.model.run_with_cache(self.tokens)
        layers = range(cfg.n_layers)
        self.patterns = torch.stack([self.cache[f"blocks.{l}.attn.hook_pattern"] for l in layers])
        self.resid = torch.stack([self.cache[f"blocks.{l}.hook_resid_post"] for l in layers])  # (L, B, T, d)
        self.alpha = p0.measures.attention_to_position(self.patterns, 0)
        import pandas as pd

        self.frame = pd.DataFrame({"change_p0": [0.1], "change_rest": [0.2], "cos_h0": [0.9], "cos_h_other": [0.5],
                                   "kind": ["planted"], "norm_ratio_L0": [2.0]})
        from p0circuit.studies import experiments, training
        from p0circuit.surfaces import sweep

        self.curve = experiments.cone_monte_carlo(1.0, 1.0, 4, 6, n=8)
        self.sweep = sweep.SweepConfig(models=["planted:rope"], methods=["activation"], corruptions=["shift"],
                                       n_prompts=2, seq_len=8)
        self.cell = self.sweep.cells()[0]
        self.spec = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16)
        self.train = training.TrainConfig(steps=1, batch_size=2, seq_len=8, warmup=0, n_checkpoints=1)
        self.source = training.MarkovSource(16)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.0)


@dataclass(frozen=True)
class Kind:
    """What an argument is: a valid value, and its hostile values (``(label, value)``), those that hold whatever the
    model (``hostile``) and those past the model a callable takes (``past``)."""

    valid: Callable[[Ctx], Any]
    hostile: Callable[[Ctx], list[tuple[str, Any]]] = lambda c: []
    past: Callable[[Ctx], list[tuple[str, Any]]] = lambda c: []


NUMBER = [("a string", "1"), ("a list", [1]), ("True", True)]
FLOAT_BAD = NUMBER[:2] + [("NaN", math.nan), ("inf", math.inf), ("-inf", -math.inf)]
INT_BAD = NUMBER + [("a float", 2.5), ("NaN", math.nan), ("a huge int", 10**30)]


def _t(c: Ctx, *shape: int, fill: int = 0, dtype: Any = None) -> Any:
    return c.torch.full(shape, fill, dtype=dtype or c.torch.long)


def _tokens_bad(c: Ctx) -> list[tuple[str, Any]]:
    return [("text", "some text"), ("a list of lists", [[1, 2, 3]]), ("3-D", _t(c, 2, 4, 8)), ("0-D", _t(c)),
            ("float ids", c.tokens.float()), ("bool ids", c.tokens > 3), ("an empty batch", _t(c, 0, 8)),
            ("no positions", _t(c, 4, 0)), ("negative ids", _t(c, 4, 8, fill=-1))]


def _tokens_past(c: Ctx) -> list[tuple[str, Any]]:
    return [("ids past the vocabulary", _t(c, 4, 8, fill=c.d_vocab)), ("huge ids", _t(c, 4, 8, fill=10**9)),
            ("longer than the context", _t(c, 2, c.n_ctx + 1, fill=1)), ("one position", c.tokens[:, :1])]


def _float_bad(c: Ctx, valid: Any) -> list[tuple[str, Any]]:
    """Hostile values of a float tensor argument shaped like ``valid``: wrong rank, integer ids, NaN, inf, no tensor."""
    nan, inf = valid.contiguous().clone(), valid.contiguous().clone()
    nan.view(-1)[0], inf.view(-1)[0] = math.nan, math.inf
    return [("wrong rank", valid.reshape(-1)[:3] if valid.ndim > 1 else valid[None, None]), ("integer ids", c.tokens),
            ("NaN", nan), ("inf", inf), ("a list", valid.tolist()), ("a number", 3.0)]


def _names(example: str) -> Callable[[Ctx], list[tuple[str, Any]]]:
    def bad(c: Ctx) -> list[tuple[str, Any]]:
        return [("one name, not a list", example), ("a number", [3]), ("garbage", ["garbage"]), ("None", [None]),
                ("a sign", ["A+0.H0@0"]), ("a space", ["M 1@0"]), ("non-ASCII digits", ["A\u0663.H0@0"])]
    return bad


KINDS: dict[str, Kind] = {
    "model": Kind(lambda c: c.model, lambda c: [("a string", "model"), ("a number", 3), ("a torch module",
                                                                                       c.torch.nn.Linear(2, 2))]),
    "entry": Kind(lambda c: "planted:rope", lambda c: [("a number", 3), ("empty", ""), ("unknown", "nope:x")]),
    "tokens": Kind(lambda c: c.tokens, _tokens_bad, _tokens_past),
    "layer": Kind(lambda c: 1, lambda c: INT_BAD + [("-1", -1)], lambda c: [("past the last block", c.n_layers),
                                                                             ("far past", 10**6)]),
    "layers": Kind(lambda c: [1], lambda c: [("one int", 1), ("a string", "1"), ("-1", [-1]), ("True", [True]),
                                             ("a float", [2.5])], lambda c: [("past the last block", [c.n_layers])]),
    "position": Kind(lambda c: 0, lambda c: INT_BAD + [("-1", -1)], lambda c: [("far past", 10**6)]),
    "dims": Kind(lambda c: [0], lambda c: [("one int", 0), ("-1", [-1]), ("a float", [2.5]), ("a string", "0")],
                 lambda c: [("past the model's width", [c.d_model])]),
    "nodes": Kind(lambda c: ["M0@0"], _names("A0.H0@0"), lambda c: [("a larger model's node", ["A9.H0@0"])]),
    "edges": Kind(lambda c: ["M0@0->M1@0.mlp_in"], _names("M0@0->M1@0.mlp_in"),
                  lambda c: [("a larger model's edge", ["M0@0->M9@0.mlp_in"])]),
    "circuit": Kind(lambda c: c.pm.truth, lambda c: [("a string", "c"), ("a dict", {}), ("a planted model", c.pm)]),
    "faithful": Kind(lambda c: c.faithful, lambda c: [("a string", "c"), ("a Circuit no search made", c.pm.truth),
                                                      ("a pruned search", c.pruned),
                                                      ("a result", c.result)]),
    "result": Kind(lambda c: c.result, lambda c: [("a string", "r"), ("a Circuit", c.pm.truth), ("a model", c.model)]),
    "setup": Kind(lambda c: None, lambda c: [("a number", 3), ("a string", "shift"), ("a result", c.result),
                                             ("another model's setup", c.other_setup)]),
    "threshold": Kind(lambda c: 0.1, lambda c: FLOAT_BAD + [("-1", -1.0)]),
    "ratio_line": Kind(lambda c: 5.0, lambda c: FLOAT_BAD + [("-1", -1.0), ("a ratio below 1", 0.5), ("1", 1.0)]),
    "share": Kind(lambda c: 0.5, lambda c: FLOAT_BAD + [("-0.1", -0.1), ("above 1", 1.5)]),
    "positive": Kind(lambda c: 1.0, lambda c: FLOAT_BAD + [("-1", -1.0)]),
    "count": Kind(lambda c: 2, lambda c: INT_BAD + [("-1", -1)]),
    "seed": Kind(lambda c: 0, lambda c: INT_BAD + [("-1", -1), ("past 2**32", 2**64)]),
    "bool": Kind(lambda c: False, lambda c: [("a string", "yes"), ("a number", 3)]),
    "device": Kind(lambda c: "cpu", lambda c: [("unknown", "nodevice"), ("absent", "cuda:9"), ("a number", 3)]),
    "path": Kind(lambda c: c.file, lambda c: [("a number", 3), ("under a file", str(c.file / "x"))]),
    "text": Kind(lambda c: "hi", lambda c: [("a number", 3), ("bytes", b"hi")]),
    "name": Kind(lambda c: "A0.H0@0", lambda c: [("a number", 3), ("empty", "")]),
    "corruption": Kind(lambda c: "shift", lambda c: [("a number", 3), ("unknown", "nope"), ("a float", 2.5)]),
    "metric": Kind(lambda c: "norm_ratio:1", lambda c: [("a number", 3), ("a dict", {}), ("unknown", "norm")],
                   lambda c: [("past the last block", f"norm_ratio:{c.n_layers}")]),
    "callable": Kind(lambda c: (lambda *a: 0.0), lambda c: [("a number", 3), ("a string", "f")]),
    "token": Kind(lambda c: 1, lambda c: INT_BAD + [("-1", -1)], lambda c: [("past the vocabulary", c.d_vocab)]),
    "dim": Kind(lambda c: 0, lambda c: INT_BAD + [("-1", -1)], lambda c: [("past the model's width", c.d_model)]),
    "senders": Kind(lambda c: [c.pm.truth.nodes[0]], lambda c: [("one node, not a list", c.pm.truth.nodes[0]),
                                                              ("a number", [3]), ("None", [None])],
                    lambda c: [("a larger model's node", [c.larger.truth.nodes[-1].__class__.parse("A5.H0@0")])]),
    "neurons": Kind(lambda c: ["M1.N64@0"], lambda c: [("one name, not a list", "M1.N64@0"), ("a number", [3]),
                                                       ("garbage", ["garbage"]), ("not a neuron", ["A0.H0@0"])],
                    lambda c: [("past the MLP", ["M1.N99999@0"])]),
    "mapping": Kind(lambda c: {}, lambda c: [("a number", 3), ("a string", "x"), ("a list", [1])]),
    "options": Kind(lambda c: __import__("p0circuit").PatchOptions(), lambda c: [("a number", 3), ("a string", "shift"),
                                                                               ("a dict", {})]),
    "hooks_needed": Kind(lambda c: [(1, "blocks.1.hook_resid_post")], lambda c: [("a string", "x"), ("a pair short", [(1,)]),
                                                                                  ("a string layer", [("1", "x")])]),
    "logits": Kind(lambda c: None, lambda c: [("integer ids", c.tokens[:, :, None]), ("2-D", c.resid[0, :, 0]),
                                              ("a list", [[1.0]])]),
    "patterns": Kind(lambda c: c.patterns, lambda c: _float_bad(c, c.patterns)),
    "alpha": Kind(lambda c: c.alpha, lambda c: _float_bad(c, c.alpha) + [("above 1", c.alpha + 2)]),
    "states": Kind(lambda c: c.resid[1], lambda c: _float_bad(c, c.resid[1])),
    "h0": Kind(lambda c: c.resid[1, :, 0], lambda c: _float_bad(c, c.resid[1, :, 0])),
    "profile": Kind(lambda c: c.resid[:, 0, 0, 0], lambda c: [("2-D", c.resid[:, 0, 0]), ("int", c.tokens[0]),
                                                             ("a list", [1.0])]),
    "cache": Kind(lambda c: c.cache, lambda c: [("a dict", {}), ("a number", 3), ("a tensor", c.tokens)]),
    "n_layers": Kind(lambda c: c.n_layers, lambda c: INT_BAD + [("0", 0), ("-1", -1)]),
    "node_kind": Kind(lambda c: __import__("p0circuit").Kind.EMBED, lambda c: [("a string", "head"), ("a number", 3)]),
    "node": Kind(lambda c: __import__("p0circuit").Node.parse("M0@0"), lambda c: [("a name", "M0@0"), ("a number", 3)]),
    "receiver": Kind(lambda c: __import__("p0circuit").Node.parse("R1@0"), lambda c: [("a name", "R1@0"),
                                                                                       ("a number", 3)]),
    "scores": Kind(lambda c: [0.1, 0.9], lambda c: [("NaN", [math.nan, 1.0]), ("strings", ["a", "b"]),
                                                    ("one number", 0.5), ("inf", [math.inf, 1.0])]),
    "labels": Kind(lambda c: [False, True], lambda c: [("numbers", [0, 1]), ("strings", ["a", "b"]), ("one", True)]),
    "real": Kind(lambda c: 1.0, lambda c: FLOAT_BAD),
    "curve": Kind(lambda c: c.curve, lambda c: [("a number", 3), ("a dict", {})]),
    "frame": Kind(lambda c: c.frame, lambda c: [("a number", 3), ("a dict", {}), ("an empty frame", c.frame[:0]),
                                               ("other columns", c.frame.rename(columns=str.upper))]),
    "models": Kind(lambda c: {"planted": ("planted", c.model)}, lambda c: [("a number", 3), ("a list", [c.model]),
                                                                          ("a model, no kind", {"m": c.model})]),
    "records": Kind(lambda c: [], lambda c: [("a string", "x"), ("numbers", [3]), ("an empty record", [{}])]),
    "out": Kind(lambda c: c.dir, lambda c: [("a number", 3), ("a file", c.file), ("under a file", c.file / "x")]),
    "sweep_config": Kind(lambda c: c.sweep, lambda c: [("a number", 3), ("a dict", {}), ("a string", "x.toml")]),
    "cell": Kind(lambda c: c.cell, lambda c: [("a number", 3), ("a dict", {})]),
    "model_spec": Kind(lambda c: c.spec, lambda c: [("a number", 3), ("a dict", {}), ("a plant spec",
                                                                                    c.pm.spec)]),
    "plant_spec": Kind(lambda c: None, lambda c: [("a number", 3), ("a dict", {}), ("a model spec", c.spec)]),
    "train_config": Kind(lambda c: c.train, lambda c: [("a number", 3), ("a dict", {})]),
    "train_source": Kind(lambda c: c.source, lambda c: [("a number", 3), ("a string", "markov")]),
    "prompt_source": Kind(lambda c: "auto", lambda c: [("a number", 3), ("unknown", "nope")]),
    "method_name": Kind(lambda c: "activation", lambda c: [("a number", 3), ("unknown", "nope"), ("empty", "")]),
    "method_object": Kind(lambda c: __import__("p0circuit").METHODS["activation"], lambda c: [("a number", 3),
                                                                                             ("a name", "activation")]),
    "optimizer": Kind(lambda c: c.optimizer, lambda c: [("a number", 3), ("a dict", {})]),
    "choice": Kind(lambda c: None, lambda c: [("a number", 3), ("unknown", "nope")]),
    "nodes_objects": Kind(lambda c: (), lambda c: [("one name, not a list", "A0.H0@0"), ("names", ["A0.H0@0"]),
                                                   ("a number", [3])]),
    "edges_objects": Kind(lambda c: (), lambda c: [("one name, not a list", "M0@0->M1@0.mlp_in"),
                                                   ("names", ["M0@0->M1@0.mlp_in"]), ("a number", [3])]),
    "acts": Kind(lambda c: {"blocks.0.hook_resid_post": c.resid[0]}, lambda c: [("a list", [c.resid[0]]),
                                                                                  ("numbers as keys", {3: c.resid[0]})]),
}
"""The kinds of argument (see the module docstring)."""

BY_NAME = {
    "model": "model", "entry": "entry", "tokens": "tokens", "reference": "tokens", "contexts": "tokens",
    "layer": "layer", "layers": "layers", "receiver_layers": "count", "at": "position", "position": "position",
    "dims": "dims", "massive": "dims", "nodes": "nodes", "edges": "edges", "circuit": "circuit", "truth": "circuit",
    "result": "result", "setup": "setup", "threshold": "threshold", "min_signal": "threshold",
    "norm_threshold": "ratio_line", "eps": "share", "keep": "share", "cos": "share", "theta": "share",
    "target": "share", "tolerance": "share", "tol": "positive", "precision_tol": "positive", "z": "positive",
    "massive_ratio": "positive", "n": "count", "length": "count", "n_prompts": "count", "seq_len": "count",
    "top": "count", "top_k": "count", "most": "count", "per_block": "count", "window": "count", "max_size": "count",
    "max_candidates": "count", "rows_per_forward": "count", "seed": "seed", "device": "device", "path": "path",
    "text": "text", "name": "name", "corruption": "corruption", "metric": "metric", "fn": "callable",
    "threads": "count", "token": "token", "dim": "dim", "senders": "senders", "neurons": "neurons", "d": "mapping",
    "options": "options", "patterns": "patterns", "alpha": "alpha", "h": "states", "h0": "h0", "values": "profile",
    "cache": "cache", "n_layers": "n_layers", "kind": "node_kind", "src": "node", "dst": "receiver",
    "scores": "scores", "labels": "labels", "mu": "real", "sigma": "positive", "n_pos": "count", "curve": "curve",
    "frame": "frame", "models": "models", "records": "records", "out": "out", "cell": "cell", "step": "count",
    "optimizer": "optimizer", "loss": "real", "acts": "acts", "logits": "logits", "limit": "count", "workers": "count",
    "max_cells": "count", "stop_after": "count", "pos": "position", "head": "position", "neuron": "position",
    "hooks_needed": "hooks_needed",
}
"""A parameter's kind by its name (the annotation refines it: see :func:`kind_of`)."""


BY_TYPE = {"ModelSpec": "model_spec", "PlantSpec": "plant_spec", "TrainConfig": "train_config",
           "SweepConfig": "sweep_config", "Method": "method_object",
           "PatchOptions": "options", "ConeCurve": "curve", "Cell": "cell", "DataFrame": "frame"}
"""A parameter's kind by the class its annotation names (before its name: ``spec: ModelSpec``, ``spec: PlantSpec``)."""


def kind_of(entry: Entry, param: inspect.Parameter) -> Optional[str]:
    """The kind of ``param`` of ``entry`` (its annotation's class, a few annotations that change what a name means,
    else its name's), or None."""
    name, hint = param.name, param.annotation
    args = typing.get_args(hint)
    if hint is bool or (typing.get_origin(hint) is typing.Union and all(a in (bool, type(None)) for a in args)) or (
            name in ("bos", "prepend_bos") and hint in (Any, param.empty)):
        return "bool"
    if name == "d" and hint is int:
        return "count"
    if typing.get_origin(hint) is typing.Literal:
        return "choice"
    if name in ("nodes", "edges") and name[:-1] in str(hint).lower() and "str" not in str(hint):  # Circuit's fields
        return f"{name}_objects"
    if name == "circuit" and entry.name.endswith("faithful_edges"):  # a Circuit, but the one faithful_circuit returned
        return "faithful"
    named_class = [k for k in BY_TYPE if k in str(hint) or getattr(hint, "__name__", "") == k]
    if named_class and name != "setup":
        return BY_TYPE[named_class[0]]
    if hint is str and name in ("model", "source", "method", "text", "prompts"):
        return {"model": "entry", "source": "prompt_source", "method": "method_name", "text": "text",
                "prompts": "prompt_source"}[name]
    if name == "bos" and int in args:
        return "token"
    if name == "source":
        return "train_source"
    if name == "spec" and hint is Any:
        return "corruption"
    return BY_NAME.get(name)


# ---- the check --------------------------------------------------------------------------------------------------

def _optional(param: inspect.Parameter) -> bool:
    hint = param.annotation
    return param.default is None or hint is Any or type(None) in typing.get_args(hint)


def takes_model(entry: Entry) -> bool:
    """Whether the callable is given the planted model (its values past that model are hostile)."""
    return any(p.name == "model" and "str" != getattr(p.annotation, "__name__", "") for p in _params(entry))


def _params(entry: Entry) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(entry.fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in ("self", "cls") and not p.name.startswith("_")]  # a private field is no argument


@dataclass
class Case:
    """One call: ``entry`` with ``param`` set to ``value`` (``label`` says what it is), the rest valid."""

    entry: Entry
    param: str
    label: str
    value: Any
    kwargs: dict = field(default_factory=dict)


def _sets_itself(label: str, param: inspect.Parameter, params: list[inspect.Parameter]) -> bool:
    """A hostile value that the callable's own signature makes valid: a list where its annotation takes a sequence
    (``NormRatio(pos=[...])``: one position per prompt), one position where the caller sets the shortest (``min_len``)."""
    if label == "a list":
        return any(typing.get_origin(a) in (tuple, list, collections.abc.Sequence)
                   for a in (param.annotation, *typing.get_args(param.annotation)))
    return label == "one position" and any(p.name == "min_len" for p in params)


def _is_default(value: Any, param: inspect.Parameter) -> bool:
    """A hostile value that is the parameter's own default is valid by definition (``Node(layer=-1)``: no layer)."""
    default = param.default
    return (default is not param.empty and type(value) is type(default) and isinstance(value, (int, float, str))
            and value == default)


def valid_kwargs(entry: Entry, c: Ctx) -> dict[str, Any]:
    """A valid value of each required parameter of ``entry`` (the optional ones keep their defaults)."""
    out = {}
    params = _params(entry)
    takes_setup = any(p.name == "setup" for p in params)
    for p in params:
        # a patching method's model and tokens default to None only because setup= may give them: filled too
        if p.default is p.empty or (takes_setup and p.name in ("model", "tokens") and p.default is None):
            kind = kind_of(entry, p)
            out[p.name] = typing.get_args(p.annotation)[0] if kind == "choice" else KINDS[kind].valid(c)  # type: ignore
    return out


def cases(entry: Entry, c: Ctx) -> tuple[list[Case], list[str]]:
    """Every hostile call of ``entry`` (each parameter of a known kind in turn, the others valid), and what cannot be
    checked (a required parameter of no known kind)."""
    params = _params(entry)
    kinds = {p.name: kind_of(entry, p) for p in params}
    unknown = [p.name for p in params if kinds[p.name] is None and p.default is p.empty]
    if unknown:
        return [], [f"{entry.name}: parameter(s) {unknown} of no known kind: add them to tests/contract.py's BY_NAME"]
    valid = valid_kwargs(entry, c)
    out = []
    model = takes_model(entry)
    for p in params:
        kind = kinds[p.name]
        values = []
        if p.annotation is not p.empty and p.annotation is not Any and not _optional(p):
            values.append(("None", None))
        if p.annotation is not p.empty and p.annotation is not Any:
            values.append(("an object of no type it takes", object()))
        if kind is not None:
            values += KINDS[kind].hostile(c) + (KINDS[kind].past(c) if model else [])
        seen = set()
        for label, value in values:
            if label in seen or _sets_itself(label, p, params) or _is_default(value, p):
                continue
            seen.add(label)
            out.append(Case(entry, p.name, label, value, {**valid, p.name: value}))
    return out, []


def run(case: Case, c: Ctx) -> list[str]:
    """What ``case`` breaks of the contract (empty: it is refused as it should be)."""
    from p0circuit.patching.work import Count

    err: Optional[BaseException] = None
    with Count(c.model) as counted:
        try:
            case.entry.fn(**case.kwargs)
        except Exception as e:  # noqa: BLE001 - the rules judge what was raised
            err = e
    broken = [rule for rule, holds in RULES.items() if not holds(err, case.param, case.value)]
    if err is not None and _ours(err) and counted.reads > 0:
        broken.append("refused only after a forward of the model ran (check it before any work)")
    if not broken:
        return []
    got = "returned a value" if err is None else f"{type(err).__name__}: {str(err)[:150]}"
    return [f"{case.entry.name}({case.param}={case.label}): {'; '.join(broken)}; got {got}"]


def violations(entries: list[Entry], c: Ctx) -> tuple[list[str], int]:
    """Every violation of the contract by ``entries`` and the number of hostile calls made."""
    out: list[str] = []
    n = 0
    for entry in entries:
        todo, uncheckable = cases(entry, c)
        out += uncheckable
        for case in todo:
            n += 1
            out += run(case, c)
    return out, n
