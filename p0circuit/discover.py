"""One entry point: :func:`discover` runs a patching method and returns a :class:`Circuit`.

Methods are registered by name in :data:`METHODS`, all with the signature
``(model, tokens, corruption=..., metric=..., **options) -> PatchResult``.
"""

from typing import Any, Callable

from torch import Tensor

from p0circuit.errors import ConfigError
from p0circuit.patching import activation_patch, attribution_patch, path_patch
from p0circuit.patching.numerics import differences
from p0circuit.patching.result import PatchResult
from p0circuit.types import Circuit, Kind


def _attribution_edges(model: Any, tokens: Tensor, **kw: Any) -> PatchResult:
    return attribution_patch(model, tokens, level="edge", **kw)


METHODS: dict[str, Callable[..., PatchResult]] = {
    "activation": activation_patch,
    "path": path_patch,
    "attribution": attribution_patch,
    "attribution_edges": _attribution_edges,
}
"""Registry: method name -> function returning a :class:`PatchResult`."""


def interpret(circuit: Circuit) -> str:
    """A one-line reading of a P0 circuit: what identifies P0 and which MLPs amplify it."""
    if circuit.settings.get("signal") is False:
        return "no signal: " + str(circuit.settings.get("message", ""))
    nodes = circuit.nodes
    if not nodes:
        return "no component passes the threshold"
    pe = [n for n in nodes if n.kind == Kind.POS_EMBED]
    heads = [n for n in nodes if n.kind == Kind.HEAD]
    mlps = [n for n in nodes if n.kind == Kind.MLP]
    first_mlp = min((n.layer for n in mlps), default=None)
    ident_heads = [n for n in heads if first_mlp is None or n.layer <= first_mlp]
    if pe:
        ident = "the position embedding (" + ", ".join(n.name for n in pe) + "); no attention head is needed to find P0"
        if ident_heads:
            ident = "the position embedding and attention (" + ", ".join(n.name for n in pe + ident_heads) + ")"
    elif ident_heads:
        ident = "attention under the causal mask (" + ", ".join(n.name for n in ident_heads) + ")"
    else:
        ident = "no identified component"
    amp = ", ".join(n.name for n in mlps) or "none"
    return f"P0 is identified by {ident}; MLPs in the circuit: {amp}"


def discover(
    model: Any,
    tokens: Any,  # validated by check_tokens
    method: str = "activation",
    corruption: Any = "shift",  # a registry name or a corruption; validated by get_corruption
    metric: Any = None,  # validated by check_metric with a clear message
    threshold: float = 0.1,
    **options: Any,
) -> Circuit:
    """Run ``method`` and keep every node (or edge) with |normalized effect| >= ``threshold``.

    The circuit carries every candidate's effect, the settings that produced it and an
    ``interpretation`` line; without signal (e.g. ``resample`` on a position-only circuit) it is
    empty and its settings say so.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    result = METHODS[method](model, tokens, corruption=corruption, metric=metric, **options)
    circuit = result.to_circuit(threshold)
    settings = {**circuit.settings, "method": method, "interpretation": ""}
    circuit = Circuit(circuit.nodes, circuit.edges, circuit.node_effects, circuit.edge_effects, settings)
    settings["interpretation"] = interpret(circuit)
    return circuit


def disagreements(approx: PatchResult, exact: PatchResult, tol: float = 0.2) -> dict[str, tuple[float, float]]:
    """Names whose normalized effects differ by more than ``tol``: name -> (approx, exact).
    :func:`p0circuit.check_attribution` runs both methods (and a float64 check) for you."""
    return differences(approx, exact, tol)
