"""The dependency versions p0circuit runs on, checked from the installed packages' metadata (no import).

p0circuit patches TransformerLens 3.x's ``HookedTransformer``: its hook points mean what the engine
writes to them. TransformerLens 4's bridge reads the same models, but a write to some hooks means
something else there (docs/models.md, "TransformerLens 4"), so a 4.x install is refused with the reason
instead of giving wrong numbers."""

from importlib.metadata import PackageNotFoundError, version

from p0circuit.core.errors import ConfigError

TRANSFORMER_LENS = ("3.9", "4")
"""The TransformerLens versions p0circuit supports: at least the first, below the second (pyproject's range)."""


def _major_minor(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def check_transformer_lens() -> None:
    """Refuse a TransformerLens outside :data:`TRANSFORMER_LENS`, saying why and what to install."""
    try:
        found = version("transformer-lens")
    except PackageNotFoundError:
        return  # its own import will say it is missing
    low, high = TRANSFORMER_LENS
    if not _major_minor(low) <= _major_minor(found) < _major_minor(high):
        raise ConfigError(
            f"p0circuit needs transformer-lens >={low},<{high}; {found} is installed. TransformerLens 4's bridge "
            "converts the same models, but writes to hook_mlp_in and hook_k_input do not mean there what they mean "
            "in 3.x (measured: docs/models.md, 'TransformerLens 4'), so patched numbers would be wrong: "
            f"pip install 'transformer-lens>={low},<{high}'")
