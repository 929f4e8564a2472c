"""Layer 6, studies: whole investigations built from the layers below: discovery (one call to a
``Circuit``; a whole discovery with its sink report and figures; the tracker's locator), the
analysis of the paper's questions and the atlas, the paper's experiments, training and tracking.

May import: p0circuit.core, p0circuit.models, p0circuit.measures, p0circuit.patching, p0circuit.figures.
"""
