"""Example counts of property tests: small and fixed in the default run, large in
``nox -s fuzz`` (see ``tests/conftest.py``)."""

from __future__ import annotations

import os

FUZZ = os.environ.get("VGPUD_HYPOTHESIS") == "fuzz"


def examples(default: int, fuzz: int) -> int:
    """``default`` examples in the default (derandomized) run, ``fuzz`` in the fuzz run."""
    return fuzz if FUZZ else default
