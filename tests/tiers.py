"""The suite's tiers (docs/contributing.md, "The suite"): ``P0_FAST=1`` selects the fast tier for the
inner loop. Markers (``tests/conftest.py``) leave out what loads a real model, runs a notebook, spawns
processes or runs whole commands and the report (``surfaces``); the modules that run one model per
family run :func:`family_configs.feature_cover` instead of every family."""

import os

FAST = os.environ.get("P0_FAST") == "1"
"""The fast tier is selected."""
