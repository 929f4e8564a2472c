"""Layer 5, figures: they draw what the layers below compute, in one colour convention. Its files:
``colours.py`` (the colours of an effect's sign, shared by every figure), ``drawing.py`` (circuit figures:
static for a paper, interactive for a notebook or a report: :func:`~p0circuit.figures.drawing.circuit_figure`),
``graphs.py`` (a circuit exported to networkx, DOT or SVG through Graphviz; pruning, comparing and scoring a
circuit live beside its type, in :mod:`p0circuit.core.circuits`), ``plotting.py`` (:func:`plot`'s heatmaps and
the matplotlib helpers the experiments, tracker and sweep report share) and ``viz.py`` (attention views with
circuitsvis, offline).

May import: p0circuit.core, p0circuit.models, p0circuit.measures, p0circuit.patching.
"""
