"""The defaults every layer shares, defined once. Function signatures, dataclass fields and the
command line's options name these constants, so changing one here changes every entry point."""

SINK_EPS = 0.3
"""alpha_k above which a head counts as sinking to position k (Sink_k^eps; Gu et al. 2025 use 0.3)."""

NORM_THRESHOLD = 5.0
"""A position's residual norm over its prompt's median at which it counts as a sink state (a P0
norm onset when the position is 0)."""

MASSIVE_RATIO = 100.0
"""A residual dimension this many times its median magnitude is a massive activation (Sun et al. 2024)."""

DIRECTION_COS = 0.9
"""Cosine at which the P0 state's direction counts as fixed across prompts (their mean pairwise cosine) and stable
across layers (each layer's mean direction against the onset's), in the verdict's part (d)."""

CIRCUIT_THRESHOLD = 0.1
"""|normalized effect| at which a discovered circuit (``discover``, the CLI, sweeps, ``analyze``) keeps
a node or edge."""

LOCATE_THRESHOLD = 0.3
"""|normalized effect| at which the tracker's locator keeps a node (it asks for a clearer signal,
one per checkpoint of a series)."""

NODE_BUDGET = 5000
"""Candidate nodes that can reach the metric above which a discovery is refused (narrow them)."""

EDGE_BUDGET = 5000
"""Candidate edges above which path patching's senders come from an activation pass."""


def sink_rate_label(eps: float = SINK_EPS) -> str:
    """The name of the sink rate at threshold ``eps``, as the literature writes it: ``Sink_0^0.3``
    (share of (layer, head) pairs whose mean attention to position 0 exceeds ``eps``; Gu et al., 2025)."""
    return f"Sink_0^{eps:g}"

KEEPS = 0.5
"""Kept share (of a sink state's excess norm, or of the excess attention a sink receives) at which an edit counts as
keeping the state: the line of the keyed-on test and of what the sink reads."""

ALPHA_LINE = 0.5
"""alpha_0 of the strongest head, from the onset on, above which position 0 counts as a sink in the verdict's part (a)."""

DIRECTION_MARGIN = 0.5
"""Share of what the ordinary positions' cosine across prompts lacks of 1 that h_0's must exceed it by, for its
direction to count as fixed in the verdict's part (d) (where ordinary states already agree, the cosine line alone
cannot tell the sink state from any other)."""
