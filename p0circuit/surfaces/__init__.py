"""Layer 7, surfaces: the ``p0circuit`` command line, scripted sweeps and the sweep report.
They parse, call one library function, and write.

May import: every layer.
"""
