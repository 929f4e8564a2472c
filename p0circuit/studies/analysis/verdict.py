"""The paper's claim, judged part by part from what an analysis measured.

Peng et al. (2026) claim that without a start token (a) position 0 becomes an attention sink, made by its
position, (b) by a circuit of layer-0 attention, which finds the position with nothing before it, and the
layer-0/1 MLPs, (c) whose neurons write its massive dimension, (d) that the state points along one fixed
direction, and (e) that it is this amplified norm the later heads attend to ("the MLPs amplify P0's norm into a
sink"). Each part is judged per BOS setting as **holds**, **partially supported** (the mechanism is there, but
not as the paper says: in other blocks, without an attention step, at position 0 but keyed on its token; the
part says where it was found), **fails**, or **not applicable** (the part's premise is missing: no onset, one
prompt, a mixture of experts; the part says why), with the evidence in numbers and every threshold a label uses
printed beside it. A part is judged only where its premise holds: no circuit "explains" a sink that is not
there, and a state that lasts one block is not "stable across layers". The headline (``claim``) names every
part; ``holds`` is true only when every part holds without BOS.

Block numbering (:data:`NUMBERING`): p0circuit counts blocks from 0, as TransformerLens does, and an onset at block
``L`` is the state in block ``L``'s output, which the attention of block ``L + 1`` is the first to read.
"""

from typing import Optional, Union

from p0circuit.core.defaults import (
    ALPHA_LINE, CIRCUIT_THRESHOLD, DIRECTION_COS, DIRECTION_MARGIN, NORM_THRESHOLD, SINK_EPS, sink_rate_label,
)
from p0circuit.core.shares import share
from p0circuit.core.types import Kind, Node
from p0circuit.studies.analysis.elsewhere import label as sink_label
from p0circuit.core.record import ABSENT
from p0circuit.studies.analysis.passes import EdgeCircuit, NeuronPass, NodeCircuit, Note
from p0circuit.studies.analysis.records import SETTINGS, TITLES, OnsetRow, SinkSummary, Skipped  # noqa: F401 (TITLES re-exported)
from p0circuit.studies.analysis.summaries import Part, Parts, Verdict
from p0circuit.studies.findings import Detection, KeyedOn, SinkReads, SuperWeights, Unmeasured

HOLDS, PARTIAL, FAILS, NOT_APPLICABLE = "holds", "partially supported", "fails", "not applicable"
"""The answers of each part: as the paper says; found, but not as it says (``found_at`` says where); not found;
the part's premise is missing (``why`` says which)."""
ANSWERS = ("each part holds; is partially supported (the mechanism was found, but not as the paper says: in other "
           "blocks, without an attention step, or at position 0 but keyed on its token; the part says where); fails; or "
           "is not applicable (its premise is missing: no onset, one prompt, no MLP neurons; the part says why)")
"""The answers, in words, for the written pages."""
NUMBERING = ("Blocks count from 0, as in TransformerLens: an onset at block L is the state in block L's output, which "
             "the attention of block L+1 reads first. In these terms the paper's account puts the state in the output "
             "of block 1 (written by the MLPs of blocks 0 and 1, after block 0's attention found position 0), read "
             "from block 2 on (its 'the sink reappears at layer 2')")
"""The paper's layer numbering mapped once onto p0circuit's (the written pages say it once)."""
PAPER_BLOCKS = {"attention": {0}, "mlp": {0, 1}}
"""Where the paper puts the mechanism: layer-0 attention finds position 0, the layer-0/1 MLPs amplify it."""
PARTS = (("sink", "a", "position 0 becomes a sink, made by its position"),
         ("circuit", "b", "the first onset's faithful circuit lies in layer-0 attention and the layer-0/1 MLPs"),
         ("amplification", "c", "those MLPs' neurons write the onset's massive dimension"),
         ("direction", "d", "the state points along one direction, fixed across prompts and stable across layers"),
         ("reads", "e", "the later heads attend to the amplified norm"))
"""Each part's key, letter and statement."""


def label(part: Part) -> str:
    """A part's answer in words: ``holds``, ``fails``, ``partially supported (found at <where>)`` (or
    ``partially supported (<which half>)`` for a part whose halves hold apart: ``partly``) or
    ``not applicable (<why>)``."""
    if part.partly:
        return f"{part.status} ({part.partly})"
    if part.found_at:
        return f"{part.status} (found at {part.found_at})"
    if part.why:
        return f"{part.status} ({part.why})"
    return part.status


def _not_applicable(why: str, evidence: Optional[str] = None) -> Part:
    return Part(status=NOT_APPLICABLE, why=why, evidence=evidence or why)


def _onset(summary: SinkSummary) -> Optional[int]:
    return next((l for k, l, _ in summary.norm_stages if k == "onset"), None)


def _sink_part(summary: SinkSummary, row: Optional[OnsetRow], line: float, alpha_line: float) -> Part:
    """(a) Position 0 becomes a sink: the P0 norm ratio reaches the onset line and, from that layer on, some head
    gives P0 a mean attention (alpha_0) above ``alpha_line``; made by the position: a state the first onset's keyed
    test (``row.keyed_on``) finds keyed on its token or its context is partially supported; the detection test
    (self-only attention) is cited."""
    onset = _onset(summary)
    first = onset if onset is not None else 0
    strongest, where = max(((max(r), l) for l, r in enumerate(summary.alpha) if l >= first), default=(0.0, first))
    text = ("the P0 norm ratio (||h_0|| over the mean ||h_t|| of the other positions) "
            + (f"reaches the onset line ({line:g}) at block {onset} (there its strongest head's alpha_0, mean "
               f"attention to P0, is {max(summary.alpha[first]):.2f})" if onset is not None else
               f"never reaches the onset line ({line:g})")
            + f", the strongest head's alpha_0 from then on is {strongest:.2f} (block {where}; the sink line is "
            f"{alpha_line:g}) and {sink_rate_label()} (share of heads giving P0 over {SINK_EPS:g}) = "
            f"{summary.sink_rate:.3f}")
    keyed = row.keyed_on if row is not None and isinstance(row.keyed_on, KeyedOn) else None
    if keyed is not None:
        text += f"; what the state is keyed on: {keyed.reading} ({keyed.evidence})"
    detection = row.detection if row is not None else None
    if isinstance(detection, Detection):
        text += f"; detection where the paper puts it: {detection.evidence}"
    others = sorted({sink_label(p) for p in summary.sink_positions if not p.where.startswith("P0")})
    if others:
        text += "; high-norm states away from position 0: " + ", ".join(others)
    if onset is None or strongest <= alpha_line:
        found = ("attention without a norm onset" if onset is None and strongest > alpha_line else
                 f"a norm onset at block {onset} that no head attends to above {alpha_line:g}" if onset is not None
                 else "")
        return Part(status=PARTIAL if found else FAILS, evidence=text, found_at=found or ABSENT,
                    strongest_alpha0=strongest)
    if keyed is not None and keyed.verdict != "position":
        return Part(status=PARTIAL, evidence=text, strongest_alpha0=strongest, found_at="position 0, " + (
            keyed.reading if summary.bos else f"keyed on its {keyed.verdict}"))
    return Part(status=HOLDS, evidence=text, strongest_alpha0=strongest)


def _blocks(names: list[str]) -> tuple[list[str], str, set[int], set[int]]:
    """(the blocks of ``names`` outside the paper's account, in words; every block ``names`` use, in words; the
    attention blocks; the MLP blocks)."""
    attn, mlp = set(), set()
    for name in names:
        n = Node.parse(name)
        if n.kind in (Kind.HEAD, Kind.KV_HEAD):
            attn.add(n.layer)
        elif n.kind in (Kind.MLP, Kind.NEURON, Kind.EXPERT):
            mlp.add(n.layer)
    outside = ([f"attention of block {l}" for l in sorted(attn - PAPER_BLOCKS["attention"])]
               + [f"MLP of block {l}" for l in sorted(mlp - PAPER_BLOCKS["mlp"])])
    used = " and ".join(x for x in (f"attention of blocks {', '.join(map(str, sorted(attn)))}" if attn else "",
                                    f"MLPs of blocks {', '.join(map(str, sorted(mlp)))}" if mlp else "") if x)
    return outside, used or "no attention and no MLP", attn, mlp


def _edges_said(c: NodeCircuit) -> str:
    """The circuit's edges in a few words, for the verdict's evidence."""
    e = c.edge_circuit
    if not isinstance(e, EdgeCircuit) or not e.searched:
        return ""
    return (f"; {e.size} edges ({', '.join(e.edges[:4])}{'...' if e.size > 4 else ''}) keep "
            f"{share(e.faithfulness)}")


def _circuit_part(onset: Optional[OnsetRow]) -> Part:
    """(b) Where the faithful circuit of the first P0 onset sits: holds only in layer-0 attention (the detection
    step, which it must hold) and the layer-0/1 MLPs (the amplification, which it must hold too)."""
    if onset is None:
        return _not_applicable("no onset of the P0 norm ratio, so no circuit to place")
    c = onset.circuit
    if not isinstance(c, NodeCircuit):
        return _not_applicable(f"no circuit at the block-{onset.layer} onset: "
                               f"{c.note if isinstance(c, Note) else 'not measured'}")
    st = c.settings
    where = (f"the block-{onset.layer} onset's circuit ({c.size} nodes: {', '.join(c.nodes[:8])}"
             + ("..." if c.size > 8 else "") + f"; faithfulness {share(c.faithfulness)}"
             + ("" if c.denoising is None else f", denoising {share(c.denoising)}") + _edges_said(c)
             + f"; a faithful circuit keeps at least {st.get('target', 0.9):g} with at most {st.get('max_size', 20)} "
             "nodes)")
    if not c.faithful:
        return Part(status=FAILS, evidence=f"no faithful circuit: {c.why}; best found: {where}")
    outside, used, attn, mlp = _blocks(c.nodes)
    # the detection step is block-0 attention *at position 0* (its undiluted output there): a head that only
    # changes the other positions (``@rest``) lowers the ratio's denominator but does not find position 0
    heads = [n for n in map(Node.parse, c.nodes) if n.kind in (Kind.HEAD, Kind.KV_HEAD)]
    at_p0 = any(n.layer == 0 and n.pos == 0 for n in heads)
    if heads and not any(n.pos == 0 for n in heads):  # said right after the attention it qualifies
        attn_said = used.split(" and MLPs")[0]
        used = used.replace(attn_said, attn_said + " (at the other positions only)", 1)
    missing = ([] if at_p0 else ["no attention step at position 0 in block 0"]) + \
        ([] if mlp & PAPER_BLOCKS["mlp"] else ["no MLP of blocks 0-1"])
    if not outside and not missing:
        return Part(status=HOLDS, evidence=f"{where} lies in layer-0 attention and the layer-0/1 MLPs")
    return Part(status=PARTIAL, found_at=used + (f", {'; '.join(missing)}" if missing else ""),
                evidence=where + (f"; outside the paper's blocks: {', '.join(outside)}" if outside else "")
                + (f"; {'; '.join(missing)}" if missing else ""))


def _amplification_part(onset: Optional[OnsetRow], threshold: float) -> Part:
    """(c) Which MLPs and neurons write the onset's massive dimension at P0 (with the super weights they write it
    through)."""
    if onset is None:
        return _not_applicable("no onset of the P0 norm ratio")
    npass = onset.neuron_pass
    if not isinstance(npass, NeuronPass):
        note = npass.note if isinstance(npass, Note) else "not measured"
        if any(w in note for w in ("mixture of experts", "attention-only", "no massive dimension", "no signal")):
            return _not_applicable(note, f"at the block-{onset.layer} onset: {note}")
        return Part(status=FAILS, evidence=f"at the block-{onset.layer} onset: {note}")
    neurons = onset.neurons or {}
    strong = [n for n, v in neurons.items() if abs(v) >= threshold]
    if not npass.signal or not strong:
        return Part(status=FAILS, evidence=f"no neuron carries {threshold:g} of the change of {npass.metric} "
                    f"({npass.message or 'screened: ' + npass.screen})")
    text = (f"{npass.metric} (the massive dimension's value at P0 after block {onset.layer}) is written by "
            f"{len(strong)} neuron(s) each carrying at least {threshold:g} of its clean-to-corrupted change alone "
            "(strongest: " + ", ".join(f"{n} {share(neurons[n])}" for n in strong[:3]) + ")")
    if isinstance(onset.super_weights, SuperWeights):
        text += f"; the single weights: {onset.super_weights.evidence}"
    outside, used, _, _ = _blocks(strong)
    if not outside:
        return Part(status=HOLDS, evidence=text + "; all in the layer-0/1 MLPs")
    return Part(status=PARTIAL, found_at=used,
                evidence=text + "; outside the paper's layer-0/1 MLPs: " + ", ".join(outside))


def direction_fixed(cos: float, ordinary: Optional[float], line: float) -> bool:
    """Whether h_0's cosine across prompts counts as a fixed direction: at the ``line``, and above the ordinary
    positions' own cosine by at least half of what those lack of 1 (where they already reach the line, the line
    alone cannot tell the sink state from any other state)."""
    return cos >= line and (ordinary is None or cos - ordinary >= DIRECTION_MARGIN * (1 - ordinary))


ONE_FIRST_TOKEN = ("every prompt starts with the same BOS token, so under the causal mask h_0 is one vector in "
                   "every prompt and its cosine across prompts is 1 by construction")
"""Why (d)'s across-prompts half is not applicable with BOS."""


def _direction_part(summary: SinkSummary, line: float) -> Part:
    """(d) The P0 state points along a fixed direction: across prompts (their mean pairwise cosine of h_0, against
    the ordinary positions' and h_0's without its massive dimensions, :func:`direction_fixed`) and across layers
    (each layer's mean direction against the onset's), at every layer from the first onset until the ratio first
    falls back below the line (the state's first span); a span of one block is not "stable across layers". With
    BOS the across-prompts half is not applicable (:data:`ONE_FIRST_TOKEN`): the part rests on the layers alone."""
    onset = _onset(summary)
    if onset is None:
        return _not_applicable("no onset of the P0 norm ratio, so no state whose direction to judge")
    prompts, layers = summary.direction_stability, summary.direction_to_onset
    if prompts is None or layers is None:
        return _not_applicable("one prompt: no pairwise cosine across prompts")
    ordinary = summary.direction_stability_ordinary or [None] * len(prompts)
    unmassive = summary.direction_stability_unmassive or [None] * len(prompts)
    end = next((l for k, l, _ in summary.norm_stages if k == "erasure" and l > onset), len(layers))
    span = range(onset, end)
    worst_p = min(span, key=lambda l: prompts[l])
    worst_l = min(span, key=lambda l: layers[l])
    base = ordinary[worst_p]
    text = (f"over blocks {onset}-{end - 1} (from the onset until the ratio falls back below the line), h_0's mean "
            f"pairwise cosine across prompts is at least {prompts[worst_p]:.3f} (block {worst_p}"
            + ("" if base is None else f"; ordinary positions there {base:.3f}, h_0 without its massive dimensions "
               f"{unmassive[worst_p]:.3f}") + f") and its mean direction keeps a cosine of at least {layers[worst_l]:.3f} "
            f"(block {worst_l}) with the onset's; the line is {line:g} for both, and h_0 must exceed the ordinary "
            f"positions' cosine by at least {DIRECTION_MARGIN:g} of what they lack of 1")
    if end < len(layers):
        low = min(range(end, len(layers)), key=lambda l: layers[l])
        text += f"; after that span the direction's cosine with the onset's falls to {layers[low]:.3f} (block {low})"
    fixed = all(direction_fixed(prompts[l], ordinary[l], line) for l in span)
    stable = layers[worst_l] >= line
    cosines = dict(min_cos_prompts=round(prompts[worst_p], 4), min_cos_layers=round(layers[worst_l], 4))
    if summary.bos:
        said = text + f"; across prompts not applicable: {ONE_FIRST_TOKEN}"
        if stable and len(span) > 1:
            return Part(status=PARTIAL, evidence=said, **cosines,
                        partly="stable across layers; fixed across prompts not applicable: one first token (BOS)")
        return Part(status=FAILS, evidence=said, **cosines) if not stable else _not_applicable(
            f"{ONE_FIRST_TOKEN}, and the state lasts one block", text)
    if fixed and len(span) == 1:
        return Part(status=PARTIAL, evidence=text, **cosines,
                    partly="fixed across prompts; stable across layers not applicable: the state lasts one block")
    if fixed and stable:
        return Part(status=HOLDS, evidence=text, **cosines)
    if fixed or stable:
        return Part(status=PARTIAL, evidence=text, **cosines,
                    partly="fixed across prompts only" if fixed else "stable across layers only")
    return Part(status=FAILS, evidence=text, **cosines)


def _reads_part(onset: Optional[OnsetRow]) -> Part:
    """(e) What the later heads read of the P0 state (:mod:`p0circuit.studies.experiments.reads`): the paper's
    "amplify the norm into a sink" holds where the heads need the norm; where they read the direction alone right
    after the onset but need the norm over later blocks (a small state is turned by later writes), it is partially
    supported (the norm keeps the direction); where they read the direction alone throughout, it fails."""
    if onset is None:
        return _not_applicable("no onset of the P0 norm ratio")
    reads = onset.reads
    if not isinstance(reads, SinkReads):
        return _not_applicable(reads.error if isinstance(reads, Unmeasured) else "not measured")
    if reads.reads.startswith(("not applicable", "not measured")):
        return _not_applicable(reads.reads.split("(", 1)[1].rstrip(")"), reads.evidence)
    first = reads.window or []
    where = f"block {first[0]}" if len(first) == 1 else f"blocks {first[0]}-{first[-1]}" if first else "the first block after it"
    blind = bool(reads.scale_blind)
    text = (f"the first sink heads after the onset ({where}) read {reads.reads}; the sink heads of all "
            + ("blocks after it" if blind else "later blocks") + f" together read {reads.reads_later} "
            f"({reads.evidence})")
    near, later = reads.reads, reads.reads_later
    if blind:  # the block right after the onset cannot see the norm: the blocks after it decide, as the later do below
        if later.startswith(("not applicable", "not measured")):
            return _not_applicable("the block right after the onset cannot see the norm, and no block after it holds a "
                                   "sink head", text)
        near = "the direction" if later in ("the norm", "both", "the direction") else later
    if near in ("the norm", "both"):
        return Part(status=HOLDS, evidence=text + ": the norm is what the sink needs, as the paper says")
    if later in ("the norm", "both"):
        return Part(status=PARTIAL, partly="the direction right after the onset; the norm over later blocks",
                    evidence=text + ": the heads read the state's direction; its norm matters only by keeping that "
                    "direction through later blocks (the paper's stabilization), not as what the heads attend to")
    if near == "neither alone":
        return Part(status=FAILS, evidence=text + ": neither the norm nor the direction alone is needed (each edit "
                    "alone keeps the attention), so the heads do not attend to the amplified norm as such")
    return Part(status=FAILS, evidence=text + ": the heads read the state's direction and not its norm, so 'the MLPs "
                "amplify the norm into a sink' does not describe what makes the sink here; the amplification writes a "
                "fixed direction that the heads attend to")


def judge(summary: SinkSummary, row: Optional[OnsetRow], *, line: float = NORM_THRESHOLD,
          alpha_line: float = ALPHA_LINE, cos: float = DIRECTION_COS, threshold: float = CIRCUIT_THRESHOLD) -> Parts:
    """Every part of :data:`PARTS` for one BOS setting: ``summary`` its sink summary (its ``bos`` says which setting),
    ``row`` its first P0 onset's row (None: no onset was patched), at these lines (see :func:`verdict`)."""
    sink, circuit = _sink_part(summary, row, line, alpha_line), _circuit_part(row)
    amplification, reads = _amplification_part(row, threshold), _reads_part(row)
    onset = _onset(summary)
    keyed_here = sink.found_at or ""
    if circuit.status == HOLDS and keyed_here.startswith(("position 0, keyed on its token", "position 0, follows BOS")):
        # the circuit sits in the paper's blocks, but (a) found the state keyed on its token (or following BOS):
        # the circuit of a token's state, not of the paper's position-0 mechanism
        keyed = keyed_here.removeprefix("position 0, ")
        keyed = ("is " if keyed.startswith("keyed") else "") + keyed
        circuit = circuit.replace(status=PARTIAL, found_at=f"the paper's blocks, for a state that {keyed}",
                                  evidence=circuit.evidence + f"; but the state it builds {keyed} (part (a)): "
                                  "the circuit of a token's state, not of position 0 as such")
    if row is None and onset is not None:  # an onset no row measured: its parts have nothing to judge
        circuit = amplification = reads = _not_applicable(f"the onset at block {onset} was not patched")
    return Parts(sink=sink, circuit=circuit, amplification=amplification, direction=_direction_part(summary, cos),
                 reads=reads)


def verdict(sinks: dict[str, Union[SinkSummary, Skipped]], onsets: dict[str, list[OnsetRow]],
            threshold: float = CIRCUIT_THRESHOLD, line: float = NORM_THRESHOLD, alpha_line: float = ALPHA_LINE,
            cos: float = DIRECTION_COS) -> Verdict:
    """The paper's claim in :data:`PARTS` per BOS setting (see the module docstring), with ``line`` the onset line
    (the analysis' norm threshold), ``alpha_line`` the sink line on alpha_0, ``cos`` the direction line and
    ``threshold`` the neurons' effect line. ``claim``: every part without BOS, in words; ``holds``: all hold
    without BOS."""
    parts: dict[str, Parts] = {}
    for tag, summary in sinks.items():
        if not isinstance(summary, SinkSummary):
            continue
        first = next((o for o in onsets.get(tag, []) if o.where == "P0" and not o.skipped), None)
        parts[tag] = judge(summary, first, line=line, alpha_line=alpha_line, cos=cos, threshold=threshold)
    no = parts.get(SETTINGS[False])
    if no is None:
        return Verdict(claim="not applicable (no run without BOS)", parts=parts)
    with_bos = sinks.get(SETTINGS[True])
    return Verdict(claim="without BOS, " + "; ".join(f"({letter}) {label(getattr(no, key))}" for key, letter, _ in PARTS),
                   holds=all(getattr(no, key).status == HOLDS for key, _, _ in PARTS),
                   strongest_alpha0=no.sink.strongest_alpha0, parts=parts,
                   with_bos_sink_rate=with_bos.sink_rate if isinstance(with_bos, SinkSummary) else ABSENT)
