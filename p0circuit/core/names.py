"""The names the layers share, defined once: the built-in corruption and patching-method names, the position
modes of a node search, and the attribute a planted model carries its sink heads in. The classes and
registrations that implement the corruptions and methods take their name from here
(``patching/corruptions.py``, ``patching/methods/``), and the command line offers them from here before torch
is imported (:mod:`p0circuit.core.choices`)."""

SHIFT, POS_MEAN, SWAP, RESAMPLE, ZERO, COPIES = "shift", "pos_mean", "swap", "resample", "zero", "copies"
CORRUPTIONS = tuple(sorted((SHIFT, POS_MEAN, SWAP, RESAMPLE, ZERO, COPIES)))
"""The built-in corruptions (``p0circuit.CORRUPTIONS`` holds them and any plugin's)."""

ACTIVATION, PATH, ATTRIBUTION, ATTRIBUTION_EDGES, TRIAGE = (
    "activation", "path", "attribution", "attribution_edges", "triage")
METHODS = tuple(sorted((ACTIVATION, PATH, ATTRIBUTION, ATTRIBUTION_EDGES, TRIAGE)))
"""The built-in patching methods (``p0circuit.METHODS`` holds them and any plugin's)."""

POSITIONS = ("split", "each")
"""How a node search treats positions: ``"split"`` (P0 and the rest, the default) or ``"each"`` (every position
its own node, as TransformerLens' patching functions return them); ``patching/sites.py:position_candidates``
expands them, for ``activation_patch(positions=...)`` and ``discover --positions``."""

SINK_HEADS_ATTR = "p0circuit_sink_heads"
"""The attribute of a planted ``HookedTransformer`` that holds its sink heads, ``((layer, head), ...)``: the
planted model's builder sets it (``models/planted/build.py``) and the metric entry ``sink_heads`` reads it
(``patching/metrics.py``), from Python, the command line and sweeps alike, without patching knowing the plant."""
