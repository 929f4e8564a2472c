"""Execute every notebook here in place, storing its outputs (plots included) so that they show
where people browse the repository: ``python notebooks/execute.py [NAME ...]``.

The test suite executes them again (tests/test_notebooks.py), so the stored outputs cannot rot
unnoticed.
"""

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent


def main(names: list[str]) -> None:
    paths = [HERE / n for n in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        _, nb = nbformat.validator.normalize(nb)  # cell ids, as current nbformat wants them
        nb = nbformat.from_dict(nb)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:  # files the notebook writes stay out of the repo
            NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
        seconds = time.perf_counter() - start
        stamp_time(nb, seconds)
        nbformat.write(nb, path)
        print(f"executed {path.name} in {seconds:.0f} s")


STAMP = re.compile(r"\n*_Run time: .*_$")


def stamp_time(nb: nbformat.NotebookNode, seconds: float) -> None:
    """Say in the first cell how long the whole notebook took when its outputs were stored (kernel
    start included), so that no notebook claims a speed it does not have."""
    cell = nb.cells[0]
    text = STAMP.sub("", cell.source.rstrip())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cell.source = (f"{text}\n\n_Run time: {seconds:.0f} s for the whole notebook on {cores} CPU cores when these "
                   f"outputs were stored ({time.strftime('%Y-%m-%d')}); nothing is downloaded._")


if __name__ == "__main__":
    main(sys.argv[1:])
