"""Execute every notebook here in place, storing its outputs (plots included) so that they show
where people browse the repository: ``python notebooks/execute.py [NAME ...]``.

The test suite executes them again (tests/test_notebooks.py), so the stored outputs cannot rot
unnoticed.
"""

import sys
import tempfile
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
        with tempfile.TemporaryDirectory() as work:  # files the notebook writes stay out of the repo
            NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
        nbformat.write(nb, path)
        print(f"executed {path.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
