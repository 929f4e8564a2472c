"""Write the figures the README and docs/guide.md show, from the README's quick look: ``python docs/figures/make.py``
(into docs/figures/; another directory as the first argument). ``tests/test_docs_figures.py`` draws them again and
fails when a stored one differs from what the code draws now: after a change to the figures, run this and commit."""

import sys
from pathlib import Path

import p0circuit as p0

HERE = Path(__file__).resolve().parent
FIGURES = ("planted_circuit.png", "planted_heatmap.png")
"""The files this script writes (each named in the README or docs/guide.md)."""


def make(out: Path) -> list[Path]:
    """Draw every figure of :data:`FIGURES` into ``out``: the planted model's circuit found by path patching with its
    ground truth overlaid, and every candidate node's effect (``positions="each"``) as a heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    pm = p0.build_planted()  # the README's quick look, as it reads
    tokens = p0.probe_tokens(pm.model, 32, 48, seed=0, regular=True)
    result = p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1", positions="each")
    heatmap = out / FIGURES[1]
    p0.plot(result).savefig(heatmap, dpi=90)
    circuit = p0.discover(pm.model, tokens, method="path", corruption="shift",
                          metric=p0.AttnToP0(heads=list(pm.sink_heads)))
    return [p0.circuit_figure(circuit, pm.truth).save(out / FIGURES[0]), heatmap]


if __name__ == "__main__":
    for path in make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
