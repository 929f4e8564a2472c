"""The layout shows the architecture: each layer subpackage's docstring says what it may import
("May import: ..."), and no module imports from a layer it does not name, at the top of a file or
inside a function. A deliberate upward import is caught (the last test)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "p0circuit"
LAYERS = ("core", "models", "measures", "patching", "figures", "studies", "surfaces")


def allowed(layer: str) -> set[str]:
    """The layers ``layer`` may import, read from its own docstring."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8"))) or ""
    match = re.search(r"May import: (.*?)\.?$", doc, re.M)
    assert match, f"p0circuit/{layer}/__init__.py's docstring has no 'May import:' line"
    said = match.group(1)
    if said.startswith("every layer"):
        return set(LAYERS)
    return {layer} | set(re.findall(r"p0circuit\.(\w+)", said))


def imports(source: str, module: str = "p0circuit.x") -> list[tuple[int, str]]:
    """Every p0circuit module a source imports (line, dotted name), wherever the import sits: absolute
    and relative imports (``module`` is the importing module's dotted name), and the strings given
    to ``importlib.import_module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from ..studies import x, inside module
                parent = module.split(".")[: -node.level]
                base = ".".join(parent + ([base] if base else []))
            names = [base] if base != "p0circuit" else [f"p0circuit.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, n) for line, n in found if n == "p0circuit" or n.startswith("p0circuit.")]


def violations(layer: str, rel: str, source: str) -> list[str]:
    ok = allowed(layer)
    bad = []
    module = rel.removesuffix(".py").replace("/", ".")
    for line, name in imports(source, module):
        parts = name.split(".")
        target = parts[1] if len(parts) > 1 else "p0circuit"
        if target not in ok:
            bad.append(f"{rel}:{line} imports {name} (layer {layer!r} may import {sorted(ok)})")
    return bad


def test_every_layer_says_what_it_may_import_and_keeps_to_it():
    bad = []
    for layer in LAYERS:
        for file in sorted((PACKAGE / layer).rglob("*.py")):
            bad += violations(layer, str(file.relative_to(PACKAGE.parent)), file.read_text(encoding="utf-8"))
    assert not bad, "\n".join(bad)


def test_nothing_but_the_layers_sits_at_the_top():
    modules = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"}
    assert modules == {"__init__.py", "__main__.py", "_moved.py"}
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


def test_layers_only_look_down():
    for i, layer in enumerate(LAYERS):
        assert allowed(layer) <= set(LAYERS[: i + 1]), layer


@pytest.mark.parametrize("source", ["from p0circuit.studies.analysis import analyze\n",
                                    "def f():\n    import p0circuit.surfaces.cli\n",
                                    "from p0circuit import analyze\n",
                                    "from ..studies import analysis\n",
                                    "import importlib\nimportlib.import_module('p0circuit.surfaces.cli')\n"])
def test_an_upward_import_is_caught(source):
    assert violations("patching", "p0circuit/patching/new.py", source)


def test_the_oracle_shares_no_code_with_p0circuit():
    """tests/oracle.py and tests/tolerance.py import nothing of p0circuit, at any depth of the file."""
    for name in ("oracle.py", "tolerance.py"):
        source = (Path(__file__).parent / name).read_text(encoding="utf-8")
        assert not imports(source, f"tests.{name[:-3]}"), name


def test_only_the_studies_and_surfaces_know_the_planted_model():
    """The planted model is a test subject, not a dependency: core, measures, patching and figures import
    nothing of ``p0circuit.models.planted`` (what they share with it, like the attribute its sink heads sit
    in, lives in ``core``)."""
    bad = []
    for layer in ("core", "measures", "patching", "figures"):
        for file in sorted((PACKAGE / layer).rglob("*.py")):
            rel = file.relative_to(PACKAGE.parent)
            module = str(rel).removesuffix(".py").replace("/", ".")
            bad += [f"{rel}:{line} imports {name}" for line, name in imports(file.read_text(encoding="utf-8"), module)
                    if name.startswith("p0circuit.models.planted")]
    assert not bad, "\n".join(bad)


def test_the_layer_table_names_every_module():
    """docs/contributing.md's table ("The layers") names every module and subpackage each layer holds, so the
    table says what the files hold now (a new file without its row entry fails here)."""
    table = {}
    for line in (PACKAGE.parent / "docs" / "contributing.md").read_text(encoding="utf-8").splitlines():
        row = re.match(r"\| \d \| `(\w+)/` \| (.*) \|$", line)
        if row:
            table[row.group(1)] = row.group(2)
    assert set(table) == set(LAYERS), sorted(table)
    missing = []
    for layer in LAYERS:
        for path in sorted((PACKAGE / layer).iterdir()):
            if path.is_dir() and (path / "__init__.py").exists():
                name = f"{path.name}/"
            elif path.suffix == ".py" and path.name != "__init__.py":
                name = path.name
            else:
                continue
            if f"`{name}" not in table[layer]:
                missing.append(f"{layer}/{name}")
    assert not missing, f"docs/contributing.md's layer table does not name {missing}"
