"""Layer 1, the nouns and the ground rules: typed errors (each says the fix), argument checks
(``entry_point``), atomic writes, every TransformerLens hook name, ``Node``/``Edge``/``Circuit``,
model and metric entries (their grammar, no torch), the command line's choices, plugins, progress
bars and the defaults every layer shares (``defaults.py``).

May import: nothing of p0circuit outside this layer.
"""
