"""``python -m p0circuit``: the command line."""

import sys

from p0circuit.cli import main

sys.exit(main())
