"""The measurements of one analysis, each a function of (model, prompts, settings) that returns
plain JSON values: the sink, the nodes at an onset, the edges between them, the neurons writing the
massive dimension, faithfulness, and the same questions under other corruptions and lengths.

Effects are *normalized*: the share of the clean-to-corrupted change of the metric that one
component (edge, neuron) carries when it alone is patched; positive raises the metric.
"""

import inspect
import math
import time
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.measures.norms import massive_activations

from p0circuit.core.errors import P0CircuitError
from p0circuit.measures.sink_report import SinkReport, sink_report
from p0circuit.patching import (
    ResidDim, activation_patch, attribution_patch, candidate_edges, candidate_neurons,
    candidate_nodes, faithful_circuit, faithful_edges, faithfulness_curve, path_patch,
)
from p0circuit.patching.corruptions import CORRUPTIONS, Corruption, Swap, fitting, get_corruption
from p0circuit.patching.edges import among
from p0circuit.patching.setup import Setup, sharing_clean
from p0circuit.patching.job import PatchJob
from p0circuit.patching.methods.triage import triage_patch
from p0circuit.patching.result import PatchResult
from p0circuit.core.types import Kind, Node
from p0circuit.patching.shape import BlockShape
from p0circuit.studies.analysis.setting import Setting

FAITHFULNESS_K = (1, 2, 3, 5, 8, 12, 20)
"""Circuit sizes (top-k components kept clean) of the faithfulness curves."""
WEAK_SIGNAL = 0.05
"""Share of the metric (the larger of its clean and corrupted values) below which the clean-to-corrupted
change is too small to divide by: a row's effects are then reported raw, and flagged."""
SCREEN_TOP, SCREEN_SAMPLE = 64, 16
"""A screened onset's nodes patched exactly: the strongest attribution estimates (at most ``SCREEN_TOP``), and
others drawn at random (the check of what the ranking missed)."""
SCREEN_LEAST, SCREEN_FLOOR = 16, 0.1
"""Of the ``SCREEN_TOP`` strongest estimates, the ``SCREEN_LEAST`` strongest are patched exactly whatever they say, the
rest only at |estimate| >= ``SCREEN_FLOOR`` x the analysis' threshold (a tenth of the line a node is kept at): a pass
costs what its estimates say matters. Attribution can underestimate an early head several times over (SmolLM2's
block-11 onset without BOS: A0.H0@0 estimated 0.025, exact 0.137, ranked 19th; at a quarter of the line the screen
missed it), hence a tenth. docs/performance.md gives the measured recall."""
SCREEN_EXPECTED = SCREEN_LEAST + SCREEN_SAMPLE
"""Nodes the cost model expects a screen to patch exactly (a real onset's estimates are mostly near zero)."""
VARIATION_SAMPLE = 0
"""Others drawn at random in a variation's screen (every corruption side by side, other prompt lengths): none. A
variation reports each corruption's or length's signal and strongest nodes beside the onset's own pass, whose screen
(and the sink circuit's) draws :data:`SCREEN_SAMPLE` as the check of what the ranking missed; the sample would be
half a variation's exact patching (docs/performance.md)."""
VARIATION_EXPECTED = SCREEN_LEAST + VARIATION_SAMPLE
"""Nodes the cost model expects a variation's screen to patch exactly."""


def screened(candidates: int, exact_nodes: int) -> bool:
    """Whether an onset of ``candidates`` nodes is screened: above ``exact_nodes`` (0: never), and only where
    the screen patches fewer nodes than there are."""
    return bool(exact_nodes) and candidates > max(exact_nodes, SCREEN_TOP + SCREEN_SAMPLE)
UNSTABLE_EFFECT = 3.0
"""|normalized effect| of one component above which the normalization does not carry (one node moving
the metric three times the whole clean-to-corrupted change): the row's effects are reported raw, and flagged."""


def normalization(result: PatchResult, k: int = 8) -> dict[str, Any]:
    """Whether ``result``'s normalized effects can be read as shares of the change: ``signal_share``
    (|clean - corrupted| over the metric's size), ``largest_effect``, ``stable``, ``why`` (when not),
    and ``raw_changes``: the ``k`` largest changes of the metric itself, which hold either way."""
    clean, corrupted = result.clean_metric, result.corrupted_metric
    scale = max(abs(clean), abs(corrupted))
    share = abs(clean - corrupted) / scale if scale > 0 and math.isfinite(scale) else 0.0
    finite = [abs(v) for v in result.normalized.values() if math.isfinite(v)]
    biggest = max(finite, default=0.0)
    why = []
    if share < WEAK_SIGNAL:
        why.append(f"the clean-to-corrupted change ({clean:.4g} -> {corrupted:.4g}) is {share:.1%} of the metric, "
                   f"below {WEAK_SIGNAL:.0%}")
    if biggest > UNSTABLE_EFFECT:
        why.append(f"one component's normalized effect reaches {biggest:.3g}, above {UNSTABLE_EFFECT:g}: the change it "
                   "is divided by is small against what single components move")
    base = clean if result.direction == "noise" else corrupted
    changes = sorted(((n, result.raw[n] - base) for n in result.raw if math.isfinite(result.raw[n])),
                     key=lambda kv: -abs(kv[1]))[:k]
    return {"signal_share": round(share, 4), "largest_effect": round(biggest, 4), "stable": not why,
            "why": "; ".join(why), "raw_changes": {n: round(float(v), 4) for n, v in changes}}


def strong(result: PatchResult, threshold: float, k: Optional[int] = None) -> dict[str, float]:
    """``name -> normalized effect`` of the components at or above ``threshold``, strongest first."""
    items = sorted(((n, v) for n, v in result.normalized.items() if math.isfinite(v) and abs(v) >= threshold),
                   key=lambda kv: -abs(kv[1]))
    return {n: round(float(v), 4) for n, v in items[:k]}


def sinks(setting: Setting, tokens: Tensor) -> tuple[SinkReport, dict[str, Any]]:
    """The sink report of a BOS ``setting``'s prompts ``tokens`` (at its onset line) and its JSON summary (a
    :class:`~.records.SinkSummary`: ``bos``, ``sink_rate``, ``norm_stages`` as [kind, layer, ratio], ``massive_dims``
    (per dimension: its first and last layer at P0 and its peak), ``sink_positions``, ...)."""
    rep = sink_report(setting.model, tokens, bos=setting.bos, norm_threshold=setting.s.norm_threshold)
    dims: dict[int, dict[str, Any]] = {}
    for layer, dim, value, ratio in rep.massive:
        d = dims.setdefault(dim, {"dim": dim, "first_layer": layer, "last_layer": layer, "peak_value": value,
                                  "peak_ratio": ratio, "peak_layer": layer})
        d["last_layer"] = layer
        if ratio > d["peak_ratio"]:
            d.update(peak_value=value, peak_ratio=ratio, peak_layer=layer)
    massive = sorted(dims.values(), key=lambda d: -d["peak_ratio"])[:8]
    return rep, {
        "bos": setting.bos, "sink_rate": rep.sink_rate, "norm_stages": [list(s) for s in rep.norm_stages],
        "massive_dims": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in d.items()} for d in massive],
        "sink_positions": [s.to_dict() for s in rep.sink_positions],
        "norm_ratio": rep.norm_ratio_resid, "alpha": rep.alpha, "sink_rate_per_layer": rep.sink_rate_per_layer,
        "direction_stability": rep.direction_stability, "direction_to_onset": rep.direction_to_onset,
        "direction_stability_ordinary": rep.direction_stability_ordinary,
        "direction_stability_unmassive": rep.direction_stability_unmassive,
        "n_prompts": rep.n_prompts, "seq_len": rep.seq_len,
    }


def drop(setup: Setup) -> float:
    """``clean - corrupted`` of the setup's metric under its corruption (two forwards up to the metric's block)."""
    job = PatchJob.of(setup).cache(set())
    return job.clean_metric - job.corrupted_metric([])


def choose(setup: Setup, names: Sequence[str], seed: int) -> tuple[Setup, dict[str, Any]]:
    """Of the corruptions ``names`` (made with ``seed``), the one that lowers the setup's metric most (the sink depends
    on what it changes), as the setup that uses it, with each one's drop and the reason, for the record."""
    setups = {n: setup.corrupting(get_corruption(n, seed=seed)) for n in names}
    drops = {n: drop(v) for n, v in setups.items()}
    best = max(drops, key=lambda n: drops[n])
    metric = setup.metric
    why = (f"'{best}' lowers {metric.name} most (the drop, clean minus corrupted: "
           + ", ".join(f"{n} {v:+.4g}" + (" (it raises the metric)" if v < 0 else "") for n, v in drops.items()) + ")")
    if drops.get("swap", 0.0) <= 0 < drops.get("shift", 0.0):
        why += ("; replacing the BOS token does not remove the sink, so it is built on position 0, not on the "
                "BOS token")
    return setups[best], {"drops": {n: round(v, 4) for n, v in drops.items()}, "chosen": best, "why": why}


def onset_nodes(model: Any, layer: int, corruption: Corruption, at: int = 0) -> list[Node]:
    """The candidate nodes of an onset: every head and MLP output (at the sink's index ``at``, P0 by default, and
    at the rest) up to its block, and the token embedding there when the corruption changes a token in place
    (``swap``)."""
    return [n for n in candidate_nodes(model, positions=(at,), embed=isinstance(corruption, Swap)) if n.layer <= layer]


def nodes(setup: Setup, layer: int, threshold: float, exact_nodes: int = 0, seed: int = 0, at: int = 0,
          include: Sequence[str] = (), included: str = "named nodes", sample: Optional[int] = None
          ) -> tuple[PatchResult, dict[str, Any]]:
    """Activation patching of :func:`onset_nodes` (up to block ``layer``) on ``setup`` (its metric): of every one, or, when there are more than
    ``exact_nodes`` (> 0), of the strongest attribution estimates (:data:`SCREEN_LEAST`, and up to :data:`SCREEN_TOP`
    those at or above :data:`SCREEN_FLOOR` x ``threshold``), of the candidates among
    ``include`` (nodes another pass found, patched exactly whatever their estimate; ``included`` names them in the
    record) and of ``sample`` (None: :data:`SCREEN_SAMPLE`)
    others drawn with ``seed`` (:func:`~p0circuit.patching.methods.triage.triage_patch`; the rest are
    unexamined: no effect is reported for them, and a circuit search over the result still corrupts them)."""
    t = time.perf_counter()
    sample = SCREEN_SAMPLE if sample is None else sample
    cands = onset_nodes(setup.model, layer, setup.corruption, at)
    screen: Optional[dict[str, Any]] = None  # every candidate patched exactly
    if screened(len(cands), exact_nodes):
        known = set(cands)
        forced = [n for n in include if Node.parse(n) in known]
        floor = SCREEN_FLOOR * threshold
        res = triage_patch(setup=setup, nodes=cands, top=SCREEN_TOP, sample=sample, seed=seed, include=forced,
                           floor=floor, least=min(SCREEN_LEAST, SCREEN_TOP))
        tri = res.settings["triage"]
        reach = (f" ({tri['reachable']} of them can change the metric)" if tri["reachable"] < len(cands) else "")
        screen = {"how": f"attribution patching over all {len(cands)} candidates{reach} (one forward and backward), "
                         f"then exact activation patching of the {tri['exact_top']} strongest estimates (the "
                         f"{SCREEN_LEAST} strongest, and of the next those at |estimate| >= {floor:g}, at most "
                         f"{SCREEN_TOP} in all), "
                         + (f"of {tri['included']} more of {included} (those outside the top {tri['exact_top']}), "
                            if tri["included"] else "")
                         + (f"and of {tri['sampled']} others drawn at random" if sample else
                            "and no others drawn at random (a variation: the sample that checks the ranking is "
                            "drawn in the onset's own pass, under its own corruption and prompts only)")
                         + f"; {tri['unexamined']} unexamined (no "
                           "effect reported; the circuit search still ranks them by their estimate and corrupts those "
                           "outside its circuit)",
                  **{k: ((round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in tri.items()
                     if k in ("exact_top", "included", "sampled", "unexamined", "sample_max_abs_effect",
                              "sample_notable")}}
    else:
        res = activation_patch(setup=setup, nodes=cands)
    return res, {"corruption": res.corruption, "corruption_params": res.settings.get("corruption_params", {}),
                 "metric": res.metric, "clean": res.clean_metric, "corrupted": res.corrupted_metric,
                 "signal": res.signal, "message": res.message, "candidates": len(res.raw),
                 "normalization": normalization(res),
                 "nodes": strong(res, threshold), "effects": strong(res, 0.0) if res.signal else {},
                 "screen": screen, "seconds": round(time.perf_counter() - t, 2)}


def circuit_edges(setup: Setup, layer: int, found: dict[str, Any], node_effects: dict[str, float],
                  threshold: float) -> dict[str, Any]:
    """The onset's edges: those of its faithful circuit ``found`` (searched with it, by :func:`circuit`: each
    edge alone by path patching, then pruned as a set) at or above ``threshold``; where there is no such
    search (the node circuit is not faithful, or it has too many candidate edges), path patching between
    the strongest single nodes as a screen, said so."""
    ec = found.get("edge_circuit") or {}
    if ec.get("effects"):
        return {"edges": {k: round(v, 4) for k, v in sorted(ec["effects"].items(), key=lambda kv: -abs(kv[1]))
                          if abs(v) >= threshold},
                "candidates": ec["candidates"], "signal": True,
                "of": "the edges between the faithful circuit's nodes and into the metric, each alone"}
    out = edges(setup, layer, node_effects, threshold)
    out["of"] = "the edges between the 8 strongest single nodes, each alone (a screen: " + \
        (ec.get("note") or ec.get("why") or "no faithful circuit") + ")"
    return out


def edges(setup: Setup, layer: int, node_effects: dict[str, float], threshold: float,
          max_nodes: int = 8) -> dict[str, Any]:
    """Path patching of the edges between the strongest nodes (senders) into the kept nodes' inputs
    (:func:`~p0circuit.patching.edges.among`: a key/value head counts when a query head of its group is kept)."""
    kept = [Node.parse(n) for n in list(node_effects)[:max_nodes]]
    senders = sorted(n for n in kept if n.kind != Kind.EXPERT)
    if not senders:
        return {"edges": {}, "candidates": 0, "note": "no sender among the kept nodes"}
    model = setup.model
    cands = among(model, candidate_edges(model, senders, receiver_layers=layer + 1, metric=setup.metric), kept)
    if not cands:
        return {"edges": {}, "candidates": 0, "note": "no edge between the kept nodes"}
    t = time.perf_counter()
    res = path_patch(setup=setup, edges=cands)
    return {"edges": strong(res, threshold), "candidates": len(cands), "signal": res.signal,
            "seconds": round(time.perf_counter() - t, 2)}


def massive_dim_at(model: Any, tokens: Tensor, layer: int, at: int) -> Optional[int]:
    """The strongest massive dimension (:func:`~p0circuit.measures.norms.massive_activations`) of block
    ``layer``'s output at index ``at``, or None."""
    name = hooks.resid_post(layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name, stop_at_layer=layer + 1)
    found = massive_activations(cache[name], pos=at)
    return max(found, key=lambda d: d[2])[0] if found else None


def neurons(setup: Setup, layer: int, dim: int, node_effects: dict[str, float], threshold: float, keep: int,
            steps: int, at: int = 0) -> dict[str, Any]:
    """The neurons at the sink's index ``at`` (P0 by default) that write massive dimension ``dim`` at block
    ``layer`` (``setup``'s model, prompts and corruption; the metric is that dimension's value): integrated gradients over every neuron of the MLPs up to the onset that the node pass kept (and
    the onset's own MLP), then exact activation patching of the ``keep`` strongest estimates."""
    model = setup.model
    shape = BlockShape.of(model)
    if shape.attn_only or shape.experts:
        return {"neurons": {}, "note": "attention-only model" if shape.attn_only else
                "mixture of experts: see the expert nodes instead"}
    mlps = sorted({Node.parse(n).layer for n in node_effects if Node.parse(n).kind == Kind.MLP} | {layer})[-4:]
    cands = candidate_neurons(model, mlps, positions=(at,))
    metric = ResidDim(layer, dim, pos=at)
    setup = setup.measuring(metric)
    t = time.perf_counter()
    est = attribution_patch(setup=setup, nodes=cands, steps=steps, min_signal=0.0)
    screen_s = time.perf_counter() - t
    ranked = sorted((n for n in est.normalized if math.isfinite(est.normalized[n])),
                    key=lambda n: -abs(est.normalized[n]))[:keep]
    t = time.perf_counter()
    exact = activation_patch(setup=setup, nodes=ranked)
    confirm_s = time.perf_counter() - t
    curve = []
    if exact.signal:
        fr = [k / len(ranked) for k in (1, 2, 4, 8, 16) if k <= len(ranked)]
        curve = [(int(kept), round(f, 4)) for _, kept, f in
                 faithfulness_curve(exact, fractions=fr)]
    return {"metric": metric.name, "mlps": mlps, "candidates": len(cands), "confirmed": len(ranked),
            "clean": exact.clean_metric, "corrupted": exact.corrupted_metric, "signal": exact.signal,
            "message": exact.message, "neurons": strong(exact, threshold),
            "faithfulness_within_confirmed": {str(k): f for k, f in curve},
            "screen": f"integrated gradients, {steps} steps per MLP, {len(cands)} neurons; exact patching of the "
                      f"top {len(ranked)}", "seconds": {"screen": round(screen_s, 2), "confirm": round(confirm_s, 2)}}


def faithfulness(result: PatchResult) -> dict[str, float]:
    """Share of the clean-to-corrupted change kept with the top-k nodes clean and every other one corrupted."""
    if not result.signal:
        return {}
    n = len(result.raw)
    ks = [k for k in FAITHFULNESS_K if k <= n]
    curve = faithfulness_curve(result, fractions=[k / n for k in ks])
    return {str(int(kept)): round(f, 4) for _, kept, f in curve}


def circuit(result: PatchResult, max_edges: Optional[int] = None, require_denoising: bool = True) -> dict[str, Any]:
    """The onset's faithful circuit (:func:`~p0circuit.patching.circuit_search.faithful_circuit`), or why
    there is none, and its edges (:func:`~p0circuit.patching.circuit_edges.faithful_edges`), searched also when the
    node circuit keeps the target but holds more nodes than the budget; the top-k faithfulness curve stays beside it
    as a screen."""
    if not result.signal:
        return {"note": f"no signal: {result.message}"}
    t = time.perf_counter()
    circuit_ = faithful_circuit(result, require_denoising=require_denoising)
    search = circuit_.search
    found = search.to_dict()
    found["seconds"] = round(time.perf_counter() - t, 2)
    target = search.settings["target"]
    keeps = search.faithfulness >= target and (search.denoising is None or search.denoising >= target
                                               or not require_denoising)
    if not keeps:  # over the node budget but faithful, its edges are still searched: they may fit an edge budget
        found["edge_circuit"] = {"note": "the node circuit is not faithful, so its edges were not searched"}
        return found
    t = time.perf_counter()
    found["edge_circuit"] = faithful_edges(circuit_, max_candidates=max_edges).edge_search.to_dict()
    found["edge_circuit"]["seconds"] = round(time.perf_counter() - t, 2)
    return found


def circuit_targets(result: PatchResult, found: dict[str, Any], targets: Sequence[float],
                    require_denoising: bool = True) -> dict[str, dict[str, Any]]:
    """The faithful circuit of ``result`` searched at each faithfulness target of ``targets`` (the one already
    ``found``, at its own target, reused): target (``"0.8"``) -> its nodes, size and measures, without edges."""
    if "nodes" not in found:
        return {}
    keys = ("nodes", "size", "candidates", "faithfulness", "denoising", "completeness", "faithful", "why", "settings")
    out = {}
    for t in targets:
        if t == found["settings"]["target"]:
            c = found
        else:
            c = faithful_circuit(result, target=t, require_denoising=require_denoising).search.to_dict()
        out[f"{t:g}"] = {k: c[k] for k in keys}
    return out


def corruption_variants(bos_at_p0: bool) -> list[str]:
    """Corruptions compared at the first onset: every registered one (a plugin's included), those
    that can see the run's P0 mechanism first (:func:`p0circuit.patching.corruptions.fitting`)."""
    first = fitting(bos_at_p0)
    return first + [n for n in CORRUPTIONS if n not in first]


def seeded(name: str, seed: int) -> Corruption:
    """The registered corruption ``name``, made with ``seed`` when it takes one (the random ones)."""
    cls = CORRUPTIONS[name] if name in CORRUPTIONS else None
    takes = cls is not None and "seed" in inspect.signature(cls.__init__).parameters
    return get_corruption(name, seed=seed) if takes else get_corruption(name)


def by_corruption(setup: Setup, layer: int, names: Sequence[str], threshold: float, seed: int = 0,
                  known: Optional[dict[str, dict[str, Any]]] = None, exact_nodes: int = 0) -> dict[str, Any]:
    """The onset's nodes (``setup``: its prompts and metric) under each corruption in ``names`` (made with ``seed``):
    signal, top effects, or why not. ``known``: corruption name -> the :func:`nodes` summary already measured on these prompts at
    this onset with that corruption and seed (the onset's own pass), used instead of measuring it again."""
    out: dict[str, Any] = {}
    with sharing_clean(setup) as setup:  # one clean forward and gradient for every corruption
        _by_corruption(setup, layer, names, threshold, seed, known, exact_nodes, out)
    return out


def _by_corruption(setup: Setup, layer: int, names: Sequence[str], threshold: float, seed: int,
                   known: Optional[dict[str, dict[str, Any]]], exact_nodes: int, out: dict[str, Any]) -> None:
    """:func:`by_corruption`'s loop, into ``out``."""
    for name in names:
        summary = (known or {}).get(name)
        if summary is None:
            try:
                _, summary = nodes(setup.corrupting(seeded(name, seed)), layer, threshold, exact_nodes, seed,
                                   sample=VARIATION_SAMPLE)
            except P0CircuitError as err:  # a corruption that does not fit the run is reported, not fatal
                out[name] = {"error": f"{type(err).__name__}: {err}"}
                continue
        out[name] = {k: summary[k] for k in ("metric", "signal", "clean", "corrupted", "message", "normalization")}
        out[name]["screen"] = summary["screen"]
        out[name]["nodes"] = dict(list(summary["nodes"].items())[:8])
        if summary["signal"] and summary["corrupted"] > summary["clean"]:
            out[name]["note"] = (f"the corrupted run has the stronger sink ({summary['clean']:.4g} clean, "
                                 f"{summary['corrupted']:.4g} corrupted): this corruption does not remove it, so its "
                                 "normalized effects measure nothing the sink needs")
