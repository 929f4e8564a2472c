"""An analysis as files: ``analysis.json`` (strict JSON), ``analysis.md`` and a self-contained
``report.html`` whose figures are embedded PNG images and, for each circuit, one inline SVG with its script
(hover, click; nothing loads from the network)."""

import base64
import html
import io
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Optional, Union

from p0circuit.core.defaults import sink_rate_label
from p0circuit.core.shares import OVERSHOOT, share
from p0circuit.studies.analysis import cost
from p0circuit.studies.analysis.verdict import ANSWERS, NUMBERING, PARTS, TITLES, label
from p0circuit.studies.experiments.super_weights import PER_BLOCK, SUPER_Z, name_of
from p0circuit.studies.findings import KeyedOn, SinkReads, Unmeasured
from p0circuit.measures.positions import state_name
from p0circuit.patching.methods.triage import NOTABLE
from p0circuit.core.io import strict, write_atomic
from p0circuit.core.types import Circuit, Edge, Kind, Node
from p0circuit.studies.analysis.passes import EdgeCircuit, NeuronPass, NodeCircuit, Note
from p0circuit.studies.analysis.records import Absent, AnalysisRecord, OnsetRow, SinkSummary, Skipped, as_record
from p0circuit.studies.analysis.summaries import CorruptionVariation, LengthVariation, Part, SinkPosition, Timing
from p0circuit.figures.colours import EFFECT_CMAP, EFFECT_LABEL, RAISES
from p0circuit.figures.drawing import to_html


Pass = Union[OnsetRow, CorruptionVariation, LengthVariation]
"""A record with a node pass' signal and effects: an onset row, a variation's."""


def _fmt(effects: dict[str, float], k: int = 8) -> str:
    items = list(effects.items())[:k]
    return ", ".join(f"{n} {v:+.3g}" for n, v in items) or "none"


def _signal(row: Pass) -> str:
    """``metric: clean -> corrupted`` of a row (an onset's, a variation's)."""
    return f"`{row.metric}` {row.clean:.4g} clean -> {row.corrupted:.4g} corrupted"


def _effects(row: Pass, k: int = 6) -> str:
    """A row's normalized effects, or, where its normalization does not carry (steps.normalization),
    the raw changes of the metric, flagged, never bare normalized numbers."""
    norm = row.normalization
    if norm and not norm.stable:
        return (f"**normalized effects not shown**: {norm.why}; the largest raw changes of the metric: "
                + _fmt(norm.raw_changes, k))
    return _fmt(row.nodes or {}, k)


def _stages(stages: list[Any]) -> str:
    return ", ".join(f"{k} at layer {l} ({r:.3g}x)" for k, l, r in stages) or "none"


def _curve(curve: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:.3f}" for k, v in curve.items()) or "n/a"


def _circuit_line(c: Any) -> str:
    """The onset's faithful circuit (or why there is none: a :class:`Note`, or absent), with its three measures."""
    if not isinstance(c, NodeCircuit):
        return f"- Faithful circuit: {c.note if isinstance(c, Note) else 'not measured'}."
    st = c.settings
    head = (f"- Faithful circuit (ACDC-style pruning of {c.candidates} candidates, target {st['target']}): "
            if c.faithful else f"- **No faithful circuit** ({c.why}); the best found "
                               f"(ACDC-style pruning of {c.candidates} candidates): ")
    denoise = "n/a for an ablation" if c.denoising is None else share(c.denoising, 3)
    return (head + f"{c.size} nodes, {', '.join(c.nodes[:12])}{'...' if c.size > 12 else ''}; faithfulness "
            f"(every other candidate corrupted) {share(c.faithfulness, 3)}, denoising (the circuit restored into the "
            f"corrupted run) {denoise}, completeness (the circuit alone corrupted removes) {share(c.completeness, 3)}."
            + _edge_line(c.edge_circuit))


def _edge_line(e: Any) -> str:
    """The node circuit's edges (ACDC-style pruning of the edges between its nodes), or why not (a :class:`Note`)."""
    if not isinstance(e, EdgeCircuit):
        return f" Its edges: {e.note}." if isinstance(e, Note) else ""
    held = e.settings.get("held") or {}
    held_said = (f" Held as they are, never corrupted as edges: {', '.join(list(held)[:6])}"
                 f"{'...' if len(held) > 6 else ''} ({next(iter(held.values()))})." if held else "")
    if not e.searched:
        return f" Its edges were not searched: {e.why}.{held_said}"
    shown = ", ".join(f"{n} {e.effects[n]:+.2f}" for n in e.edges[:10]) + ("..." if e.size > 10 else "")
    verdict = "" if e.faithful else f" (**not faithful**: {e.why})"
    return (f" Its edges{verdict} (ACDC-style pruning of the {e.candidates} edges between its nodes and into the "
            f"metric): {e.size} kept{': ' + shown + ' (each alone, path patching)' if shown else ''}; with every "
            f"other edge and node corrupted they keep {share(e.faithfulness, 3)} of the change, and corrupting them "
            f"alone removes {share(e.completeness, 3)}.{held_said}")


CONTROLS = ("resample", "copies")
"""Corruptions the analysis runs as negative controls (run.py's controls): no signal is what they should show."""
NEGATIVE_CONTROL = "no signal, which is what this negative control should show (see the controls under How sure)"


def cost_line(t: Timing) -> str:
    """What the steps cost, in words: seconds, the work counted in forwards of the batch, and the unit forward."""
    line = f"Measured in {t.seconds:.0f} s of steps"
    runs = t.processes
    if len(runs) > 1:  # a resumed analysis: each process' steps against its own forward, never one ratio for all
        if t.forwards is not None:
            line += f", whose work counts {t.forwards:.0f} forwards of the batch"
        line += ", in " + str(len(runs)) + " processes (resumed), each timed against its own forward: " + "; ".join(
            f"{p.steps} steps, {p.seconds:.0f} s" + (f" at {p.slowdown:.2f}x the time their work predicts"
                                                    if p.slowdown else "")
            + f" (one forward {p.unit_s * 1000:.0f} ms)" for p in runs)
    elif t.slowdown is not None:  # counted (p0circuit.patching.work); None when a resumed step was not counted
        line += (f", whose work counts {t.forwards:.0f} forwards of the batch ({t.with_grad or 0:.0f} of them "
                 f"with a backward); one forward took {t.forward_s * 1000:.0f} ms in the same run")
        if t.seconds > cost.SLOW_SECONDS:  # below it the steps are mostly Python's overhead: the ratio says nothing
            line += f", so the steps ran at {t.slowdown:.2f}x the time that work predicts"
    around = [f"{what} {getattr(t, key):.1f} s" for key, what in (("import_s", "imports"), ("load_s", "loading the model"))
              if getattr(t, key)]
    if around:
        line += "; besides the steps: " + ", ".join(around)
    return line + "."


TERMS = ("Terms: the *P0 norm ratio* is position 0's residual norm over the mean norm of the other positions "
         "after a block; an *onset* is a block where it first reaches the threshold, an *erasure* one where it "
         "falls back below it. A *position norm ratio* is a position's norm over its prompt's median norm (the "
         "sink report's, for any position; a *sink state* is a position where it reaches the threshold). A state's "
         "*excess norm* is that ratio minus 1. Nodes: `A2.H0@0` is block 2's head 0 at position 0, `M1@rest` block "
         "1's MLP at every other position, `M2.N90@0` one neuron, `E@0` the token embedding, `R2@0` block 2's "
         "output (what a metric reads); an edge `X->Y.mlp_in` (or `.q`, `.k`, `.v`) is X's path into that input of "
         f"Y. Layer and block mean the same: block N's output is read \"after layer N\". {NUMBERING}.")
"""The words the pages use, said once at the top of each."""


def markdown(data: Union[dict[str, Any], AnalysisRecord]) -> str:
    """The analysis (``analysis.json``'s content, or its record) as Markdown: the head (what was run), the claim's
    answer and the terms, the claim part by part, one section per BOS setting, then the first tokens, the weights
    and the planted ground truth."""
    d = as_record(data, "the analysis")
    return "\n".join(_head_lines(d) + _claim_lines(d) + [TERMS, ""] + _parts_lines(d) + _body_lines(d))


def _head_lines(d: AnalysisRecord) -> list[str]:
    """The title, the model, and the prompts, threshold and cost."""
    s = d.settings
    return [f"# P0-sink analysis of {d.model}", ""] + \
        ([f"The model: {d.variant}. Every finding below is about this file's weights.", ""]
         if not isinstance(d.variant, Absent) else []) + [
             f"{d.prompt_source} x {s['length']} tokens (a BOS token adds one); "
             "effects are normalized "
             "(the share of the clean-to-corrupted change of the metric that one component carries when it alone is "
             f"patched; positive raises the metric), kept at |effect| >= {s['threshold']}. " + cost_line(d.timing), ""]


def _claim_lines(d: AnalysisRecord) -> list[str]:
    """The claim's answer in one line: each part's answer, and whether every part holds."""
    return [f"**The paper's claim, part by part**: {d.verdict.claim}. " + _whole(d), ""]


def _whole(d: AnalysisRecord) -> str:
    return "Every part holds." if d.verdict.holds else "Not every part holds."


def _body_lines(d: AnalysisRecord) -> list[str]:
    """Everything below the verdict: one section per BOS setting, the first tokens, the weights, the ground truth."""
    lines = []
    for tag in TITLES:
        lines += _setting_lines(d, tag)
    return lines + _first_token_lines(d) + _weight_lines(d) + _truth_lines(d)


def _parts_intro(d: AnalysisRecord) -> str:
    """The line above the verdict's parts: the parts in words, the answers a part can get, what shares are of."""
    return (f"**The claim in {len(PARTS)} parts** (" + "; ".join(f"{letter}: {text}" for _, letter, text in PARTS)
            + f"). As measured, {ANSWERS}. Shares "
            f"(faithfulness, denoising, effects) are of the clean-to-corrupted change; {OVERSHOOT}.")


def _parts(d: AnalysisRecord) -> list[tuple[str, str, str, Part]]:
    """Each verdict part as (BOS setting's title, letter, answer in words, the part's record), in the written order."""
    return [(TITLES[tag], letter, label(getattr(p, key)), getattr(p, key)) for tag, p in d.verdict.parts.items()
            for key, letter, _ in PARTS]


def _parts_lines(d: AnalysisRecord) -> list[str]:
    """The verdict part by part: each part's answer in bold, then its evidence."""
    parts = _parts(d)
    if not parts:
        return []
    return [_parts_intro(d), ""] + [f"- {title}, ({letter}) **{answer}**: {part.evidence}."
                                    for title, letter, answer, part in parts] + [""]


def _setting_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """One BOS setting's section: its sink summary, each onset, what was left out, the variations, the controls,
    the spread over prompts, the special tokens and the sensitivity."""
    sk = d.sinks.get(tag)
    if sk is None:
        return []
    title = TITLES[tag]
    lines = [f"## {title[0].upper() + title[1:]}", ""]
    if isinstance(sk, Skipped):
        return lines + [f"Not measured: {sk.skipped}", ""]
    lines += _sinks_lines(d, tag, sk)
    for o in d.onsets.get(tag, []):
        lines += _onset_lines(o)
    lines += _left_out_lines(d, tag) + _variation_lines(d, tag)
    return lines + _control_lines(d, tag) + _spread_lines(d, tag) + _special_lines(d, tag) + _sensitivity_lines(d, tag)


def _sinks_lines(d: AnalysisRecord, tag: str, sk: SinkSummary) -> list[str]:
    """A BOS setting's sink summary: the BOS token, the sink rate and P0 norm stages, the massive dimensions, and
    the high-norm states by where they sit."""
    lines = [f"Every prompt starts with {d.bos_token}.", ""] if tag == "with_bos" and d.bos_token else []
    lines += [f"- {sink_rate_label()} = {sk.sink_rate:.3f}; P0 norm stages (the P0 norm ratio, ||h_0|| over the mean "
              f"||h_t|| of the other positions): {_stages(sk.norm_stages)}.",
              "- Massive dimensions at P0 (dimension: layers, peak value at a layer, and that value's size over "
              "the mean RMS of the other positions' residual vectors there): " + ("; ".join(
                  f"{m.dim}: {m.first_layer}-{m.last_layer}, {m.peak_value:.4g} at layer "
                  f"{m.peak_layer} ({m.peak_ratio:.0f}x)" for m in sk.massive_dims[:4]) or "none") + "."]
    by_where: dict[str, list[SinkPosition]] = {}
    for p in sk.sink_positions:
        by_where.setdefault(p.where, []).append(p)
    for where, ps in by_where.items():
        peak = max(ps, key=lambda p: p.ratio)
        lines.append(f"- High-norm states at **{where}** ({state_name(peak.max_head_attention)}s): layers "
                     f"{', '.join(str(p.layer) for p in ps)}; peak "
                     f"{peak.ratio:.3g}x the prompt's median norm at layer {peak.layer} (in "
                     f"{peak.share:.0%} of prompts), attention it receives there {peak.attention:.3f} (mean over the "
                     f"queries after it and every head; the strongest head {peak.max_head_attention:.3f})" + (("; tokens " + ", ".join(
                         f"{t!r} x{c}" for t, c in peak.tokens[:3])) if where == "other" else "") + ".")
    return lines + [""]


def _onset_lines(o: OnsetRow) -> list[str]:
    """One onset's section: its prompts and metric, what it is keyed on, its nodes, faithfulness curve and circuit,
    its edges and neurons, and (at P0) what the sink reads, detection, the sink's circuit and the super weights."""
    lines = [f"### Onset at layer {o.layer}, {o.where}" + (f" (index {o.at})" if o.at else ""), ""]
    if o.skipped:
        return lines + [f"Not measured: {o.skipped}", ""]
    lines.append(f"Prompts: {o.prompt_set}. Corruption `{o.corruption}`, metric "
                 f"`{o.metric}`: {o.clean:.4g} clean -> {o.corrupted:.4g} corrupted; "
                 f"{o.candidates} candidate nodes ({o.seconds:.1f} s).")
    if o.corruption_choice:
        lines[-1] += f" Corruption chosen: {o.corruption_choice.why}."
    keyed = o.keyed_on
    if keyed:
        lines.append("- Keyed on: " + (f"**{keyed.reading}**: {keyed.evidence}; the context edit: "
                                       f"{keyed.context_note}." if isinstance(keyed, KeyedOn)
                                       else f"not measured: {keyed.error}."))
    if not o.signal:
        return lines + ["", f"No signal: {o.message}", ""]
    sc = o.screen
    screened = (f" (screened: {sc.how}; the sample's largest |effect| "
                f"{'n/a' if sc.sample_max_abs_effect is None else format(sc.sample_max_abs_effect, '.3g')}, "
                f"{sc.sample_notable} of its nodes at {NOTABLE} or more)") if sc else ""
    lines += ["", f"- Nodes{screened}: {_effects(o, 12)}.",
              f"- Faithfulness of the top k single nodes, a screen (k: share of the change kept with every "
              f"other candidate corrupted): {_curve(o.faithfulness)}.",
              _circuit_line(o.circuit)]
    ep = o.edge_pass
    if ep:
        of = f"; {ep.of}" if ep.of else ""
        lines.append(f"- Edges ({ep.candidates} candidates{of}): {_fmt(o.edges, 10)}.")
    npass = o.neuron_pass
    if isinstance(npass, NeuronPass):
        lines.append(f"- Neurons writing `{npass.metric}` (corruption `{o.corruption}`, {npass.clean:.4g} "
                     f"clean -> {npass.corrupted:.4g} corrupted; MLPs {npass.mlps}, {npass.screen}): "
                     f"{_fmt(o.neurons, 10)}; faithfulness within the confirmed (the share kept with only the top k of the "
                     f"confirmed neurons clean, the rest of them corrupted): "
                     f"{_curve(npass.faithfulness_within_confirmed)}.")
    elif isinstance(npass, Note):
        lines.append(f"- Neurons: {npass.note}.")
    return lines + _sink_lines(o) + [""]


def _left_out_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """The later P0 onsets and the sink states away from P0 that were not analysed, and how to include them."""
    s, lines = d.settings, []
    left = d.timing.onsets_left_out.get(tag) or []
    if left:
        more = sum(o.predicted_forwards for o in left)
        lines += [f"Later onsets of the P0 norm ratio not patched (max_onsets={s['max_onsets']}): "
                  + ", ".join(f"layer {o.layer} ({o.ratio:.3g}x)" for o in left)
                  + f". `--max-onsets {s['max_onsets'] + len(left)}` (max_onsets={s['max_onsets'] + len(left)}) patches "
                  f"them too: the cost model predicts {more:.0f} more forwards of the batch, about "
                  f"{more * d.timing.forward_s:.0f} s at this run's forward.", ""]
    skipped = d.timing.sinks_left_out.get(tag) or []
    if skipped:
        lines += [f"Sink states away from position 0 not analysed (`--max-sinks {s['max_sinks']}`): "
                  + "; ".join(skipped) + ".", ""]
    return lines


def _variation_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """What changes at the first onset: every corruption on the same prompts, then other prompt lengths."""
    v = d.variations.get(tag)
    if not v:
        return []
    lines = [f"### What changes at layer {v.layer}", "",
             "Every corruption on the same prompts (metric `NormRatio` at this layer):", ""]
    for name, c in v.corruption.items():
        if c.error:
            text = c.error
        else:
            text = _signal(c) + "; " + (c.note or (_effects(c) if c.signal else
                                                   NEGATIVE_CONTROL if name in CONTROLS else
                                                   "no signal: " + c.message))
        lines.append(f"- corruption `{name}`: {text}")
    lines += ["", f"Other prompt lengths, each patched with the corruption chosen above (`{v.chosen_corruption}`):", ""]
    for row in v.length.values():
        text = f"- {row.prompts}: {sink_rate_label()} = {row.sink_rate:.3f}; stages {_stages(row.norm_stages)}"
        if row.metric:
            text += f"; corruption `{row.corruption}`, {_signal(row)}; " + (
                f"nodes {_effects(row)}" if row.signal else "no signal")
        lines.append(text)
    return lines + [""]


def _truth_lines(d: AnalysisRecord) -> list[str]:
    """A planted model's circuit as planted (nothing for other models)."""
    if isinstance(d.truth, Absent):
        return []
    return ["## Planted ground truth", "", "Nodes: " + ", ".join(d.truth["nodes"]),
            "", "Edges: " + ", ".join(d.truth["edges"]), ""]

STUDIES = (("reads", "What the sink reads (the P0 state edited after the onset)"),
           ("detection", "Detection (self-only attention in the first blocks)"),
           ("sink_circuit", "The sink's own circuit (the sink heads' attention to P0)"),
           ("super_weights", "Super weights (the single weights into the massive dimension)"))
"""A P0 onset's studies beyond its norm (:func:`p0circuit.studies.analysis.run._p0_studies`), in the order written."""


def _sink_lines(o: OnsetRow) -> list[str]:
    """A P0 onset's studies, one line each: the answer in bold where there is one, then the evidence."""
    out = []
    for key, title in STUDIES:
        rec = getattr(o, key)
        if not rec:
            continue
        if isinstance(rec, Unmeasured):
            out.append(f"- {title}: not measured: {rec.error}.")
        elif isinstance(rec, SinkReads):
            out.append(f"- {title}: the sink heads right after it read **{rec.reads}**; over every later block "
                       f"**{rec.reads_later}**: {rec.evidence}.")
        else:
            out.append(f"- {title}: {rec.evidence}.")
    return out


def _control_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """The first P0 onset's controls, each with what it predicts and what its outcome means."""
    controls = d.controls.get(tag)
    if not controls:
        return []
    out = ["### Controls that can fail", ""]
    for c in controls:
        verdict = "not measured" if c.passed is None else "**passed**" if c.passed else "**failed**"
        out.append(f"- `{c.name}` ({c.kind} control: {c.does}): predicts {c.expects}; observed {c.observed}: {verdict}; "
                   f"{c.meaning}.")
    return out + [""]


def _spread_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """The first P0 onset's headline numbers over many prompts."""
    sp = d.spread.get(tag)
    if sp is None:
        return []
    if isinstance(sp, Unmeasured):
        return ["### How sure the numbers are", "", f"Not measured: {sp.error}.", ""]
    out = ["### How sure the numbers are", "", f"- {sp.evidence}."]
    k = sp.keyed
    if isinstance(k, Unmeasured):
        out.append(f"- Keyed on, on these prompts: not measured: {k.error}.")
    else:
        said = lambda e: "n/a" if e is None else f"{e.mean:.2f} [{e.interval[0]:.2f}, {e.interval[1]:.2f}], lowest {e.min:.2f}"  # noqa: E731
        out.append(f"- Keyed on, on these prompts: **{k.reading}**; kept shares (mean [95% interval], lowest prompt): "
                   f"swapped {said(k.swapped)}; follows {said(k.follows)}; stays {said(k.stays)}; context "
                   f"{said(k.context)}; copies {said(k.copies)}.")
    if sp.lengths:
        out.append("- By prompt length (the P0 norm ratio per block; its onset, where it falls back, its value at block "
                   f"{sp.layer}): " + "; ".join(
                       f"{r.length} tokens: " + ("no onset" if r.onset is None else f"onset {r.onset}")
                       + ("" if r.erasure is None else f", falls back at {r.erasure}")
                       + ("" if r.at_onset is None else f", {r.at_onset:.3g}x at block {sp.layer}") for r in sp.lengths) + ".")
    return out + [""]


def _special_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """The model's special tokens in the middle of the prompts."""
    sp = d.special_tokens.get(tag)
    if not sp:
        return []
    if isinstance(sp, Unmeasured):
        return ["### Special tokens mid-prompt", "", f"Not measured: {sp.error}.", ""]
    return ["### Special tokens mid-prompt", "", "Each at one index in the middle of every prompt, in place of the token "
            "there (position norm ratio: its norm over the prompt's median norm; attention: mean over the queries after "
            "it, every head, and the strongest head's):", ""] + [
        f"- {t.text!r} (id {t.id}) at index {t.at}: **{t.called}**; " + (
            f"reaches the line after block {t.first_block}, " if t.first_block is not None else "never reaches the line; ")
        + f"peak {t.peak:.3g}x after block {t.peak_block}, attention there {t.attention:.3f} (strongest head "
          f"{t.max_head_attention:.3f})." for t in sp] + [""]


def _sensitivity_lines(d: AnalysisRecord, tag: str) -> list[str]:
    """How the verdict depends on each threshold: one row per threshold, each part's labels over its range."""
    sens = d.sensitivity.get(tag)
    if sens is None:
        return []
    letters = {key: letter for key, letter, _ in PARTS}
    out = ["### How the verdict depends on its thresholds", "",
           "Each threshold moved over its range with the others as used above; each part's answer at each value "
           "(`h` holds, `p` partially supported, `f` fails, `n/a` not applicable, `?` not measured); a part a threshold "
           "does not touch is left blank.", "",
           "| threshold (used) | what it decides | values | " + " | ".join(f"({letters[k]})" for k, _, _ in PARTS)
           + " |", "|---|---|---|" + "---|" * len(PARTS)]
    short = {"holds": "h", "partially supported": "p", "fails": "f", "not applicable": "n/a", "not measured": "?"}
    for sw in sens.sweeps:
        cells = [" ".join(short.get(lab.split(" (")[0], "?") for lab in sw.parts[k]) if k in sw.parts else ""
                 for k, _, _ in PARTS]
        out.append(f"| {sw.threshold} ({sw.used:g}) | {sw.meaning} | {', '.join(f'{v:g}' for v in sw.values)} | "
                   + " | ".join(cells) + " |")
    flips = [f"{sw.threshold}: {f}" for sw in sens.sweeps for f in sw.flips]
    out += ["", "Where an answer changes: " + ("; ".join(flips) if flips else "nowhere in these ranges") + "."]
    if sens.rows:
        out.append("The blocks below the onset that a lower onset line makes the onset were patched for this table: "
                   + ", ".join(f"block {r.layer}" for r in sens.rows) + ".")
    return out + [""]


def _first_token_lines(d: AnalysisRecord) -> list[str]:
    """Every first token's P0 state at each P0 onset's block."""
    if not d.first_tokens:
        return []
    out = ["## Every first token", "", "Under the causal mask the P0 state depends on the first token alone, so every "
           "vocabulary token is run as a one-token prompt (the prompts above sample a few of them); at a later onset, or "
           "for a vocabulary larger than the setting, a random sample of it is run instead, and the drawn tokens' share "
           "is given with its 95% interval.", ""]
    for layer, rec in d.first_tokens.items():
        if isinstance(rec, Unmeasured):
            out += [f"- Block {layer}: not measured: {rec.error}.", ""]
            continue
        named = lambda pts: ", ".join(f"{p.text!r} {p.ratio:.2f}" for p in pts[:8]) or "none"  # noqa: E731
        out += [f"- Block {layer}: {rec.evidence}.",
                f"  The lowest: {named(rec.lowest)}; special tokens: {named(rec.special)}; the prompts' own first "
                f"tokens: {named(rec.prompts)} (ratio over {rec.reference}).", ""]
    return out


def _weight_lines(d: AnalysisRecord) -> list[str]:
    """The model's super-weight candidates."""
    w = d.weights
    if w is None:
        return []
    if isinstance(w, Unmeasured):
        return ["## Super-weight candidates", "", f"Not measured: {w.error}.", ""]
    head = ["## Super-weight candidates", "", f"Every entry of a block's MLP `W_out` at least {SUPER_Z:g} standard "
            f"deviations from the mean of its matrix (at most {PER_BLOCK} per block, the largest first), whether or not an "
            "onset uses it; *massive*: its column is a massive dimension at P0.", ""]
    if not w:
        return head + ["None.", ""]
    return head + ["| weight | value | rank in its matrix | z | massive |", "|---|---|---|---|---|"] + [
        f"| {name_of(x)} | {x.value:+.3g} | {x.rank} | {x.z:+.1f} | {'yes' if x.massive else 'no'} |" for x in w[:24]] + [""]


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt  # here, not at the top: only the HTML page needs matplotlib

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(src: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{src}">'


def _truth(d: AnalysisRecord) -> Optional[Circuit]:
    if isinstance(d.truth, Absent):
        return None
    return Circuit(nodes=tuple(Node.parse(n) for n in d.truth["nodes"]),
                   edges=tuple(Edge.parse(e) for e in d.truth["edges"]))


def _onset_panels(d: AnalysisRecord, o: OnsetRow) -> Any:
    """The node effects at P0 and at the other positions (@rest) as layer x head (+ MLP) maps, and
    the faithfulness of the top-k screen beside the faithful circuit's own point."""
    import matplotlib.pyplot as plt  # here, not at the top: only the HTML page needs matplotlib

    heads = d.n_heads
    fig, axes = plt.subplots(1, 3, figsize=(13, max(3.4, 1.9 + 0.35 * (o.layer + 1))),
                             gridspec_kw={"width_ratios": [1, 1, 0.9]})
    grids = {}
    for pos in ("0", "rest"):
        grid = [[float("nan")] * (heads + 1) for _ in range(o.layer + 1)]
        for name, v in o.effects.items():
            n = Node.parse(name)
            if str(n.pos) != pos or n.layer > o.layer:
                continue
            if n.kind == Kind.HEAD:
                grid[n.layer][n.head] = v
            elif n.kind == Kind.MLP:
                grid[n.layer][heads] = v
        grids[pos] = grid
    finite = [abs(v) for g in grids.values() for row in g for v in row if math.isfinite(v)]
    bound = max(finite + [1e-9])
    for ax, pos in zip(axes[:2], ("0", "rest")):
        im = ax.imshow(grids[pos], aspect="auto", cmap=EFFECT_CMAP, vmin=-bound, vmax=bound, origin="lower")
        ax.set_xticks(range(heads + 1), [f"H{h}" for h in range(heads)] + ["MLP"], fontsize=7,
                      rotation=90 if heads > 12 else 0)
        ax.set_yticks(range(0, o.layer + 1, max(1, (o.layer + 1) // 12)))  # whole layers, never 0.5
        ax.set(ylabel="layer", title=f"effects @{pos}" + (" (position 0)" if pos == "0" else " (positions t > 0)")
               + ("\nblank: not examined (screened)" if o.screen else ""))
        fig.colorbar(im, ax=ax).set_label(EFFECT_LABEL.replace(" (", "\n("), fontsize=7)
    ax = axes[2]
    curve = o.faithfulness or {}
    if curve:
        ax.plot([int(k) for k in curve], list(curve.values()), marker="o", color="#555555", label="top-k single nodes")
    c = o.circuit
    if isinstance(c, NodeCircuit):
        ax.plot([c.size], [c.faithfulness], marker="*", markersize=13, color=RAISES, ls="",
                label=f"faithful circuit ({c.size} nodes)" if c.faithful else f"best circuit found ({c.size})")
    ax.axhline(0.9, color="grey", ls=":", lw=1)
    ax.set(xscale="log", xlabel="nodes kept clean", ylabel="share of the change kept", title="faithfulness")
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"onset at layer {o.layer} ({o.where}), corruption {o.corruption}, metric {o.metric}",
                 fontsize=9)
    fig.tight_layout()
    return fig


def _figures(d: AnalysisRecord) -> dict[str, list[str]]:
    """HTML snippets per BOS setting (the P0 norm ratio and the strongest head's attention per layer,
    the alpha_0 heatmap) and per onset (its effect maps @0 and @rest with the faithfulness curve, and
    its faithful circuit, drawn once: an inline SVG that reads without a script, interactive with one)."""
    import matplotlib.pyplot as plt  # here, not at the top: only the HTML page needs matplotlib

    figs: dict[str, list[str]] = {}
    truth = _truth(d)
    for tag, title in TITLES.items():
        sk = d.sinks.get(tag)
        if not isinstance(sk, SinkSummary):
            continue
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
        layers = range(len(sk.norm_ratio))
        axes[0].plot(layers, [x if x and math.isfinite(x) else float("nan") for x in sk.norm_ratio], marker="o")
        axes[0].axhline(d.settings["norm_threshold"], color="grey", ls=":")
        axes[0].set(yscale="log", xlabel="layer", ylabel="||h_0|| / mean over t>0 of ||h_t||", title=f"P0 norm ratio, {title}")
        axes[1].plot(layers, [max(a) for a in sk.alpha], marker="o", label="strongest head")
        axes[1].plot(layers, sk.sink_rate_per_layer, marker="s", label="share of heads > 0.3")
        axes[1].set(xlabel="layer", ylim=(0, 1.05), title="attention to P0")
        axes[1].legend(fontsize=8)
        im = axes[2].imshow([list(r) for r in sk.alpha], aspect="auto", vmin=0, vmax=1, cmap="viridis",
                            origin="lower")
        axes[2].set(xlabel="head", ylabel="layer", title="alpha_0 per head")
        fig.colorbar(im, ax=axes[2], label="alpha_0: mean attention to P0")
        fig.tight_layout()
        figs[tag] = [_img(_png(fig), "norm ratio and attention to P0 per layer")]
        for o in d.onsets.get(tag, []):
            if not o.effects:
                continue
            key = f"{tag}/{o.where}@L{o.layer}"
            figs[key] = [_img(_png(_onset_panels(d, o)), "node effects at P0 and elsewhere, and faithfulness")]
            c = o.circuit
            if isinstance(c, NodeCircuit) and c.nodes:
                ec = c.edge_circuit
                circuit = o.to_circuit(threshold=d.settings["threshold"])
                name = (f"{'faithful' if c.faithful else 'best (not faithful)'} circuit, layer-{o.layer} onset"
                        + (f", {len(ec.edges)} edges" if isinstance(ec, EdgeCircuit) and ec.edges else ""))
                figs[key].append(f'<figure class="circuit" aria-label="{html.escape(name)}">{to_html(circuit, truth, name)}'
                                 f"<figcaption>{CIRCUIT_HELP}</figcaption></figure>")
    return figs


CIRCUIT_HELP = "Hover a node or an edge for its effect; click a node to highlight every path through it (the background resets)."
"""The caption under each circuit in report.html: what the figure answers."""

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em;line-height:1.4}"
         "img,svg{max-width:100%;height:auto;display:block;margin:0.5em 0}code{background:#eee;padding:0 3px;"
         "overflow-wrap:anywhere}li,p{overflow-wrap:anywhere}figure{margin:0.5em 0}figcaption{color:#555;font-size:0.9em}"
         ".claim{border-left:4px solid #555;background:#f3f3f3;padding:0.5em 0.8em;font-size:1.1em}"
         ".verdict{list-style:none;padding-left:0}.verdict li{margin:0.7em 0}"
         ".verdict .answer{font-size:1.1em;font-weight:bold}.verdict .evidence{color:#333;font-size:0.92em;margin-left:1.5em}"
         ".holds{color:#1a7f37}.fails{color:#c62828}.partially-supported{color:#9a5b00}.not-applicable{color:#666}")
"""report.html's style sheet: the claim's answer boxed, each verdict part's answer bold and coloured above its
evidence in plain type."""


def report_html(data: Union[dict[str, Any], AnalysisRecord]) -> str:
    """A self-contained page: the Markdown's content as HTML with the figures; the claim's answer and each part's
    answer set apart from their evidence."""
    d = as_record(data, "the analysis")
    figs = _figures(d)
    body = (_html(_head_lines(d), figs) + [_claim_html(d)] + _html([TERMS], figs) + _parts_html(d)
            + _html(_body_lines(d), figs))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
            f"<title>P0-sink analysis of {html.escape(d.model)}</title><style>{STYLE}</style></head><body>"
            f"{''.join(body)}</body></html>")


def _claim_html(d: AnalysisRecord) -> str:
    """The claim's answer, boxed: each part's answer, then whether every part holds in bold."""
    return (f'<p class="claim"><b>The paper\'s claim, part by part</b>: {_inline(html.escape(d.verdict.claim))}. '
            f"<b>{_whole(d)}</b></p>")


def _parts_html(d: AnalysisRecord) -> list[str]:
    """The verdict part by part: the setting, letter and answer as a bold, coloured line, the evidence below it."""
    parts = _parts(d)
    if not parts:
        return []
    items = [f'<li><div class="answer">{html.escape(title)}, ({letter}) '
             f'<span class="{_status_class(part)}">{_inline(html.escape(answer))}</span></div>'
             f'<div class="evidence">{_inline(html.escape(part.evidence))}.</div></li>'
             for title, letter, answer, part in parts]
    return [f"<p>{_inline(html.escape(_parts_intro(d)))}</p>", '<ul class="verdict">', *items, "</ul>"]


def _status_class(part: Part) -> str:
    """A part's status as a CSS class (``holds``, ``fails``, ``partially-supported``, ``not-applicable``)."""
    return re.sub(r"[^a-z]+", "-", part.status.lower()).strip("-")


def _html(lines: list[str], figs: dict[str, list[str]]) -> list[str]:
    """Markdown lines as HTML (headings, paragraphs, bullet lists), each section's figures after its heading."""
    body: list[str] = []
    current = ""
    listing = False
    for line in "\n".join(lines).split("\n"):
        text = _inline(html.escape(line))
        if listing and not line.startswith("- "):
            body.append("</ul>")
            listing = False
        if line.startswith("### "):
            body.append(f"<h3>{text[4:]}</h3>")
            if line.startswith("### Onset at layer "):
                layer, where = line[len("### Onset at layer "):].split(", ", 1)
                body += figs.get(f"{current}/{where}@L{layer}", [])
        elif line.startswith("## "):
            current = {"Without BOS": "without_bos", "With BOS": "with_bos"}.get(line[3:], "")
            body.append(f"<h2>{text[3:]}</h2>")
            body += figs.get(current, [])
        elif line.startswith("# "):
            body.append(f"<h1>{text[2:]}</h1>")
        elif line.startswith("- "):
            if not listing:
                body.append("<ul>")
                listing = True
            body.append(f"<li>{text[2:]}</li>")
        elif line:
            body.append(f"<p>{text}</p>")
    return body + (["</ul>"] if listing else [])


def _inline(text: str) -> str:
    """Markdown ``code``, **bold** and *emphasis* as HTML (no emphasis inside code)."""
    out, parts = [], text.split("`")
    for i, part in enumerate(parts):
        out.append(f"<code>{part}</code>" if i % 2 else part)
    text = "".join(out)
    parts = text.split("**")
    text = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
    pieces = re.split(r"(<code>.*?</code>)", text)
    return "".join(p if i % 2 else EMPHASIS.sub(r"<em>\1</em>", p) for i, p in enumerate(pieces))


EMPHASIS = re.compile(r"(?<![\w*])\*([^\s*](?:[^*]*?[^\s*])?)\*(?![\w*])")
"""Markdown's single-asterisk emphasis (``*onset*``); a lone ``*`` or one inside a word is left as it is."""


def write_all(result: Any, out: Path) -> None:
    """``analysis.json``, ``analysis.md`` and ``report.html`` in ``out``; the seconds the two reports took to make
    go into the record (``timing.report_s``), written last."""
    d = result.record
    start = time.perf_counter()
    text, page = markdown(d), report_html(d)
    result.record = d = d.replace(timing=d.timing.replace(report_s=round(time.perf_counter() - start, 2)))
    data = d.to_dict()
    write_atomic(out / "analysis.md", text)
    write_atomic(out / "report.html", page)
    write_atomic(out / "analysis.json", json.dumps(strict(data), indent=1, allow_nan=False))
