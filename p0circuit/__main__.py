"""``python -m p0circuit``: the command line."""

import sys

from p0circuit.surfaces.cli import main

sys.exit(main())
