"""Triage: attribution over every candidate first, exact patching where it matters.

Exact activation patching costs one (partial) forward per node; on a large model with a metric
read late, that is many forwards. :func:`triage_patch` runs attribution patching over all
candidates (one forward and one backward), then exact activation patching of the ``top`` nodes by
estimated effect (with a ``floor``: of those only the ``least`` strongest and the ones whose estimate reaches the
floor) and of a random ``sample`` of the others. Only exact values are reported:

* the top nodes and the sampled ones carry their exact effect;
* nodes that cannot reach the metric (causality) carry an exact 0;
* every other node is *unexamined*: NaN, never kept by a threshold. Its attribution estimate is in
  ``settings["estimates"]``: a search over the result (:func:`~p0circuit.faithful_circuit`, a faithfulness
  curve) ranks it by that estimate and corrupts it with the rest of the complement, never leaves it clean.

The sample measures what the triage may have missed: its largest |effect|, how many of its nodes
pass 0.1, and an estimate of the summed |effect| of the unexamined nodes (the sample's mean |effect|
times their number). All of it is in ``settings["triage"]``, and the result's message warns when a
sampled node passes 0.1 (raise ``top``, or ``least``, or lower ``floor``). Attribution is a first-order estimate (see
:func:`p0circuit.check_attribution`); the sample is the check that its ranking did not hide a component.
"""

import math
import random
from typing import Optional, Sequence, Union

from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import names
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.patching.setup import Setup
from p0circuit.patching.job import PatchJob
from p0circuit.patching.methods.activation import patch_nodes
from p0circuit.patching.methods.attribution import attribute
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.registry import Method, register
from p0circuit.patching.result import PatchResult, normalize
from p0circuit.patching.sites import candidate_nodes, site_of
from p0circuit.core.types import Node, parse_nodes

NOTABLE = 0.1
"""|normalized effect| of a sampled node that counts as missed by the triage."""


@entry_point
@takes_options(without=("reference",))
def triage_patch(
    model: HookedTransformer = None,  # type: ignore[assignment]  # (None: setup= gives it)
    tokens: Tensor = None,  # type: ignore[assignment]
    *,
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    top: int = 20,
    sample: int = 20,
    seed: int = 0,
    include: Sequence[Union[Node, str]] = (),
    floor: float = 0.0,
    least: int = 0,
    setup: Optional[Setup] = None,
    options: PatchOptions,
) -> PatchResult:
    """Attribution over ``nodes`` (default :func:`candidate_nodes`), exact activation patching of
    the ``top`` by estimate, of ``include`` whatever their estimate (nodes known to matter from another
    measurement: attribution can rank a node that matters far down, see the module docstring), and of
    ``sample`` others drawn with ``seed``. Of the ``top``, those whose estimate is below ``floor`` (its |normalized
    estimate|, a share of the clean-to-corrupted change) are left to the sample once ``least`` are patched: the
    exact pass then costs what the estimates say matters, not ``top`` whatever they say (0, 0: the ``top`` always;
    without a signal, as the call's ``min_signal`` judges it, a floor leaves the ``least`` strongest and draws no
    sample: no effect can be credited, so none can be missed).
    Both passes share one job: the clean and corrupted runs are cached once."""
    for name, value in (("top", top), ("sample", sample), ("least", least)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadInputError(f"{name} must be an integer >= 0, got {value!r}")
    if least > top:
        raise BadInputError(f"least={least} is more than top={top}: least counts the strongest of the top patched "
                            "exactly whatever their estimate; pass least <= top")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < math.inf:
        raise BadInputError(f"floor must be a number >= 0 (an |estimate| as a share of the clean-to-corrupted change; "
                            f"0: every one of the top), got {floor!r:.40}")
    job = PatchJob.start(model, tokens, options, setup)
    node_list = parse_nodes(nodes if nodes is not None else candidate_nodes(model))
    try:
        forced = parse_nodes(include) if include else []
    except BadInputError as err:
        raise BadInputError(f"triage_patch: include={include!r:.60}: {err}") from None
    stray = [n.name for n in forced if n not in set(node_list)]
    if stray:
        raise BadInputError(f"include names {len(stray)} node(s) that are not among the candidates ({', '.join(stray[:4])}"
                            + ("..." if len(stray) > 4 else "") + "): include only candidate nodes")
    approx = attribute(job, node_list, min_signal=0.0)  # every estimate, whatever the signal
    live = [n for n in node_list if job.reaches(site_of(n, model).hook)]
    base = job.base_metric
    ranked = sorted(live, key=lambda n: -abs(approx.raw[n.name] - base))
    # |normalized estimate| ranks as |raw - base| does (one denominator); without a signal (the job's min_signal) the
    # estimates divide by next to nothing and no effect can be credited: a floor then leaves the ``least`` strongest
    # (their raw changes are still measured)
    signal = normalize(approx.clean_metric, approx.corrupted_metric, {}, job.direction, job.min_signal, "",
                       job.setup.metric.signal_unit)[1]
    chosen = [n for i, n in enumerate(ranked[:top])
              if not floor or i < least or (signal and abs(approx.normalized[n.name]) >= floor)]
    strongest = len(chosen)
    chosen += [n for n in forced if n in set(live) and n not in set(chosen)]
    rest = [n for n in ranked if n not in set(chosen)]
    drawn = sample if signal or not floor else 0  # no signal, no effect to miss: a floor draws no sample
    sampled = random.Random(seed).sample(rest, min(drawn, len(rest)))
    exact = patch_nodes(job, chosen + sampled or node_list[:1], candidates=node_list)  # normalized against every candidate
    unexamined = len(rest) - len(sampled)
    seen = [abs(exact.normalized[n.name]) for n in sampled if not math.isnan(exact.normalized[n.name])]
    mean_seen = sum(seen) / len(seen) if seen else math.nan
    notable = sum(v >= NOTABLE for v in seen)
    report = {"candidates": len(node_list), "reachable": len(live), "exact_top": strongest,
              "included": len(chosen) - strongest, "sampled": len(sampled),
              "unexamined": unexamined, "sample_max_abs_effect": max(seen, default=math.nan),
              "sample_mean_abs_effect": mean_seen, "sample_notable": notable,
              "estimated_missed_abs_effect": mean_seen * unexamined if seen else (0.0 if not unexamined else math.nan)}
    patched = {n.name for n in chosen + sampled}
    raw, normalized = {}, {}
    for n in node_list:
        if n.name in patched:
            raw[n.name], normalized[n.name] = exact.raw[n.name], exact.normalized[n.name]
        elif n in live:
            raw[n.name], normalized[n.name] = math.nan, math.nan
        else:  # cannot reach the metric: exactly the base run
            raw[n.name], normalized[n.name] = base, (0.0 if exact.signal else math.nan)
    message = exact.message
    if notable:
        message = (f"{notable} of {len(sampled)} sampled nodes outside the {len(chosen)} patched first have |effect| >= {NOTABLE}: "
                   "the triage may have missed components; raise top" + (" or least, or lower floor" if floor else "")
                   + " (or use method='activation')")
    return PatchResult(
        method="triage", level="node", corruption=exact.corruption, metric=exact.metric, direction=job.direction,
        clean_metric=exact.clean_metric, corrupted_metric=exact.corrupted_metric, raw=raw, normalized=normalized,
        signal=exact.signal, message=message,
        settings={**exact.settings, "triage": report, "top": top, "sample": sample, "seed": seed,
                  **({"floor": floor, "least": least} if floor or least else {}),
                  "estimates": {n: float(v) for n, v in approx.normalized.items() if math.isfinite(v)}},
        setup=exact.setup,
    )


register(Method(names.TRIAGE, triage_patch, "node",
                summary="attribution over all nodes, then exact patching of the top ones and a random sample"))
