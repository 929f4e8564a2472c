"""Circuit figures a paper can print, and the same figure to explore in a notebook or the report.

The layout is one row (*rank*) per stage of the forward pass, from the embeddings at the bottom to
the metric at the top: the embeddings, then for each block its attention heads and, one rank up,
its MLP (neurons and experts with it). Only ranks that hold a node are drawn, each labelled on the
left. Colour is the sign of the normalized effect (red: the node or edge carries the
clean-to-corrupted change of the metric; blue: it works against it), line width its size. Every
edge names the receiver's input it writes (``q``, ``k``, ``v``, ``mlp``, ``resid``). A node circuit
(activation patching) draws each node's effect as an edge into the metric node; an edge circuit
joins its last receivers to the metric with a thin dashed line.

With a ground truth (a planted model's), the figure overlays it: a found item that is in the truth
has a thick outline, one that is not a dotted one, and a truth item that was missed is drawn grey
and dashed.

:func:`layout` computes positions and styles once; :func:`draw` makes the matplotlib figure (PNG,
SVG); :func:`to_html` wraps that SVG with a small script (pan by dragging, zoom with the wheel,
hover for the effect, click a node to highlight every path through it); :func:`circuit_figure`
returns an object that shows the interactive form in Jupyter. :func:`p0circuit.figures.graphs.to_dot`
reads the same ranks and styles for Graphviz.
"""

import html
import io
import json
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.core.types import AnyCircuit, Circuit, Edge, Kind, Node, as_circuit

from p0circuit.figures.colours import LOWERS, MISSED, NEUTRAL, RAISES

INPUT_MARK = {"q": "q", "k": "k", "v": "v", "mlp_in": "mlp", "resid": "resid"}
"""How an edge names the receiver's input it writes."""
METRIC = "metric"
"""The name of the metric node."""


def rank_of(node: Node) -> int:
    """The node's stage in the forward pass: 0 for the embeddings, ``2 * layer + 1`` for a block's
    attention (heads, key/value heads), ``2 * layer + 2`` for its MLP, neurons and experts."""
    if node.kind in (Kind.EMBED, Kind.POS_EMBED):
        return 0
    if node.kind in (Kind.HEAD, Kind.KV_HEAD):
        return 2 * node.layer + 1
    return 2 * node.layer + 2


def rank_label(rank: int) -> str:
    """``embed``, ``L3 attn``, ``L3 mlp``."""
    if rank == 0:
        return "embed"
    return f"L{(rank - 1) // 2} {'attn' if rank % 2 else 'mlp'}"


def colour(effect: Optional[float]) -> str:
    """The line colour of an effect: red above zero, blue below, grey when there is none."""
    if effect is None or not math.isfinite(effect) or effect == 0:
        return NEUTRAL
    return RAISES if effect > 0 else LOWERS


def width(effect: Optional[float], bound: float) -> float:
    """Line width in points: 0.8 for no effect, up to 4.8 for the largest |effect| in the figure."""
    if effect is None or not math.isfinite(effect) or bound <= 0:
        return 0.8
    return 0.8 + 4.0 * min(abs(effect) / bound, 1.0)


@dataclass
class Placed:
    """A node of the figure: where it is drawn and how."""

    name: str
    x: float
    y: float
    rank: int
    effect: Optional[float]
    status: str
    """``found`` (no truth given), ``match`` (found and in the truth), ``extra`` (found, not in the
    truth), ``missed`` (in the truth, a candidate, not found), ``untested`` (in the truth, never a
    candidate: no claim either way), ``metric``."""


@dataclass
class Link:
    """An edge of the figure."""

    name: str
    src: str
    dst: str
    input: str
    effect: Optional[float]
    status: str
    """As :attr:`Placed.status`, or ``to_metric`` for the lines into the metric node."""


@dataclass
class Layout:
    """Positions and styles of one circuit figure."""

    nodes: list[Placed]
    links: list[Link]
    ranks: list[tuple[float, str]]
    """(y, label) of every rank drawn, bottom to top."""
    title: str
    bound: float
    """The largest |effect| drawn (line widths are relative to it)."""
    span: float = field(default=1.0)
    """The widest rank's node count."""


def _status(name: str, found: set[str], truth: Optional[set[str]], candidates: Optional[set[str]] = None) -> str:
    """``candidates``: the names the circuit's method scored (None: not recorded, so a truth item not
    found counts as missed)."""
    if truth is None:
        return "found"
    if name in found:
        return "match" if name in truth else "extra"
    return "untested" if candidates is not None and name not in candidates else "missed"


def _faded(status: str) -> bool:
    return status in ("missed", "untested")


def _effect(effects: Any, name: str) -> Optional[float]:
    value = effects.get(name)
    return value if value is not None and math.isfinite(value) else None


@entry_point
def layout(circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "") -> Layout:
    """Where each node of ``circuit`` (and of ``truth``, if given) goes and how it is styled; either may be any
    circuit the package returns, laid out as its ``.to_circuit()``."""
    circuit = as_circuit(circuit, "layout")
    truth = None if truth is None else as_circuit(truth, "layout", "truth")
    edge_level = circuit.level == "edge"
    found_nodes = {n.name for n in circuit.nodes}
    found_edges = {e.name for e in circuit.edges}
    nodes: dict[str, Node] = {n.name: n for n in circuit.nodes}
    edges: dict[str, Edge] = {e.name: e for e in circuit.edges}
    true_nodes = true_edges = None
    if truth is not None:
        true_edges = {e.name for e in truth.edges} if edge_level else set()
        true_nodes = ({n.name for n in truth.nodes} if edge_level else {n.name for n in truth.writers})
        if edge_level:
            edges.update({e.name: e for e in truth.edges})
            nodes.update({n.name: n for e in truth.edges for n in (e.src, e.dst)})
        else:
            nodes.update({n.name: n for n in truth.writers})
    node_effects = circuit.node_effects
    scored_nodes = set(node_effects) or None
    scored_edges = set(circuit.edge_effects) or None
    by_rank: dict[int, list[Node]] = {}
    for node in sorted(nodes.values()):
        by_rank.setdefault(rank_of(node), []).append(node)
    used = sorted(by_rank)
    placed = []
    for row, rank in enumerate(used):
        members = by_rank[rank]
        for i, node in enumerate(members):
            placed.append(Placed(node.name, i - (len(members) - 1) / 2, float(row), rank,
                                 None if edge_level else _effect(node_effects, node.name),
                                 _status(node.name, found_nodes, true_nodes, None if edge_level else scored_nodes)))
    top = float(len(used))
    placed.append(Placed(METRIC, 0.0, top, -1, None, "metric"))
    links = [Link(e.name, e.src.name, e.dst.name, INPUT_MARK[e.input.value], _effect(circuit.edge_effects, e.name),
                  _status(e.name, found_edges, true_edges, scored_edges)) for e in sorted(edges.values(), key=lambda e: e.name)]
    if edge_level:
        senders = {e.src.name for e in edges.values()}
        links += [Link(f"{n.name}->{METRIC}", n.name, METRIC, "", None, "to_metric")
                  for n in sorted(nodes.values()) if n.name not in senders]
    else:
        links += [Link(f"{p.name}->{METRIC}", p.name, METRIC, "", p.effect,
                       p.status if _faded(p.status) else "to_metric") for p in placed if p.name != METRIC]
    values = [abs(v) for v in [l.effect for l in links] + [p.effect for p in placed] if v is not None]
    s = circuit.settings
    title = title or " ".join(f"{k}={s[k]}" for k in ("method", "corruption", "metric") if k in s)
    ranks = [(float(row), rank_label(rank)) for row, rank in enumerate(used)] + [(top, "metric")]
    span = max([len(v) for v in by_rank.values()] + [1])
    return Layout(placed, links, ranks, title, max(values, default=0.0), float(span))


def edge_label(link: Link) -> str:
    """The receiver's input and, when there is one, the effect: ``k +0.83``."""
    return link.input if link.effect is None or not link.input else f"{link.input} {link.effect:+.2f}"


def node_label(p: Placed) -> str:
    if p.name == METRIC:
        return "metric"
    return p.name if p.effect is None else f"{p.name}\n{p.effect:+.2f}"


@entry_point
def draw(circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "", ax: Any = None) -> Any:
    """The circuit as a matplotlib figure (``draw(c).savefig("circuit.png")`` or ``.svg``). Each
    node and edge is an artist whose ``gid`` is ``node:<name>`` or ``edge:<name>`` (kept in SVG)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from p0circuit.figures.plotting import finish

    circuit = as_circuit(circuit, "draw")
    lay = layout(circuit, truth, title)
    at = {p.name: p for p in lay.nodes}
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * lay.span + 1.8), max(2.5, 0.95 * len(lay.ranks) + 0.8)))
    fig = ax.figure
    half_w, half_h = 0.36, 0.2
    labels: list[tuple[Any, Callable[[float], tuple[float, float]]]] = []
    pairs: dict[tuple[str, str], list[str]] = {}  # the links between two nodes (into several inputs of one head)
    for link in lay.links:
        pairs.setdefault((link.src, link.dst), []).append(link.name)
    for link in lay.links:
        a, b = at[link.src], at[link.dst]
        missed = _faded(link.status)
        (x0, y0), (x1, y1) = (a.x, a.y + half_h), (b.x, b.y - half_h)
        span = math.hypot(x1 - x0, y1 - y0)
        # an edge past a rank bows out (its middle half a node wider than the boxes) around the nodes between
        rad = 0.08 if b.y - a.y <= 1 else 2 * (half_w + 0.2) / max(span, 1e-9)
        twins = pairs[(link.src, link.dst)]  # links between the same two nodes bow apart, each its own curve
        rad += TWIN_BOW * (twins.index(link.name) - (len(twins) - 1) / 2)
        arrow = FancyArrowPatch(
            (x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=9, connectionstyle=f"arc3,rad={rad}",
            color=MISSED if missed else colour(link.effect),
            linewidth=width(link.effect, lay.bound),
            linestyle=":" if link.status == "untested" else "--" if missed or link.effect is None else "-",
            alpha=0.45 if link.status == "to_metric" else 0.95, zorder=1)
        arrow.set_gid(f"edge:{link.name}")
        ax.add_patch(arrow)
        if link.input:  # on the curve (matplotlib's arc3 is a quadratic Bezier), where no other label sits
            cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
            on = lambda t, x0=x0, y0=y0, x1=x1, y1=y1, cx=cx, cy=cy: (  # noqa: E731
                (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x1, (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y1)
            label = ax.text(*on(LABEL_AT[0]), edge_label(link), fontsize=6.5, ha="center", va="center",
                            color=MISSED if missed else "#222222", zorder=3,
                            bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
            labels.append((label, on))
    for p in lay.nodes:
        missed = _faded(p.status)
        fill = "#f0f0f0" if missed else "#fff7e0" if p.name == METRIC else fill_colour(p.effect, lay.bound)
        box = FancyBboxPatch((p.x - half_w, p.y - half_h), 2 * half_w, 2 * half_h, boxstyle="round,pad=0.02",
                             facecolor=fill, edgecolor=MISSED if missed else "#222222",
                             linewidth=2.2 if p.status == "match" else 1.0,
                             linestyle={"extra": ":", "missed": "--", "untested": ":"}.get(p.status, "-"), zorder=2)
        box.set_gid(f"node:{p.name}")
        ax.add_patch(box)
        ax.text(p.x, p.y, node_label(p), fontsize=7, ha="center", va="center", zorder=4,
                color=MISSED if missed else "#111111")
    left = -lay.span / 2 - 0.45
    for y, label in lay.ranks:
        ax.text(left - 0.1, y, label, fontsize=7, ha="right", va="center", color="#666666")
    ax.set_xlim(left - 0.9, lay.span / 2 + 0.45)
    ax.set_ylim(-0.6, len(lay.ranks) - 0.4)
    ax.axis("off")
    ax.set_title(lay.title, fontsize=9)
    key = "red: carries the change, blue: works against it, width: |effect|"
    if truth is not None:
        key += "\nthick outline: in the truth, dotted: not in it, grey dashed: missed"
        if any(x.status == "untested" for x in [*lay.nodes, *lay.links]):
            key += ", grey dotted: never a candidate"
    if not circuit.nodes and not circuit.edges:
        ax.text(0.5, 0.5, empty_note(circuit), transform=ax.transAxes, fontsize=8, ha="center", va="center",
                color="#444444", wrap=True)
    ax.text(0.99, 0.0, key, transform=ax.transAxes, fontsize=6, ha="right", va="bottom", color="#666666")
    out = finish(fig) if own else fig
    _apart(ax, labels)
    return out


TWIN_BOW = 0.16
"""How much further each of several links between the same two nodes bows (the curvature of matplotlib's arc3), so
that each is its own curve with its own label."""
LABEL_AT = tuple(sorted((round(0.1 + 0.05 * i, 2) for i in range(18)), key=lambda t: (abs(t - 0.75), -t)))
"""Where along its edge an edge's label may sit (its share of the way from the sender), in the order tried: three
quarters along unless another label or a node is there, then ever further from there."""


def _apart(ax: Any, labels: list[tuple[Any, Callable[[float], tuple[float, float]]]]) -> None:
    """Move each edge label along its edge to the first place of :data:`LABEL_AT` where it overlaps no node and no
    label placed before it (edges into one node meet there, and their labels at one share of the way would pile up);
    where every place is taken, to the place where it overlaps least. Measured once on the figure as laid out here
    (each label's size, then every place's box in display units): a figure drawn into a caller's axes and laid out
    again later keeps these places."""
    if not labels:
        return
    import numpy as np
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.patches import FancyBboxPatch

    fig = ax.figure
    renderer = RendererAgg(fig.bbox.width, fig.bbox.height, fig.dpi)
    boxes = [p.get_window_extent(renderer) for p in ax.patches if isinstance(p, FancyBboxPatch)]
    taken = np.array([[b.x0, b.y0, b.x1, b.y1] for b in boxes], dtype=float).reshape(-1, 4)
    shares = np.array(LABEL_AT)
    for text, on in labels:
        size = text.get_window_extent(renderer)
        half = np.array([size.width * 1.15, size.height * 1.3]) / 2
        centres = ax.transData.transform(np.array([on(s) for s in shares]))  # (places, 2), display units
        places = np.hstack([centres - half, centres + half])  # (places, 4): x0, y0, x1, y1
        dx = np.minimum(places[:, None, 2], taken[None, :, 2]) - np.maximum(places[:, None, 0], taken[None, :, 0])
        dy = np.minimum(places[:, None, 3], taken[None, :, 3]) - np.maximum(places[:, None, 1], taken[None, :, 1])
        crowded = (np.clip(dx, 0, None) * np.clip(dy, 0, None)).sum(1)  # (places,): the area shared with what is placed
        free = np.flatnonzero(crowded == 0)
        best = int(free[0]) if len(free) else int(crowded.argmin())
        text.set_position(on(float(shares[best])))
        taken = np.vstack([taken, places[best]])


def empty_note(circuit: Circuit) -> str:
    """What an empty circuit means: nothing passed its threshold (or there was no signal)."""
    s = circuit.settings
    if s.get("signal") is False:
        return f"empty: no signal ({s.get('message') or 'the corruption does not change the metric'})"
    scored = len(circuit.edge_effects) or len(circuit.node_effects)
    return (f"empty: none of the {scored} candidates passed |effect| >= {s.get('threshold', '?')}" if scored
            else "empty: no candidates were scored")


def fill_colour(effect: Optional[float], bound: float) -> str:
    """A light fill for a node: its effect's colour, stronger for a larger effect."""
    if effect is None or not math.isfinite(effect) or bound <= 0:
        return "#ffffff"
    share = 0.15 + 0.45 * min(abs(effect) / bound, 1.0)
    base = (178, 24, 43) if effect > 0 else (33, 102, 172)
    r, g, b = (round(255 - share * (255 - c)) for c in base)
    return f"#{r:02x}{g:02x}{b:02x}"


def to_svg(circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "") -> str:
    """The figure as SVG text, text kept as text and every node and edge a ``<g id=...>``."""
    import matplotlib.pyplot as plt

    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "p0circuit"}):
        buf = io.StringIO()
        draw(circuit, truth, title).savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


_SCRIPT = """
(function(){
  var box = document.getElementById("%(uid)s"), svg = box.querySelector("svg"), tip = box.querySelector(".tip");
  var data = JSON.parse(box.querySelector("script[type='application/json']").textContent);
  var vb = svg.viewBox.baseVal, start = null;
  svg.style.cursor = "grab";
  function item(el){ while (el && el !== svg){ if (el.id && /^(node|edge):/.test(el.id)) return el; el = el.parentNode; } return null; }
  svg.addEventListener("wheel", function(e){ e.preventDefault(); var k = e.deltaY > 0 ? 1.1 : 0.9;
    var r = svg.getBoundingClientRect(), fx = (e.clientX - r.left) / r.width, fy = (e.clientY - r.top) / r.height;
    var w = vb.width * k, h = vb.height * k; vb.x += (vb.width - w) * fx; vb.y += (vb.height - h) * fy; vb.width = w; vb.height = h; });
  svg.addEventListener("mousedown", function(e){ start = [e.clientX, e.clientY, vb.x, vb.y]; svg.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", function(){ start = null; svg.style.cursor = "grab"; });
  svg.addEventListener("mousemove", function(e){
    if (start){ var r = svg.getBoundingClientRect(); vb.x = start[2] - (e.clientX - start[0]) * vb.width / r.width;
      vb.y = start[3] - (e.clientY - start[1]) * vb.height / r.height; return; }
    var el = item(e.target); if (!el){ tip.style.display = "none"; return; }
    var info = data.items[el.id] || {}; tip.textContent = el.id.slice(5) + (info.effect === null || info.effect === undefined ? "" :
      "  effect " + (info.effect >= 0 ? "+" : "") + info.effect.toFixed(3)) + (info.status ? "  (" + info.status + ")" : "");
    var b = box.getBoundingClientRect(); tip.style.left = (e.clientX - b.left + 12) + "px"; tip.style.top = (e.clientY - b.top + 12) + "px";
    tip.style.display = "block"; });
  svg.addEventListener("click", function(e){
    var el = item(e.target), keep = null;
    if (el && el.id.indexOf("node:") === 0){
      var name = el.id.slice(5); keep = {}; keep["node:" + name] = 1;
      [["src", "dst"], ["dst", "src"]].forEach(function(way){ var todo = [name], seen = {}; seen[name] = 1;
        while (todo.length){ var n = todo.pop(); data.links.forEach(function(l){ if (l[way[0]] === n){ keep["edge:" + l.name] = 1;
          keep["node:" + l[way[1]]] = 1; if (!seen[l[way[1]]]){ seen[l[way[1]]] = 1; todo.push(l[way[1]]); } } }); } });
    }
    box.querySelectorAll("[id^='node:'],[id^='edge:']").forEach(function(g){ g.style.opacity = !keep || keep[g.id] ? 1 : 0.12; });
    box.setAttribute("data-highlight", el && keep ? el.id.slice(5) : "");
  });
})();
"""


@entry_point
def to_html(circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "") -> str:
    """A self-contained ``<div>``: the SVG figure with a script for pan (drag), zoom (wheel), hover
    (the effect) and click (highlight every path through a node; click the background to reset).
    Nothing is loaded from the network."""
    lay = layout(circuit, truth, title)
    uid = "p0c-" + uuid.uuid4().hex[:10]
    items = {f"node:{p.name}": {"effect": p.effect, "status": p.status} for p in lay.nodes}
    items.update({f"edge:{l.name}": {"effect": l.effect, "status": l.status} for l in lay.links})
    data = {"items": items, "links": [{"name": l.name, "src": l.src, "dst": l.dst} for l in lay.links]}
    payload = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return (f'<div class="p0-circuit" id="{uid}" style="position:relative;max-width:100%;overflow:hidden">'
            f'{to_svg(circuit, truth, title)}'
            '<div class="tip" style="display:none;position:absolute;pointer-events:none;background:#fff;border:1px solid '
            '#999;padding:2px 5px;font:12px sans-serif;white-space:nowrap"></div>'
            f'<script type="application/json">{payload}</script><script>{_SCRIPT % {"uid": uid}}</script></div>')


class CircuitFigure:
    """A circuit figure: shown interactively in Jupyter; ``.figure`` (matplotlib), ``.svg()``,
    ``.html()`` and ``.save(path)`` (``.png``, ``.svg`` or ``.html`` by the suffix)."""

    def __init__(self, circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "") -> None:
        circuit = as_circuit(circuit, "CircuitFigure")
        truth = None if truth is None else as_circuit(truth, "CircuitFigure", "truth")
        layout(circuit, truth, title)  # bad input fails here, not at display time
        self.circuit, self.truth, self.title = circuit, truth, title

    @property
    def figure(self) -> Any:
        """A new matplotlib figure of the circuit."""
        return draw(self.circuit, self.truth, self.title)

    def svg(self) -> str:
        return to_svg(self.circuit, self.truth, self.title)

    def html(self) -> str:
        return to_html(self.circuit, self.truth, self.title)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """The interactive figure, with a PNG beside it: JupyterLab shows the PNG for outputs stored
        in a notebook it does not trust yet (it runs no stored script) and the interactive one once
        the cell has run."""
        import base64

        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=100)
        return {"text/html": self.html(), "image/png": base64.b64encode(buf.getvalue()).decode(),
                "text/plain": repr(self)}

    def __repr__(self) -> str:
        return (f"CircuitFigure({len(self.circuit.nodes)} nodes, {len(self.circuit.edges)} edges"
                + (", truth overlaid" if self.truth is not None else "") + ")")

    def save(self, path: Union[str, Path]) -> Path:
        """Write the figure; the suffix chooses the form: ``.png``, ``.svg`` or ``.html``."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".png", ".svg", ".html"):
            raise BadInputError(f"save a circuit figure as .png, .svg or .html, not {path.name!r}")
        if suffix == ".png":
            self.figure.savefig(str(path), dpi=110)
        else:
            text = self.svg() if suffix == ".svg" else (
                "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html.escape(self.title or "circuit")
                + "</title></head><body>" + self.html() + "</body></html>")
            path.write_text(text, encoding="utf-8")
        return path


@entry_point
def circuit_figure(circuit: AnyCircuit, truth: Optional[AnyCircuit] = None, title: str = "") -> CircuitFigure:
    """The figure of ``circuit`` (with ``truth`` overlaid when given): displays interactively in a
    notebook cell; ``.save("circuit.png")`` for a static file. Either may be any circuit the package returns
    (a search's Circuit, or a PatchResult, drawn as its ``.to_circuit()``)."""
    return CircuitFigure(circuit, truth, title)
