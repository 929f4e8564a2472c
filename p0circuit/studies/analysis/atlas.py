"""The atlas: several models' analyses side by side in one Markdown page (``p0circuit atlas``).

Each model is analysed with :func:`p0circuit.analyze` into ``RUNS/<entry>`` (resumable: a finished
analysis is read back, not run again), and the page puts, per model and BOS setting, the sink rate,
the onset layers, the massive dimensions, where the sinks sit, the circuit's strongest nodes and
edges, the faithful circuit and the verdict on the paper's claim part by part, as measured; what makes position 0 a
sink beyond its norm (what the later heads read, detection, the sink's own circuit, the super weights, every first
token); and every sink state, at position 0 and away from it, with what it is keyed on and its circuit.
"""

from pathlib import Path
from typing import Any, Optional, Sequence, Union

from p0circuit.core.defaults import sink_rate_label
from p0circuit.studies.analysis.passes import EdgeCircuit, NodeCircuit, Note
from p0circuit.studies.analysis.records import Absent, as_record, AnalysisRecord, OnsetRow, Skipped
from p0circuit.studies.findings import Detection, KeyedOn, SinkCircuit, SinkReads, SuperWeights, Unmeasured
from p0circuit.studies.analysis.elsewhere import label as sink_label
from p0circuit.studies.analysis.run import analyze
from p0circuit.core.shares import OVERSHOOT
from p0circuit.studies.analysis.verdict import ANSWERS, PARTS, SETTINGS, TITLES, label
from p0circuit.studies.experiments.keyed import MOVE
from p0circuit.studies.analysis.elsewhere import SINK_SHARE
from p0circuit.core.entries import ATLAS_MODELS, check_model_entry
from p0circuit.core.io import run_dir, write_atomic


ONSETS = 2
"""P0 onsets the atlas patches per model and BOS setting (``analyze`` patches one unless asked)."""
EDGES = 1024
"""Candidate edges up to which the atlas prunes a circuit's edges (``analyze``'s ``max_edges`` is lower): a later
onset's circuit, such as SmolLM2's 23 nodes at block 11, has hundreds."""

TRAINED_WITH = {
    "real:smollm2": "no BOS per document; documents separated by `<|endoftext|>`",
    "real:gemma3": "`<bos>` at the start of every sequence",
    "planted:rope": "none: the circuit is written into the weights (position-keyed)",
    "planted:nope": "none: the circuit is written into the weights (position-keyed)",
    "planted:learned": "none: written into the weights (keyed on a learned position embedding)",
    "planted:layer2": "none: the circuit is written into the weights (position-keyed, layers 2-3)",
    "planted:bos": "none: the circuit is written into the weights (keyed on the BOS token)",
    "planted:secondary": "none: written into the weights (a position-keyed P0 circuit, and a block-2 MLP neuron that "
                         "makes token 25 a sink wherever it stands)",
    "planted:norm": "none: written into the weights (position-keyed; a large write at every position after the "
                    "amplifier, so the sink heads need the norm)",
    "real:qwen2.5": "no BOS per document (Qwen's tokenizer prepends none); documents separated by `<|endoftext|>`",
}
"""What each known model saw at position 0 in training (from its model card or its plant)."""

_SETTINGS = tuple(TITLES.items())


def _top(effects: dict[str, float], k: int) -> str:
    return ", ".join(f"{n} {v:+.2f}" for n, v in list(effects.items())[:k]) or "none"


def _circuit_cell(c: Any) -> str:
    """The first onset's faithful circuit in a few words (or the best one found, said as such; or why none: a
    :class:`Note`, or absent)."""
    if not isinstance(c, NodeCircuit):
        return c.note if isinstance(c, Note) else "not measured"
    denoise = "" if c.denoising is None else f", denoising {c.denoising:.2f}"
    head = f"{c.size} nodes" if c.faithful else f"**not faithful** ({c.why}); best: {c.size} nodes"
    e = c.edge_circuit
    edges = ""
    if isinstance(e, EdgeCircuit):
        held = len(e.settings.get("held") or {})
        edges = (f"; edges not searched ({e.why})" if not e.searched else
                 f"; {e.size} of {e.candidates} edges between them keep {e.faithfulness:.2f}"
                 + ("" if e.faithful else " (**not faithful**)") + (f", {held} held as they are" if held else ""))
    return (f"{head} ({', '.join(c.nodes[:5])}{'...' if c.size > 5 else ''}): faithfulness {c.faithfulness:.2f}"
            f"{denoise}{edges}")


def rows(data: Union[dict[str, Any], AnalysisRecord]) -> list[list[str]]:
    """The atlas rows of one analysis (``analysis.json``'s content, or its record; one per BOS setting)."""
    d = as_record(data, "an analysis in the atlas")
    out = []
    for tag, title in _SETTINGS:
        s = d.sinks.get(tag)
        if s is None:
            continue
        if isinstance(s, Skipped):
            out.append([d.model, title, "not measured (no start token)"] + [""] * 6)
            continue
        onsets = [o for o in d.onsets.get(tag, []) if o.where == "P0"]
        first = onsets[0] if onsets else None
        others = sorted({sink_label(p) for p in s.sink_positions if not p.where.startswith("P0")})
        where = ", ".join((["P0"] if any(p.where.startswith("P0") for p in s.sink_positions) else []) + others)
        if first is None:
            circuit = edges = faith = "no P0 onset"
            other = [o for o in d.onsets.get(tag, []) if o.where != "P0" and o.signal]
            if other:
                circuit = f"at {other[0].where} (layer {other[0].layer}): {_top(other[0].nodes, 3)}"
                edges = _top(other[0].edges, 2)
        elif not first.signal:
            circuit, edges, faith = "no signal", "", ""
        else:
            circuit = f"`{first.corruption}`, layer {first.layer}: {_top(first.nodes, 4)}"
            edges = _top(first.edges, 3)
            faith = _circuit_cell(first.circuit)
        dims = ", ".join(str(m.dim) for m in s.massive_dims[:3]) or "none"
        out.append([d.model, title, f"{s.sink_rate:.2f}",
                    ", ".join(str(l) for k, l, _ in s.norm_stages if k == "onset") or "none", dims,
                    where or "none", circuit, edges, faith])
    return out


def _state_row(model: str, title: str, o: OnsetRow) -> list[str]:
    """One row of the sink-state table."""
    state = o.where + (f" (index {o.at})" if o.at else "")
    if o.skipped:
        return [model, title, state, str(o.layer), "not measured", o.skipped, "", "", ""]
    k = o.keyed_on
    said = lambda x: "n/a" if x is None else f"{x.mean:.2f} (min {x.min:.2f})"  # noqa: E731
    keyed = (f"**{k.reading}** ({' / '.join(said(x) for x in (k.swapped, k.follows, k.stays, k.context, k.copies))})"
             if isinstance(k, KeyedOn) else ("not measured: " + k.error) if isinstance(k, Unmeasured) else "")
    change = f"`{o.corruption}`: {o.clean:.3g} -> {o.corrupted:.3g}" + ("" if o.signal else " (no signal)")
    circuit = _circuit_cell(o.circuit) if o.signal else ""
    return [model, title, state, str(o.layer), keyed, change, circuit, _top(o.edges or {}, 2), _top(o.neurons or {}, 2)]


def page(analyses: Sequence[Union[dict[str, Any], AnalysisRecord]]) -> str:
    """The atlas as Markdown (each analysis: ``analysis.json``'s content, or its record)."""
    records = [as_record(d, "an analysis in the atlas") for d in analyses]
    head = ["model", "BOS", sink_rate_label(), "P0 onsets", "massive dims", "sinks at", "nodes at the first onset",
            "edges", "faithful circuit at the first onset"]
    sizes = sorted({f"`--n-prompts {d.settings['n_prompts']} --length {d.settings['length']} --max-onsets "
                    f"{d.settings['max_onsets']} --max-edges {d.settings['max_edges']}`" for d in records}) or ["no analysis"]
    lines = ["# The P0-sink atlas", "",
             f"Written by `p0circuit atlas` (each model: `p0circuit analyze --model ENTRY` with {' or '.join(sizes)}; "
             "English prompts, "
             "random regular ids for plants, which have no tokenizer). Effects are normalized (the share of "
             "the clean-to-corrupted change of the P0 norm ratio at the onset one component carries alone; + raises "
             "it). The corruption is `shift` without BOS and, with BOS, whichever of `swap` (the BOS token replaced "
             "in place) and `shift` lowers the sink more. The faithful circuit is found by ACDC-style pruning "
             "(Conmy et al., 2023) of the onset's candidate nodes: kept clean with every other candidate corrupted it "
             "keeps at least 0.9 of the change (faithfulness), and set clean in the corrupted run it restores at "
             "least 0.9 (denoising; not defined for an ablation). " + OVERSHOOT[0].upper() + OVERSHOOT[1:] + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    variants = [f"- {d.model}: {d.variant}." for d in records if not isinstance(d.variant, Absent)]
    if variants:
        lines[-2:-2] = ["The real models are the files their packages ship, and every finding is about those weights "
                        "(docs/models.md measures whether SmolLM2's depends on its quantization):", "", *variants, ""]
    for d in records:
        for row in rows(d):
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    lines += ["", f"## BOS in training and the paper's claim, in {len(PARTS)} parts", "",
              "; ".join(f"({letter}) {text}" for _, letter, text in PARTS) + f". As measured, {ANSWERS}. The "
              "evidence is in each model's analysis.md.", "",
              "| model | position 0 in training | BOS | " + " | ".join(f"({letter}) {key}" for key, letter, _ in PARTS)
              + " |", "|---|---|---|" + "---|" * len(PARTS)]
    for d in records:
        for tag, title in _SETTINGS:
            parts = d.verdict.parts.get(tag)
            if parts is None:
                continue
            cells = [d.model, TRAINED_WITH.get(d.model, "unknown"), title,
                     *(f"**{label(getattr(parts, k))}**: {getattr(parts, k).evidence}" for k, _, _ in PARTS)]
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    lines += _beyond_norm(records) + _how_sure(records)
    lines += ["", "## What each sink state is keyed on, and its circuit", "",
              "Every sink state: P0 at its first onset (on the analysis' prompts) and each state away from position 0 "
              f"that is a sink state in at least {SINK_SHARE:.0%} of the prompts (at most `max_sinks` of them, the "
              "strongest; on windows of the passages that put it at one index in every prompt and hold the state "
              "there). Keyed on: the position/token/context test (`p0circuit/studies/experiments/keyed.py`): the share "
              f"of the state's excess norm kept with its token replaced in place, at the token's new place when {MOVE} "
              "tokens are put in front, at the old place then, with the context before it from a prompt without the "
              f"state, and (at position 0) after {MOVE} copies of its own token; each the mean over the prompts holding "
              "the state, with the lowest prompt's. "
              "The circuit "
              "of a state away from position 0 is found with its token replaced in place (`swap` at its index) and "
              "the norm ratio at its index.", "",
              "| model | BOS | state | layer | keyed on (swapped / follows / stays / context / copies) | corruption: clean -> "
              "corrupted | faithful circuit | edges | neurons |", "|---|---|---|---|---|---|---|---|---|"]
    for d in records:
        for tag, title in _SETTINGS:
            for o in d.onsets.get(tag, []):
                if o.where == "P0" and o is not next(x for x in d.onsets[tag] if x.where == "P0"):
                    continue  # P0's later onsets are in analysis.md
                lines.append("| " + " | ".join(x.replace("|", "\\|") for x in _state_row(d.model, title, o)) + " |")
    lines += ["", "## What each analysis cost", "",
              "Seconds of the analysis' own steps (model loading left out); their work counted in forwards of the "
              "prompt batch (hooks on every block's attention and MLP and on the unembedding add up the rows each "
              "call runs, so the same work counts the same on any machine; a backward is not counted); the steps' "
              "seconds over what that work takes at one forward's speed timed in the same run; and the share the "
              "faithful-circuit search (nodes, then edges) took.", "",
              "| model | steps | counted forwards of the batch | seconds over the count's | circuit search |",
              "|---|---|---|---|---|"]
    for d in records:
        t = d.timing
        search = sum((c.seconds or 0.0) + ((c.edge_circuit.seconds or 0.0) if isinstance(c.edge_circuit, EdgeCircuit)
                                           else 0.0)
                     for ons in d.onsets.values() for o in ons for c in [o.circuit] if isinstance(c, NodeCircuit))
        counted = "-" if t.forwards is None else f"{t.forwards:.0f}"
        main = max(t.processes, key=lambda p: p.seconds) if t.processes else t  # a resumed run: its longest process'
        ratio = "-" if main.slowdown is None else f"{main.slowdown:.2f}x" + (
            f" (the longest of {len(t.processes)} processes)" if len(t.processes) > 1 else "")
        lines.append(f"| {d.model} | {t.seconds:.0f} s | {counted} | {ratio} | {search:.0f} s "
                     f"({search / max(t.seconds, 1e-9):.0%}) |")
    lines += ["", "Each model's full analysis (`analysis.md`, `report.html`, `analysis.json`) is in its run "
              "directory; the command prints where.", ""]
    return "\n".join(lines)


def _first_p0(d: AnalysisRecord, tag: str) -> Optional[OnsetRow]:
    return next((o for o in d.onsets.get(tag, []) if o.where == "P0" and not o.skipped), None)


def _beyond_norm(records: list[AnalysisRecord]) -> list[str]:
    """What makes position 0 a sink beyond its norm, per model and BOS setting (the first P0 onset)."""
    out = ["", "## What makes position 0 a sink, beyond its norm", "",
           "At the first P0 onset: what the first sink heads after it (one block) read of the state (its share of their "
           "excess attention to P0 kept when the state is scaled to an ordinary norm, direction kept / given an ordinary "
           "direction, norm kept; the same over every later block), detection (self-only attention in blocks 0..k: the "
           "other positions' norm as a share of P0's and their cosine with it), the sink's own circuit (the sink heads' "
           "attention to P0) beside the norm circuit, the strongest single weight into the massive dimension and what "
           "zeroing it does, and every vocabulary token as the first token.", "",
           "| model | BOS | the sink reads (rescaled / redirected; later blocks) | detection (blocks 0..k: norm, cosine) | "
           "sink circuit | super weight | first tokens |", "|---|---|---|---|---|---|---|"]
    for d in records:
        for tag, title in _SETTINGS:
            o = _first_p0(d, tag)
            if o is None:
                continue
            r = o.reads
            rescaled = r.edits.get("rescaled") if isinstance(r, SinkReads) else None
            if rescaled is None or rescaled.kept is None:
                reads = r.error if isinstance(r, Unmeasured) else r.reads if isinstance(r, SinkReads) else ""
            else:
                reads = (f"**{r.reads}** ({rescaled.kept:.2f} / {r.edits['direction_replaced'].kept:.2f}); "
                         f"later: {r.reads_later}")
            det = o.detection
            detection = "; ".join(f"0-{k}: {det.norm_share[i]:.2f}, {det.cosine[i]:.3f}" for i, k in enumerate(det.upto)
                                  ) if isinstance(det, Detection) else det.error if isinstance(det, Unmeasured) else ""
            sc = o.sink_circuit
            sink = sc.error if isinstance(sc, Unmeasured) else ""
            if isinstance(sc, SinkCircuit):
                c = sc.circuit
                sink = (f"{c.get('size', 0)} nodes, faithfulness {c['faithfulness']:.2f}" if "nodes" in c
                        else c.get("note", ""))
                sink += f"; shares {len(sc.shared)} with the norm circuit, only here: {', '.join(sc.only_sink) or 'none'}"
            w = o.super_weights
            weight = w.error if isinstance(w, Unmeasured) else ""
            if isinstance(w, SuperWeights) and w.weights:
                top, zero = w.weights[0], (w.zeroed or [None])[0]
                weight = (f"M{top.block}.W_out[{top.neuron}, {top.dim}] (z {top.z:+.1f})"
                          + ("" if zero is None else f": zeroed, norm ratio {w.clean.norm_ratio:.3g} -> "
                             f"{zero.norm_ratio:.3g}, loss {w.clean.loss:.2f} -> {zero.loss:.2f}"))
            f = d.first_tokens.get(str(o.layer))
            first = ("" if f is None else getattr(f, "error", "") if not hasattr(f, "sinks") else
                     f"{f.sinks:.1%} of {f.vocab} become sink states ({f.not_sinks} do not)"
                     + ("" if f.sinks_interval is None else
                        f"; a sample: 95% interval {f.sinks_interval[0]:.2%}-{f.sinks_interval[1]:.2%}"))
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in [d.model, title, reads, detection, sink, weight,
                                                                          first]) + " |")
    return out


def _how_sure(records: list[AnalysisRecord]) -> list[str]:
    """Thresholds that flip a label, the spread over prompts and the controls, per model and BOS setting."""
    out = ["", "## How sure: thresholds, spread over prompts, controls", "",
           "Flips: each threshold swept over its range (analysis.md lists the ranges and every label); the spread: the "
           "first P0 onset's numbers on `spread_prompts` other prompts, mean [95% bootstrap interval] and the lowest "
           "prompt; controls: passed / failed / not measured.", "",
           "| model | BOS | where a label flips | onset ratio | faithfulness on new prompts | strongest neuron | "
           "h_0 cosine (ordinary) | controls |", "|---|---|---|---|---|---|---|---|"]
    said = lambda x: "n/a" if x is None else f"{x.mean:.3g} [{x.low:.3g}, {x.high:.3g}], min {x.min:.3g}"  # noqa: E731
    for d in records:
        for tag, title in _SETTINGS:
            sens = d.sensitivity.get(tag)
            if sens is None:
                continue
            flips = "; ".join(f"{sw.threshold}: {f}" for sw in sens.sweeps for f in sw.flips) or "none"
            sp = d.spread.get(tag)
            if sp is None or not hasattr(sp, "ratio"):
                spread = [getattr(sp, "error", "not measured")] + [""] * 3
            else:
                spread = [said(sp.ratio), said(sp.faithfulness),
                          "n/a" if sp.neuron is None else f"{sp.neuron_name}: {said(sp.neuron)}",
                          "n/a (one first token: BOS)" if tag == SETTINGS[True] else
                          f"{said(sp.direction)} ({sp.direction_ordinary:.2f})"]
            controls = ", ".join(f"{c.name} {'?' if c.passed is None else 'passed' if c.passed else 'failed'}"
                                 for c in d.controls.get(tag, [])) or "none"
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in [d.model, title, flips, *spread, controls]) + " |")
    return out


def atlas(models: Sequence[str] = ATLAS_MODELS, *, out: Union[str, Path] = "docs/atlas.md",
          runs: Union[str, Path] = "runs/atlas", progress: bool = True, fresh: bool = False, **settings: Any) -> str:
    """Analyse ``models`` (resuming what ``runs`` holds, unless ``fresh``; its own directory, not ``analyze``'s, since
    its settings differ) and write the atlas page to ``out``; ``settings`` are
    :class:`~p0circuit.studies.analysis.settings.AnalysisSettings` fields, ``max_onsets`` :data:`ONSETS` unless
    given (the atlas shows a model's second amplification too), and ``max_edges`` :data:`EDGES` unless given."""
    settings.setdefault("max_onsets", ONSETS)
    settings.setdefault("max_edges", EDGES)
    for entry in models:
        check_model_entry(entry)  # every entry checked before the first model is loaded
    analyses = []
    for entry in models:
        where = Path(runs) / run_dir("atlas", entry).name
        analyses.append(analyze(entry, out=where, progress=progress, resume=not fresh, **settings).record)
    text = page(analyses)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text)
    return text

