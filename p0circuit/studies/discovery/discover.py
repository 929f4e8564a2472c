"""One entry point: :func:`discover` runs a registered patching method and returns a :class:`Circuit`.

Methods are records in :data:`p0circuit.patching.METHODS` (name, function, level); the
circuit's level (nodes or edges) comes from the result, and :func:`interpret` reads it in P0 terms.
"""

import inspect
from typing import Any, Mapping, Optional, Sequence, Union

from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core.defaults import CIRCUIT_THRESHOLD
from p0circuit.core.errors import BadInputError, ConfigError, warn_user
from p0circuit.measures.sink_report import no_sink, sink_report
from p0circuit.core.args import entry_point
from p0circuit.patching import METHODS, PatchResult, get_method
from p0circuit.patching.options import PatchOptions, takes_options, taken_by, unused
from p0circuit.core.types import Circuit, Edge, Kind, Node, format_effect


@entry_point
def interpret(result: PatchResult, threshold: float, no_sink: Optional[str] = None) -> str:
    """A one-line reading of a P0 circuit: what identifies P0, which components raise the metric
    and which lower it; ``no_sink`` (why the prompts show no P0 sink, :func:`p0circuit.measures.sink_report.no_sink`):
    the reading says the circuit explains the metric's change, not a sink, and names no component as identifying P0.

    A component *raises* the metric when its clean value pushes the metric above what the
    corrupted run gives: with ``clean > corrupted`` that is a positive normalized effect (noising
    it loses part of the change), a negative one *lowers* it (noising it moves the metric further
    from the corrupted value: the component works against the change).
    """
    if not result.signal:
        return "no signal: " + result.message
    if no_sink is not None and (not isinstance(no_sink, str) or not no_sink):
        raise BadInputError(f"interpret: no_sink={no_sink!r:.40} must be None or the reason, in words, that the prompts "
                            "show no P0 sink")
    keep = set(result.kept(threshold))
    kept = [item for name, item in zip(result.names, result.parsed()) if name in keep]
    nodes = sorted({n for item in kept for n in ((item.src, item.dst) if isinstance(item, Edge) else (item,))})
    if not nodes:
        return "no component passes the threshold"
    up = 1.0 if result.clean_metric >= result.corrupted_metric else -1.0  # both directions share this sign
    raising = [n for n in kept if up * result.normalized[n.name] > 0]
    lowering = [n for n in kept if up * result.normalized[n.name] < 0]
    pe = [n for n in nodes if n.kind == Kind.POS_EMBED]
    heads = [n for n in nodes if n.kind == Kind.HEAD]
    mlps = [n for n in nodes if n.kind in (Kind.MLP, Kind.NEURON)]
    first_mlp = min((n.layer for n in mlps), default=None)
    lowered = {n for n in lowering if isinstance(n, Node)}
    ident_heads = [n for n in heads if (first_mlp is None or n.layer <= first_mlp) and n not in lowered]
    if pe:
        ident = "the position embedding (" + ", ".join(n.name for n in pe) + "); no attention head is needed to find P0"
        if ident_heads:
            ident = "the position embedding and attention (" + ", ".join(n.name for n in pe + ident_heads) + ")"
    elif ident_heads:
        ident = "attention under the causal mask (" + ", ".join(n.name for n in ident_heads) + ")"
    else:
        ident = "no identified component"

    def listed(items: list) -> str:
        return ", ".join(f"{i.name} {format_effect(result.normalized[i.name])}" for i in items) or "none"

    what = "edges" if result.level == "edge" else "components"
    said = f"{what} raising {result.metric}: {listed(raising)}; lowering it: {listed(lowering)}"
    if no_sink is not None:
        return f"{no_sink}: this circuit explains the change of {result.metric}, not a sink; {said}"
    return f"P0 is identified by {ident}; {said}"


@entry_point
@takes_options()
def discover(
    model: HookedTransformer,
    tokens: Tensor,
    *,
    method: str = "activation",
    threshold: float = CIRCUIT_THRESHOLD,
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    edges: Optional[Sequence[Union[Edge, str]]] = None,
    record: Optional[Mapping[str, Any]] = None,
    options: PatchOptions,
) -> Circuit:
    """Run ``method`` and keep every node (or edge) with |normalized effect| >= ``threshold``.

    The shared options (:class:`~p0circuit.PatchOptions`, as keywords or ``options=``) go to the
    method; ``nodes``, ``edges`` and an option the method does not take (``reference`` for
    attribution) are an error for a method that does not take them, never dropped. The circuit
    carries every candidate's effect, the settings that produced it (plus ``record``, e.g. where
    the candidates came from) and an ``interpretation`` line; without signal (e.g. ``resample``
    on a position-only circuit) it is empty and its settings say so.
    """
    registered = get_method(method)
    accepted = inspect.signature(registered.fn).parameters
    given: dict[str, Any] = {}
    for name, value in (("nodes", nodes), ("edges", edges)):
        if value is None:
            continue
        if name not in accepted:
            raise ConfigError(f"method {method!r} ({registered.level}s) does not take {name}=; "
                              f"methods that do: {_taking(name)}")
        given[name] = value
    refused = unused(options, taken_by(registered.fn))
    if refused:
        raise ConfigError(f"method {method!r} does not take {refused[0]}= ({getattr(options, refused[0])!r}); "
                          f"methods that do: {_taking(refused[0])}")
    result = registered.fn(model, tokens, options=options, **given)
    if result.level != registered.level:
        raise ConfigError(f"method {method!r} is registered as {registered.level}-level but returned {result.level}s")
    why = no_sink(sink_report(result.setup.model, result.setup.tokens, bos=result.setup.options.bos)) \
        if result.setup is not None else None
    if why is not None and result.signal:
        warn_user(f"{why}: the circuit discover returns explains the change of {result.metric}, not a sink")
    extra = {"no_sink": why} if why is not None else {}
    return result.to_circuit(threshold, method=method, interpretation=interpret(result, threshold, why), **extra,
                             **(record or {}))


def _taking(param: str) -> list[str]:
    return sorted(m.name for m in METHODS.values()
                  if param in inspect.signature(m.fn).parameters or param in taken_by(m.fn))
