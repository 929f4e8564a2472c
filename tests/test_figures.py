"""Circuit figures (issue 21): layer ranks from the embeddings up to the metric, sign as colour,
|effect| as width, the receiver's input on each edge, the truth overlaid; read off the DOT source,
the SVG's elements and the interactive page's data, and the heatmaps' arrays."""

import html
import json
import re

import numpy as np
import pytest

import p0circuit as p0
from p0circuit.figures import drawing as p0_drawing
from p0circuit import Circuit, Edge, Node
from p0circuit.figures.drawing import LOWERS, MISSED, RAISES, layout, rank_of, to_html, to_svg

EDGES = {"A0.H0@0->M0@0.mlp_in": 0.9, "M0@0->M1@0.mlp_in": 0.45, "M1@0->A2.H0@0.k": -0.3, "E@0->A1.H1@0.v": 0.02,
         "M1@0->A3.H0@0.k": 0.05}  # a truth edge scored below the threshold: missed
CIRCUIT = Circuit(nodes=(), edges=tuple(Edge.parse(n) for n in EDGES if abs(EDGES[n]) > 0.1), edge_effects=EDGES,
                  settings={"method": "path", "corruption": "shift", "metric": "sink_heads", "level": "edge"})
TRUTH = Circuit(nodes=(), edges=tuple(Edge.parse(n) for n in ("A0.H0@0->M0@0.mlp_in", "M0@0->M1@0.mlp_in",
                                                              "M1@0->A3.H0@0.k")))


def _dot_edges(dot):
    """{(src, dst): attributes} of the DOT source's visible edges."""
    out = {}
    for src, dst, attrs in re.findall(r'"?([\w.@]+)"? -> "?([\w.@]+)"? \[(.*)\]', dot):
        if not src.startswith("rank_"):  # the invisible chain that stacks the ranks
            out[(src, dst)] = dict(re.findall(r'(\w+)=("[^"]*"|[^ \]]+)', attrs))
    return {k: {a: v.strip('"') for a, v in d.items()} for k, d in out.items()}


def test_ranks_run_from_the_embeddings_to_the_metric():
    assert [rank_of(Node.parse(n)) for n in ("E@0", "A0.H0@0", "M0@0", "A1.H1@rest", "M1.N5@0")] == [0, 1, 2, 3, 4]
    lay = layout(CIRCUIT)
    assert [label for _, label in lay.ranks] == ["L0 attn", "L0 mlp", "L1 mlp", "L2 attn", "metric"]
    y = {p.name: p.y for p in lay.nodes}
    assert y["A0.H0@0"] < y["M0@0"] < y["M1@0"] < y["A2.H0@0"] < y["metric"]
    dot = p0.to_dot(CIRCUIT)
    ranks = re.findall(r"subgraph rank(\d+) \{\s*rank=same\s*rank_\d+ \[label=(\"[^\"]+\"|\w+)", dot)
    assert [label.strip('"') for _, label in ranks] == ["L0 attn", "L0 mlp", "L1 mlp", "L2 attn", "metric"]
    chain = re.findall(r"rank_(\d+) -> rank_(\d+) \[style=invis\]", dot)
    assert chain == [(str(i), str(i + 1)) for i in range(4)]  # the ranks are stacked in this order


def test_sign_is_colour_size_is_width_and_inputs_are_marked():
    edges = _dot_edges(p0.to_dot(CIRCUIT))
    up, down, small = edges[("A0.H0@0", "M0@0")], edges[("M1@0", "A2.H0@0")], edges[("M0@0", "M1@0")]
    assert up["color"] == RAISES and down["color"] == LOWERS
    assert float(up["penwidth"]) > float(small["penwidth"]) > float(down["penwidth"]) > 0.8
    assert up["label"] == "mlp +0.90" and down["label"] == "k -0.30" and down["arrowhead"] == "diamond"
    assert edges[("A2.H0@0", "metric")]["style"] == "dashed"  # the last receiver feeds the metric node
    assert ("E@0", "A1.H1@0") not in edges  # below the threshold: not in the circuit, not drawn
    svg = to_svg(CIRCUIT)
    for name in ("A0.H0@0->M0@0.mlp_in", "M1@0->A2.H0@0.k"):
        group = re.search(rf'<g id="edge:{re.escape(html.escape(name))}">(.*?)</g>', svg, re.S).group(1)
        colour = RAISES if EDGES[name] > 0 else LOWERS
        assert f"stroke: {colour}" in group, name
        assert f"stroke-width: {p0_drawing.width(EDGES[name], 0.9):g}" in group, name
    assert '<g id="node:metric">' in svg and ">k -0.30<" in svg  # text kept as text


def test_node_circuits_are_ranked_and_feed_the_metric():
    node_circuit = Circuit(nodes=(Node.parse("A0.H0@0"), Node.parse("M1@0")),
                           node_effects={"A0.H0@0": 0.6, "M1@0": -0.2, "M0@0": 0.01}, settings={"level": "node"})
    edges = _dot_edges(p0.to_dot(node_circuit))
    assert set(edges) == {("A0.H0@0", "metric"), ("M1@0", "metric")}
    assert edges[("A0.H0@0", "metric")]["color"] == RAISES and edges[("M1@0", "metric")]["color"] == LOWERS
    assert re.search(r'"A0.H0@0" \[label="A0.H0@0\\n\+0.60"', p0.to_dot(node_circuit))


def test_the_truth_is_overlaid():
    status = {p.name: p.status for p in layout(CIRCUIT, TRUTH).nodes}
    assert status["A0.H0@0"] == status["M1@0"] == "match"
    assert status["A2.H0@0"] == "extra" and status["A3.H0@0"] == "missed"
    links = {l.name: l.status for l in layout(CIRCUIT, TRUTH).links}
    assert links["M1@0->A3.H0@0.k"] == "missed" and links["M1@0->A2.H0@0.k"] == "extra"
    dot = p0.to_dot(CIRCUIT, truth=TRUTH)
    assert re.search(r'"A3.H0@0" \[[^\]]*color="' + MISSED + r'"[^\]]*dashed', dot)
    assert re.search(r'"A0.H0@0" \[[^\]]*penwidth=2.4', dot)
    assert _dot_edges(dot)[("M1@0", "A3.H0@0")]["style"] == "dashed"


def test_the_interactive_page_is_self_contained_and_carries_the_effects():
    page = to_html(CIRCUIT, TRUTH)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    data = json.loads(re.search(r'<script type="application/json">(.*?)</script>', page, re.S).group(1))
    assert data["items"]["edge:A0.H0@0->M0@0.mlp_in"] == {"effect": 0.9, "status": "match"}
    assert {"name": "M1@0->A3.H0@0.k", "src": "M1@0", "dst": "A3.H0@0"} in data["links"]
    for element in ("node:A0.H0@0", "edge:M0@0->M1@0.mlp_in", "node:A3.H0@0"):
        assert f'id="{html.escape(element)}"' in page, element  # what the script finds to hover and highlight
    assert "addEventListener(\"wheel\"" in page and "addEventListener(\"click\"" in page
    bundle = p0.circuit_figure(CIRCUIT)._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="p0-circuit"') and bundle["image/png"].startswith("iVBOR")
    assert bundle["text/plain"] == "CircuitFigure(4 nodes, 3 edges)"


def test_figures_save_by_suffix_and_bad_input_is_refused(tmp_path):
    fig = p0.circuit_figure(CIRCUIT, TRUTH)
    for suffix in ("png", "svg", "html"):
        path = fig.save(tmp_path / f"c.{suffix}")
        assert path.stat().st_size > 1000, suffix
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(p0.BadInputError, match=r"\.png, \.svg or \.html"):
        fig.save(tmp_path / "c.pdf")
    with pytest.raises(p0.BadInputError, match=r"circuit=\{'nodes': \[\]\} \(dict\) is not Circuit"):
        p0.circuit_figure({"nodes": []})


def test_heatmaps_of_a_circuit_and_of_its_result_agree(planted):
    tokens = p0.probe_tokens(planted.model, 8, 16, seed=0, regular=True)
    metric = p0.AttnToP0(heads=list(planted.sink_heads))
    result = p0.activation_patch(planted.model, tokens, corruption="shift", metric=metric, positions="each")
    from_result, from_circuit = p0.plot(result), p0.plot(result.to_circuit(0.1, method="activation"))
    for a, b in zip(from_result.axes, from_circuit.axes):
        if a.images:
            np.testing.assert_array_equal(a.images[0].get_array().filled(np.nan), b.images[0].get_array().filled(np.nan))
    heads = result.to_tensor("head").numpy()
    assert heads.shape == (planted.model.cfg.n_layers, 16, planted.model.cfg.n_heads)
    shown = from_result.axes[0].images[0].get_array().filled(np.nan)
    np.testing.assert_allclose(shown, np.nansum(heads, 1), equal_nan=True)
    with pytest.raises(p0.BadInputError, match=r"plot: result=\[1, 2\] \(list\) is not Circuit.*PatchResult.*\.to_circuit\(\)"):
        p0.plot([1, 2])


def test_edge_labels_sit_apart_and_off_the_nodes():
    """Issue 51 (the report's display faults): several edges into one head, two of them from each sender (its key and
    value inputs), are drawn as distinct curves whose labels overlap no other label and no node (measured on the
    rendered figure); the planted circuits' labels too."""
    import itertools

    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from p0circuit.core.entries import VARIANTS
    from p0circuit.core.types import Circuit, Edge, Node
    from p0circuit.figures.drawing import draw
    from p0circuit.models.planted import build_planted

    matplotlib.use("Agg")

    def laid_out(circuit):
        fig = draw(circuit)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.canvas.draw()
        ax = fig.axes[0]
        labels = [t.get_bbox_patch().get_window_extent(renderer) for t in ax.texts if t.get_bbox_patch() is not None]
        nodes = [p.get_window_extent(renderer) for p in ax.patches if isinstance(p, FancyBboxPatch)]
        curves = [tuple(map(tuple, p.get_path().vertices.round(3))) for p in ax.patches if isinstance(p, FancyArrowPatch)]
        return labels, nodes, curves

    senders = ("A0.H0@0", "M0@0", "M1@0")
    edges = [Edge.parse(f"{s}->A2.H0@0.{i}") for s in senders for i in ("k", "v")] + \
        [Edge.parse(f"{s}->M1@0.mlp_in") for s in ("A0.H0@0", "M0@0")]
    dense = Circuit(nodes=tuple(Node.parse(n) for n in (*senders, "A2.H0@0")), edges=tuple(edges),
                    edge_effects={e.name: 0.5 + 0.05 * i for i, e in enumerate(edges)})
    for circuit in [dense] + [build_planted(**VARIANTS[v]).truth for v in ("rope", "secondary")]:
        labels, nodes, curves = laid_out(circuit)
        assert len(labels) == (8 if circuit is dense else len(circuit.edges))  # one label per edge into an input
        assert len(set(curves)) == len(curves), "two edges drawn on one curve"
        assert not [(a, b) for a, b in itertools.combinations(labels, 2) if a.overlaps(b)], "labels overlap"
        assert not [a for a in labels for n in nodes if a.overlaps(n)], "a label sits on a node"
