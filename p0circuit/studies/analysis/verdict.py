"""The paper's claim, judged part by part from what an analysis measured.

Peng et al. (2026) claim that without a start token (a) position 0 becomes an attention sink, (b) by
a circuit of layer-0 attention, which finds the position with nothing before it, and the layer-0/1
MLPs, (c) whose neurons write its massive dimension, and (d) that the state points along one fixed
direction. Each part is judged per BOS setting as **holds**, **fails as stated** (the mechanism is
there, but not as the paper says: in other blocks, or at position 0 but keyed on its token; the record
says where it was found), **fails**, or **not measured** (a part this model or these prompts cannot
measure), with the evidence in numbers. The headline (``claim``) names all four parts; ``holds`` is true only when all
four hold without BOS.
"""

from typing import Any, Optional

from p0circuit.core.defaults import CIRCUIT_THRESHOLD, DIRECTION_COS, SINK_EPS, sink_rate_label
from p0circuit.core.shares import share
from p0circuit.core.types import Kind, Node
from p0circuit.studies.analysis.elsewhere import label as sink_label

HOLDS, AS_STATED, FAILS, UNMEASURED = "holds", "fails as stated", "fails", "not measured"
"""The answers of each part: as the paper says; found, but not as it says (in other blocks, or keyed on the token);
not found; not measurable on this model or these prompts (a mixture of experts has no single MLP's neurons; one
prompt has no pairwise cosine)."""
ANSWERS = ("each part holds; fails as stated (the mechanism was found, but not as the paper says: in other blocks, "
           "or at position 0 but keyed on its token; the part says where); fails; or is not measured (a part this "
           "model or these prompts cannot measure)")
"""The answers, in words, for the written pages."""
PAPER_BLOCKS = {"attention": {0}, "mlp": {0, 1}}
"""Where the paper puts the mechanism: layer-0 attention finds position 0, the layer-0/1 MLPs amplify it."""
PARTS = (("sink", "a", "position 0 becomes a sink"),
         ("circuit", "b", "the first onset's faithful circuit lies in layer-0 attention and the layer-0/1 MLPs"),
         ("amplification", "c", "those MLPs' neurons write the onset's massive dimension"),
         ("direction", "d", "the state points along one direction, fixed across prompts and stable across layers"))
"""Each part's key, letter and statement."""
SETTINGS = {False: "without_bos", True: "with_bos"}
"""BOS setting -> its key in the results."""
TITLES = {"without_bos": "without BOS", "with_bos": "with BOS"}
"""A BOS setting's key -> its name in the written pages."""


def label(part: dict[str, Any]) -> str:
    """A part's answer in words: ``holds``, ``fails``, or ``fails as stated (found at <where>)``."""
    return part["status"] + (f" (found at {part['found_at']})" if part.get("found_at") else "")


def _sink_part(summary: dict[str, Any], keyed: Optional[dict[str, Any]]) -> dict[str, Any]:
    """(a) Position 0 becomes a sink: the P0 norm ratio (P0's residual norm over the mean norm of the other
    positions) reaches the threshold and, from that layer on, some head gives P0 a mean attention (alpha_0)
    above 0.5; made by the position: a state that the first onset's test (``keyed``) finds keyed on its token
    or its context fails as stated."""
    onset = [l for k, l, _ in summary["norm_stages"] if k == "onset"]
    first = onset[0] if onset else 0
    strongest, where = max(((max(row), l) for l, row in enumerate(summary["alpha"]) if l >= first), default=(0.0, first))
    holds = bool(onset) and strongest > 0.5
    text = ("the P0 norm ratio (||h_0|| over the mean ||h_t|| of the other positions) "
            + (f"reaches the threshold at layer {onset[0]}" if onset else "never reaches the threshold")
            + (f" (there its strongest head's alpha_0, mean attention to P0, is {max(summary['alpha'][first]):.2f})"
               if onset else "")
            + f", the strongest head's alpha_0 from then on is {strongest:.2f} (layer {where}) and {sink_rate_label()} "
            f"(share of heads giving P0 over {SINK_EPS:g}) = {summary['sink_rate']:.3f}")
    if keyed and "verdict" in keyed:
        text += f"; the state is keyed on {keyed['verdict']} ({keyed['evidence']})"
    others = sorted({sink_label(p) for p in summary["sink_positions"] if not p["where"].startswith("P0")})
    if others:
        text += "; sink states away from position 0: " + ", ".join(others)
    out = {"status": HOLDS if holds else FAILS, "evidence": text, "strongest_alpha0": strongest}
    if holds and keyed and keyed.get("verdict") not in (None, "position"):  # a sink at position 0, not made by it
        out.update(status=AS_STATED, found_at=f"position 0, keyed on {keyed['verdict']}")
    return out


def _blocks(names: list[str]) -> tuple[list[str], str]:
    """(the blocks of ``names`` outside the paper's account, every block ``names`` use), in words."""
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
    return outside, used


def _edges_said(c: dict[str, Any]) -> str:
    """The circuit's edges in a few words, for the verdict's evidence."""
    e = c.get("edge_circuit") or {}
    if "edges" not in e or not e.get("searched", True):
        return ""
    return (f"; {e['size']} edges ({', '.join(e['edges'][:4])}{'...' if e['size'] > 4 else ''}) keep "
            f"{share(e['faithfulness'])}")


def _circuit_part(onset: Optional[dict[str, Any]]) -> dict[str, Any]:
    """(b) Where the faithful circuit of the first P0 onset sits."""
    if onset is None:
        return {"status": FAILS, "evidence": "no onset of the P0 norm ratio, so no circuit to place"}
    c = onset.get("circuit") or {}
    if "nodes" not in c:
        return {"status": FAILS, "evidence": f"no circuit at the layer-{onset['layer']} onset: {c.get('note', 'not measured')}"}
    where = (f"the layer-{onset['layer']} onset's circuit ({c['size']} nodes: {', '.join(c['nodes'][:8])}"
             + ("..." if c["size"] > 8 else "") + f"; faithfulness {share(c['faithfulness'])}"
             + ("" if c["denoising"] is None else f", denoising {share(c['denoising'])}") + _edges_said(c) + ")")
    if not c["faithful"]:
        return {"status": FAILS, "evidence": f"no faithful circuit: {c['why']}; best found: {where}"}
    outside, used = _blocks(c["nodes"])
    if not outside:
        return {"status": HOLDS, "evidence": f"{where} lies in layer-0 attention and the layer-0/1 MLPs"}
    return {"status": AS_STATED, "found_at": used,
            "evidence": f"{where}; outside the paper's blocks: " + ", ".join(outside)}


def _amplification_part(onset: Optional[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """(c) Which MLPs and neurons write the onset's massive dimension at P0."""
    if onset is None:
        return {"status": FAILS, "evidence": "no onset of the P0 norm ratio"}
    npass = onset.get("neuron_pass") or {}
    if "metric" not in npass:
        note = npass.get("note", "not measured")
        unmeasurable = any(w in note for w in ("mixture of experts", "attention-only"))
        return {"status": UNMEASURED if unmeasurable else FAILS, "evidence": f"at the layer-{onset['layer']} onset: {note}"}
    strong = [n for n, v in (onset.get("neurons") or {}).items() if abs(v) >= threshold]
    if not npass.get("signal") or not strong:
        return {"status": FAILS, "evidence": f"no neuron carries {threshold} of the change of {npass['metric']} "
                f"({npass.get('message') or 'screened: ' + npass.get('screen', '')})"}
    text = (f"{npass['metric']} (the massive dimension's value at P0 after block {onset['layer']}) is written by "
            f"{len(strong)} neuron(s) each carrying at least {threshold:g} of its clean-to-corrupted change alone "
            "(strongest: " + ", ".join(f"{n} {share(onset['neurons'][n])}" for n in strong[:3]) + ")")
    outside, used = _blocks(strong)
    if not outside:
        return {"status": HOLDS, "evidence": text + "; all in the layer-0/1 MLPs"}
    return {"status": AS_STATED, "found_at": used,
            "evidence": text + "; outside the paper's layer-0/1 MLPs: " + ", ".join(outside)}


def _direction_part(summary: dict[str, Any]) -> dict[str, Any]:
    """(d) The P0 state points along a fixed direction: across prompts (their mean pairwise cosine of h_0) and across
    layers (each layer's mean direction against the onset's), both at least :data:`DIRECTION_COS` at every layer
    from the first onset until the ratio first falls back below the threshold (the state's first span)."""
    stages = summary["norm_stages"]
    onset = next((l for k, l, _ in stages if k == "onset"), None)
    if onset is None:
        return {"status": FAILS, "evidence": "no onset of the P0 norm ratio, so no state whose direction to judge"}
    prompts, layers = summary.get("direction_stability"), summary.get("direction_to_onset")
    if prompts is None or layers is None:
        return {"status": UNMEASURED, "evidence": "one prompt: no pairwise cosine across prompts"}
    end = next((l for k, l, _ in stages if k == "erasure" and l > onset), len(layers))
    span = range(onset, end)
    worst_p = min(span, key=lambda l: prompts[l])
    worst_l = min(span, key=lambda l: layers[l])
    text = (f"over layers {onset}-{end - 1} (from the onset until the ratio falls back below the threshold), h_0's "
            f"mean pairwise cosine across prompts is at least {prompts[worst_p]:.3f} (layer {worst_p}) and its mean "
            f"direction keeps a cosine of at least {layers[worst_l]:.3f} (layer {worst_l}) with the onset's; the "
            f"threshold is {DIRECTION_COS:g} for both")
    if end < len(layers):
        low = min(range(end, len(layers)), key=lambda l: layers[l])
        text += f"; after that span the direction's cosine with the onset's falls to {layers[low]:.3f} (layer {low})"
    holds = prompts[worst_p] >= DIRECTION_COS and layers[worst_l] >= DIRECTION_COS
    return {"status": HOLDS if holds else FAILS, "evidence": text,
            "min_cos_prompts": round(prompts[worst_p], 4), "min_cos_layers": round(layers[worst_l], 4)}


def verdict(sinks: dict[str, Any], onsets: dict[str, Any], threshold: float = CIRCUIT_THRESHOLD) -> dict[str, Any]:
    """The paper's claim in :data:`PARTS` per BOS setting (see the module docstring). ``claim``: every part without
    BOS, in words; ``holds``: all four hold without BOS."""
    parts: dict[str, Any] = {}
    for tag, summary in sinks.items():
        if not summary or "skipped" in summary:
            continue
        first = next((o for o in onsets.get(tag, []) if o["where"] == "P0" and "skipped" not in o), None)
        parts[tag] = {"sink": _sink_part(summary, (first or {}).get("keyed_on")), "circuit": _circuit_part(first),
                      "amplification": _amplification_part(first, threshold), "direction": _direction_part(summary)}
    no = parts.get(SETTINGS[False])
    if no is None:
        return {"claim": "not measured (no run without BOS)", "parts": parts}
    out = {"claim": "without BOS, " + "; ".join(f"({letter}) {label(no[key])}" for key, letter, _ in PARTS),
           "holds": all(no[key]["status"] == HOLDS for key, _, _ in PARTS),
           "strongest_alpha0": no["sink"]["strongest_alpha0"], "parts": parts}
    with_bos = sinks.get(SETTINGS[True])
    if with_bos and "skipped" not in with_bos:
        out["with_bos_sink_rate"] = with_bos["sink_rate"]
    return out
