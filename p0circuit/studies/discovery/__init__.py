"""Discovery: :func:`discover` (``discover.py``: tokens to a ``Circuit`` with any method),
a whole discovery as the CLI and sweeps run it (``session.py``: sink report, circuits, scores against
a truth, figures), and the tracker's locator (``locate.py``).

May import: p0circuit.core, p0circuit.models, p0circuit.measures, p0circuit.patching, p0circuit.figures.
"""
