"""SmolLM2-135M's P0 circuit, measured: ``p0circuit analyze --model real:smollm2 --max-onsets 2`` (the first
onset and the second amplification at block 11, and its edges: ``--max-edges 1024``, as the atlas runs it), with the run's ``analysis.md`` copied to
``docs/smollm2_circuit.md``. Needs ``pip install -e ".[real]"``; about 10 minutes on 2 CPU cores (713 s of steps on
2026-12-04 beside other work, 762 counted forwards, both BOS settings). ``--out DIR``
keeps the run elsewhere (default ``runs/atlas/real-smollm2``, the atlas' run: an interrupted or finished run is
read back there).
"""

import argparse
import shutil
import time
from pathlib import Path

from p0circuit.studies.analysis import analyze
from p0circuit.studies.analysis.atlas import EDGES, ONSETS

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "runs" / "atlas" / "real-smollm2"))
    args = ap.parse_args()
    start = time.perf_counter()
    result = analyze("real:smollm2", out=args.out, max_onsets=ONSETS, max_edges=EDGES)
    shutil.copyfile(Path(args.out) / "analysis.md", ROOT / "docs" / "smollm2_circuit.md")
    print(result)
    print(f"\n{time.perf_counter() - start:.0f} s; wrote docs/smollm2_circuit.md and {args.out}/")


if __name__ == "__main__":
    main()
