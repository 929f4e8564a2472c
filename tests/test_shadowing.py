"""Extensions that cannot shadow: a corruption, metric entry, method or model family whose name is
taken (a built-in's or another plugin's) is refused naming both sources; a plugin imported again
replaces its own names quietly; a corruption without prepare() or with a bad name is refused where
it is defined; installed plugins under the entry-point group's old name still load, with a warning."""

import importlib
import sys
import textwrap
from importlib.metadata import EntryPoint
from typing import ClassVar

import pytest
import torch

import p0circuit as p0
from p0circuit.core import entries, plugins
from p0circuit.core.plugins import load_plugin
from p0circuit.patching import CORRUPTIONS, METHODS, Method, register
from p0circuit.patching.corruptions import Corruption, Prepared, Shift, get_corruption

HERE = __name__


@pytest.fixture(autouse=True)
def registries():
    """Every registry as it was before the test."""
    saved = (dict(CORRUPTIONS), dict(METHODS), dict(entries.METRICS), dict(entries.SPEC_FAMILIES))
    yield
    for registry, old in zip((CORRUPTIONS, METHODS, entries.METRICS, entries.SPEC_FAMILIES), saved):
        registry.clear()
        registry.update(old)


def _prepare(self, model, tokens):
    return Prepared(self, tokens, None)


@pytest.mark.parametrize("taken", ["shift", "zero"])
def test_a_class_cannot_take_a_built_in_corruptions_name(taken):
    builtin = CORRUPTIONS[taken]
    with pytest.raises(p0.ConfigError) as err:
        class Mine(Corruption):
            name: ClassVar[str] = taken
            prepare = _prepare
    assert str(err.value) == (
        f"a corruption named {taken!r} is already registered by p0circuit.patching.corruptions.{builtin.__qualname__}; "
        f"{HERE}.test_a_class_cannot_take_a_built_in_corruptions_name.<locals>.Mine cannot take it: give it another "
        "name")
    assert CORRUPTIONS[taken] is builtin and type(get_corruption(taken)) is builtin

    with pytest.raises(p0.ConfigError, match=r"already registered by p0circuit\.patching\.corruptions\.Shift; .*"
                                             r"<locals>\.NamedShift cannot take it"):
        class NamedShift(Shift):  # a subclass that names itself "shift" again
            name: ClassVar[str] = "shift"
    assert CORRUPTIONS["shift"] is Shift


def test_a_subclass_that_keeps_the_inherited_name_is_not_registered_and_works_as_an_instance(planted):
    class MyShift(Shift):
        """Shift by two unless told otherwise."""

    assert CORRUPTIONS["shift"] is Shift and MyShift not in CORRUPTIONS.values()
    assert type(get_corruption("shift")) is Shift
    tokens = p0.probe_tokens(planted.model, 4, 10, seed=0, regular=True)
    result = p0.activation_patch(planted.model, tokens, corruption=MyShift(k=2), metric=p0.NormRatio(1),
                                 nodes=["M0@0"])
    assert result.corruption == "shift" and result.settings["corruption_params"]["k"] == 2


def test_a_plugin_cannot_take_another_plugins_name_and_the_error_points_at_its_line(tmp_path):
    body = textwrap.dedent('''
        from typing import ClassVar
        from p0circuit.patching.corruptions import Corruption, Prepared


        class {cls}(Corruption):
            name: ClassVar[str] = "mine_twice"

            def prepare(self, model, tokens):
                return Prepared(self, tokens, None)
    ''')
    (tmp_path / "first.py").write_text(body.format(cls="First"))
    (tmp_path / "second.py").write_text(body.format(cls="Second"))
    first = load_plugin(str(tmp_path / "first.py"))
    with pytest.raises(p0.ConfigError) as err:
        load_plugin(str(tmp_path / "second.py"))
    message = str(err.value)
    assert f"raised ConfigError at {tmp_path / 'second.py'}, line 6: " in message  # the class, not p0circuit's code
    assert (f"a corruption named 'mine_twice' is already registered by {first.__name__}.First; "
            "p0circuit_plugin_second_") in message and ".Second cannot take it: give it another name" in message
    assert CORRUPTIONS["mine_twice"] is first.First


def test_the_same_plugin_imported_again_replaces_its_own_names_quietly(tmp_path, monkeypatch):
    """A sweep worker importing a plugin again, or a notebook reloading it: the same module.qualname."""
    (tmp_path / "reloaded_p0_plugin.py").write_text(textwrap.dedent('''
        from typing import ClassVar

        import p0circuit as p0
        from p0circuit.core.entries import register_family, register_metric
        from p0circuit.patching.corruptions import Corruption, Prepared
        from p0circuit.patching.registry import Method, register


        class Again(Corruption):
            name: ClassVar[str] = "again_test"

            def prepare(self, model, tokens):
                return Prepared(self, tokens, None)


        def build(model, block):
            return p0.NormRatio(block)


        @p0.takes_options()
        def again(model, tokens, *, options):
            return p0.activation_patch(model, tokens, options=options)


        register_metric("again_metric", build, takes_block=True)
        register(Method("again_method", again, "node"))
        register_family("again_family", n_layers=2)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("reloaded_p0_plugin")
        old = module.Again
        module = importlib.reload(module)  # no error: the names are its own
        assert CORRUPTIONS["again_test"] is module.Again is not old
        assert METHODS["again_method"].fn is module.again and entries.METRICS["again_metric"].build is module.build
    finally:
        sys.modules.pop("reloaded_p0_plugin", None)


def test_a_method_metric_entry_or_family_cannot_take_a_taken_name():
    @p0.takes_options()
    def mine(model, tokens, *, options):
        return p0.activation_patch(model, tokens, options=options)

    where = f"{HERE}.test_a_method_metric_entry_or_family_cannot_take_a_taken_name.<locals>.mine"
    with pytest.raises(p0.ConfigError) as err:
        register(Method("activation", mine, "node"))
    assert str(err.value) == ("a patching method named 'activation' is already registered by "
                              f"p0circuit.patching.methods.activation.activation_patch; {where} cannot take it: give "
                              "it another name")
    assert METHODS["activation"].fn is p0.activation_patch
    with pytest.raises(p0.ConfigError, match=r"a patching method's name must be a string of letters, digits and '_'.*"
                                             r"got 'my method': rename it"):
        register(Method("my method", mine, "node"))

    def build(model, block):
        return p0.NormRatio(block)

    def other(model, block):
        return p0.NormRatio(block)

    with pytest.raises(p0.ConfigError) as err:
        entries.register_metric("norm_ratio", build, takes_block=True)
    assert str(err.value).startswith("a metric entry named 'norm_ratio' is already registered by p0circuit (built in); "
                                     f"{HERE}.test_a_method_metric_entry_or_family_cannot_take_a_taken_name.<locals>."
                                     "build cannot take it: give it another name")
    entries.register_metric("shadow_test", build)
    with pytest.raises(p0.ConfigError, match=r"a metric entry named 'shadow_test' is already registered by "
                                             r"tests?\.?.*<locals>\.build; .*<locals>\.other cannot take it"):
        entries.register_metric("shadow_test", other)

    with pytest.raises(p0.ConfigError) as err:
        entries.register_family("rope", n_layers=2)
    assert str(err.value) == ("a model family named 'rope' is already registered with other overrides {'pos': 'rope'}; "
                              "the overrides {'n_layers': 2} cannot take it: give it another name")
    assert entries.SPEC_FAMILIES["rope"] == {"pos": "rope"}
    entries.register_family("rope", pos="rope")  # the same overrides again change nothing


def test_a_corruption_without_prepare_or_with_a_bad_name_is_refused_where_it_is_defined():
    where = f"{HERE}.test_a_corruption_without_prepare_or_with_a_bad_name_is_refused_where_it_is_defined.<locals>"
    with pytest.raises(p0.ConfigError) as err:
        class NoPrepare(Corruption):
            name: ClassVar[str] = "no_prepare_test"
    assert str(err.value) == (f"corruption 'no_prepare_test' ({where}.NoPrepare) does not define prepare(model, tokens) "
                              "-> Prepared: define it to return the corrupted prompts and their alignment; see "
                              "p0circuit.Corruption's docstring")
    assert "no_prepare_test" not in CORRUPTIONS

    for bad in (3, "my corruption", "mine:2", "2nd", None):
        with pytest.raises(p0.ConfigError) as err:
            class BadName(Corruption):
                name = bad
                prepare = _prepare
        assert str(err.value) == (f"{where}.BadName: a corruption's name must be a string of letters, digits and '_' "
                                  "that does not start with a digit (no ':', '-' or spaces), like 'my_corruption'; got "
                                  f"{bad!r}: rename it")

    class Base(Corruption):  # an abstract base: no name, no prepare
        """Shared by the two below."""

    class Concrete(Base):
        name: ClassVar[str] = "concrete_test"
        prepare = _prepare

    assert "concrete_test" in CORRUPTIONS and Base not in CORRUPTIONS.values()
    with pytest.raises(NotImplementedError, match=r"<locals>\.Base does not define prepare\(model, tokens\)"):
        Base().prepare(None, torch.zeros(1, 2, dtype=torch.long))


def test_an_installed_plugin_under_the_old_group_loads_with_a_warning(tmp_path, monkeypatch):
    (tmp_path / "old_group_p0_plugin.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        from p0circuit.patching.corruptions import Corruption, Prepared


        class OldGroup(Corruption):
            name: ClassVar[str] = "old_group_test"

            def prepare(self, model, tokens):
                return Prepared(self, tokens, None)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = {"p0circuit.plugins": [EntryPoint("legacy", "old_group_p0_plugin", "p0circuit.plugins")],
                 "p0circuit.core.plugins": [EntryPoint("current", "json", "p0circuit.core.plugins")]}
    monkeypatch.setattr(plugins, "entry_points", lambda group: installed.get(group, []))
    try:
        with pytest.warns(FutureWarning) as caught:
            loaded = plugins.load_installed()
        assert [str(w.message) for w in caught] == [
            "plugin 'legacy' (old_group_p0_plugin) is installed under the entry-point group 'p0circuit.plugins', now "
            "named 'p0circuit.core.plugins': rename the group in its pyproject "
            '([project.entry-points."p0circuit.core.plugins"]); the old name is still loaded for one release']
        assert [m.__name__ for m in loaded] == ["json", "old_group_p0_plugin"] and "old_group_test" in CORRUPTIONS
        assert [ep.name for ep in plugins.installed()] == ["current", "legacy"]  # what the command line checks for
    finally:
        sys.modules.pop("old_group_p0_plugin", None)
