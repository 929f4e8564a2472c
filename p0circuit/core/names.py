"""The built-in corruption and patching-method names, defined once. The classes and registrations that
implement them take their name from here (``patching/corruptions.py``, ``patching/methods/``), and the
command line offers them from here before torch is imported (:mod:`p0circuit.core.choices`)."""

SHIFT, POS_MEAN, SWAP, RESAMPLE, ZERO, COPIES = "shift", "pos_mean", "swap", "resample", "zero", "copies"
CORRUPTIONS = tuple(sorted((SHIFT, POS_MEAN, SWAP, RESAMPLE, ZERO, COPIES)))
"""The built-in corruptions (``p0circuit.CORRUPTIONS`` holds them and any plugin's)."""

ACTIVATION, PATH, ATTRIBUTION, ATTRIBUTION_EDGES, TRIAGE = (
    "activation", "path", "attribution", "attribution_edges", "triage")
METHODS = tuple(sorted((ACTIVATION, PATH, ATTRIBUTION, ATTRIBUTION_EDGES, TRIAGE)))
"""The built-in patching methods (``p0circuit.METHODS`` holds them and any plugin's)."""
