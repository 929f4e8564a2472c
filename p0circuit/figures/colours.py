"""The colours of every figure: one convention for the sign of an effect across discover, analyze,
the sweep report and the notebooks (red carries the clean-to-corrupted change, blue works against it)."""

RAISES, LOWERS, NEUTRAL, MISSED = "#b2182b", "#2166ac", "#555555", "#9a9a9a"
"""Line colours: positive effect, negative effect, no effect recorded, a truth item not found."""
EFFECT_CMAP = "RdBu_r"
"""The one colour map of effects in every figure (discover, analyze, the sweep report, notebooks): a
diverging map, centred on 0, red where a component carries the change, blue where it works against it,
as the circuit figures' red and blue (:func:`p0circuit.figures.drawing.colour`)."""
EFFECT_LABEL = "normalized effect (red: carries the change, blue: against it)"
"""The colour bar's label of :data:`EFFECT_CMAP`."""
