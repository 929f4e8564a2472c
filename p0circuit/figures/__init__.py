"""Layer 5, figures: circuit graphs (prune, compare, exports), circuit figures (static and
interactive), heatmaps (:func:`plot`) and attention views, in one colour convention (``colours``).
They draw what the layers below compute.

May import: p0circuit.core, p0circuit.models, p0circuit.measures, p0circuit.patching.
"""
