"""The test-time type checker, installed before p0circuit is first imported (tests/conftest.py).

Every function and dataclass of p0circuit is checked against its annotations at each call by
beartype (``beartype.claw``), except entry points, which check their arguments themselves and
raise the errors users see. The modules whose annotations carry array shapes (jaxtyping's
``Float[Tensor, "batch pos"]``) are instead wrapped by jaxtyping's import hook, whose
``jaxtyped`` also holds a dimension name to one size across all of a call's arguments and its
return value. jaxtyping's wrapper costs tens of microseconds a call (it binds the signature twice),
so it is kept to the modules where it checks more than beartype does.
"""

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "p0circuit"
CONF = dict(is_pep484_tower=True)  # an int is accepted where a float is annotated, as the entry points do


def shaped_modules() -> list[str]:
    """The p0circuit modules that import a jaxtyping array type (read from their source)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.ImportFrom) and node.module == "jaxtyping" for node in ast.walk(tree)):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def install() -> None:
    if any(name == "p0circuit" or name.startswith("p0circuit.") for name in sys.modules):
        raise RuntimeError("p0circuit was imported before the type checker was installed")
    import beartype
    from beartype.claw import beartype_package
    from jaxtyping import install_import_hook

    shaped = shaped_modules()
    install_import_hook(shaped, "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")
    beartype_package("p0circuit", conf=beartype.BeartypeConf(claw_skip_package_names=tuple(shaped), claw_is_pep526=False,
                                                              **CONF))
