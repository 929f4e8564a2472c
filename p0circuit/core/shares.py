"""A share of a change, in words: faithfulness, denoising, an effect, a kept share of a sink state's excess norm.
Each is a fraction of one clean-to-corrupted change, and a value above 1 has one meaning, said once here."""

from typing import Optional

OVERSHOOT = ("a share above 1 is an overshoot: kept alone (or restored alone), the circuit moves the metric past its "
             "clean value, as when a component that works against the sink is left out; an edit that keeps more than "
             "the whole of a sink state's excess norm makes the state larger")
"""What a share above 1 means, said once wherever shares are printed (:func:`share` marks them)."""


def share(x: Optional[float], digits: int = 2) -> str:
    """A share, marked ``(overshoot)`` above 1 (:data:`OVERSHOOT`); ``n/a`` for None."""
    if x is None:
        return "n/a"
    return f"{x:.{digits}f}" + (" (overshoot)" if x > 1.005 else "")
