"""The contract over the whole public API (issue 50; the machinery and the contract itself: tests/contract.py).

The surface is read from the package (``p0circuit.__all__`` and the ``__all__`` of every module that declares one),
every argument of every public callable gets the hostile values of its kind, and every one must be refused with one
of p0circuit's errors naming it, before any forward of the model. The self-check shows the same test failing on a
function added without checks, and the property test draws further hostile values of the kinds that have a range.
docs/reliability.md quotes the counts (``test_the_public_api_keeps_the_contract`` writes them).
"""

import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract as C
import docblocks
import p0circuit as p0
from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError
from p0circuit.models.checks import check_block, check_model
from p0circuit.models.tokens import check_tokens


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return C.Ctx(tmp_path_factory.mktemp("contract"))


@pytest.fixture(scope="module")
def surface():
    return C.surface()


def test_the_public_api_keeps_the_contract(ctx, surface):
    """Every hostile value of every argument of every public callable: refused, by one of p0circuit's errors that
    names it, before any forward; none left unchecked for want of a kind."""
    entries, skipped = surface
    broken, calls = C.violations(entries, ctx)
    assert not broken, f"{len(broken)} violation(s) of the contract:\n" + "\n".join(broken)
    assert len(entries) >= 100 and calls >= 2500  # the surface, and the hostile values thrown at it, stay whole
    kinds = {k for e in entries for p in C._params(e) for k in [C.kind_of(e, p)] if k}
    docblocks.check("docs/reliability.md", "contract",
                    f"**{calls} hostile calls** over **{len(entries)} public callables** (every function, class-method "
                    f"and checked constructor the package exposes; {len(skipped)} names left out: exceptions, enums, "
                    f"constants, base classes and results), from **{len(kinds)} kinds** of argument; 0 violations")


def test_the_surface_is_read_not_listed(surface):
    """What the contract covers comes from the package: every callable of ``p0circuit.__all__`` that is not an
    exception, enum, base class or plain result, and the functions of the modules that declare an ``__all__``."""
    entries, skipped = surface
    names = {e.name for e in entries}
    for name in p0.__all__:
        assert f"p0circuit.{name}" in names or f"p0circuit.{name}" in skipped, name
    for deep in ("p0circuit.measures.norm_ratio", "p0circuit.studies.training.train", "p0circuit.surfaces.sweep.run_sweep",
                 "p0circuit.studies.experiments.fit_cone", "p0circuit.Node.parse", "p0circuit.Circuit.from_json"):
        assert deep in names, deep
    assert "p0circuit.keyed_on" in names and "p0circuit.BadInputError" in skipped


# ---- the self-check: the same contract fails a function added without checks ----------------------------------

def _module(*functions):
    """A documented module holding ``functions`` (what a new public module would be)."""
    module = types.ModuleType("p0circuit_contract_selfcheck")
    for fn in functions:
        setattr(module, fn.__name__, fn)
    module.__all__ = [fn.__name__ for fn in functions]
    return module


def new_public_function(model, tokens, layer: int):
    """Added without checks: the residual norm at position 0 after ``layer``."""
    _, cache = model.run_with_cache(tokens)
    return float(cache[f"blocks.{layer}.hook_resid_post"][:, 0].norm(dim=-1).mean())


def checks_after_a_forward(model, tokens, layer: int):
    """Checks its layer only after it ran the model."""
    _, cache = model.run_with_cache(tokens)
    check_block(model, layer, "checks_after_a_forward")
    return float(cache[f"blocks.{layer}.hook_resid_post"][:, 0].norm(dim=-1).mean())


@entry_point
def with_its_checks(model, tokens, layer: int):
    """The same function, refusing bad input at its boundary."""
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2)
    check_block(model, layer, "with_its_checks")
    return new_public_function(model, tokens, layer)


def test_the_contract_fails_a_function_added_without_checks(ctx):
    entries, _ = C.surface([_module(new_public_function, checks_after_a_forward, with_its_checks)])
    assert [e.name.rsplit(".", 1)[1] for e in entries] == ["checks_after_a_forward", "new_public_function",
                                                           "with_its_checks"]  # found by the module's __all__
    unguarded, n = C.violations([entries[1]], ctx)
    text = "\n".join(unguarded)
    assert n >= 25 and len(unguarded) >= 20, text
    assert "never an error from inside torch or Python" in text and "got returned a value" in text, text
    assert "new_public_function(layer=past the last block)" in text and "(tokens=ids past the vocabulary)" in text
    late, _ = C.violations([entries[0]], ctx)
    assert any("(layer=past the last block): refused only after a forward" in v for v in late), late
    assert C.violations([entries[2]], ctx)[0] == []  # the same function with its checks keeps the contract


def test_a_parameter_of_no_known_kind_fails_the_contract(ctx):
    def takes_a_widget(model, widget):
        return widget

    _, uncheckable = C.cases(C.Entry("takes_a_widget", takes_a_widget), ctx)
    assert uncheckable and "['widget'] of no known kind" in uncheckable[0]


# ---- the property test: hostile values drawn, of the kinds that have a range --------------------------------------

DRAWN = {
    "layer": lambda c: st.one_of(st.integers(max_value=-1, min_value=-(2**70)), st.integers(c.n_layers, 2**70),
                                 st.floats(allow_nan=True).filter(lambda x: x != int(x) if math.isfinite(x) else True),
                                 st.text(max_size=4), st.none()),
    "seed": lambda c: st.one_of(st.integers(max_value=-1, min_value=-(2**70)), st.integers(2**32, 2**70),
                                st.floats(allow_nan=True), st.text(max_size=4)),
    "threshold": lambda c: st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf), st.text(max_size=4)),
    "share": lambda c: st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1.0 + 1e-6), st.just(math.nan)),
    "count": lambda c: st.one_of(st.integers(max_value=-1, min_value=-(2**70)), st.floats(allow_nan=True),
                                 st.text(max_size=4)),
    "tokens": lambda c: st.builds(
        lambda shape, fill, dtype: torch.full(shape, fill, dtype=dtype),
        st.sampled_from([(4, 8), (2, 3, 4), (0, 8), (4, 0), ()]),
        st.one_of(st.integers(-(2**30), -1), st.integers(c.d_vocab, 2**30)),
        st.sampled_from([torch.long, torch.int32, torch.float32])),
}
"""Hostile values drawn per kind: each invalid for every callable that takes that kind (with the planted model)."""


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                        HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_hostile_values_are_refused(ctx, surface, data):
    entries, _ = surface
    targets = sorted({(e.name, p.name, k) for e in entries if C.takes_model(e) for p in C._params(e)
                      for k in [C.kind_of(e, p)] if k in DRAWN})
    name, param, kind = data.draw(st.sampled_from(targets), label="argument")
    value = data.draw(DRAWN[kind](ctx), label="value")
    entry = next(e for e in entries if e.name == name)
    kwargs = {**C.valid_kwargs(entry, ctx), param: value}
    assert C.run(C.Case(entry, param, f"drawn {value!r:.40}", value, kwargs), ctx) == []


def test_a_refusal_names_the_argument_not_another():
    """The rule the contract holds a message to: the argument's name or its value, shown."""
    err = BadInputError("keyed_on: at=99 must index a position in 0..6")
    assert C.named(str(err), "at", 99) and not C.named("something else went wrong", "layer", 12345)
    # a name or a value inside another word or number is not named (the loose rule passed all three)
    assert not C.named("prints nothing useful", "layer", 3)
    assert not C.named("index 1 is out of bounds for dimension 0", "layer", 1)
    assert not C.named("internal: something broke", "n", 5)
    assert C.named("keyed_on: n=5 must be >= 8", "n", 5) and C.named("a layer past the last block", "layers", 9)
