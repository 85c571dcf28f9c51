"""Settings shared by every test.

Property tests (hypothesis) are deterministic in the default run: the ``ci`` profile
derandomizes them (a fixed seed derived from each test) and keeps no example database,
so the README's test command gives the same answer on every machine, every time.
Random exploration runs elsewhere: ``nox -s fuzz`` sets ``VGPUD_HYPOTHESIS=fuzz``,
which loads the ``fuzz`` profile (random seeds, an example database under
``.hypothesis/``) and multiplies the example counts (:func:`tests.fuzz.examples`).
Every example a fuzz run finds is kept as an ``@example`` or a regression test.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True)
settings.register_profile("fuzz", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("VGPUD_HYPOTHESIS", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``nox -s fuzz`` selects ``-m property``: a hypothesis test without the mark
    would never be explored with random seeds."""
    for item in items:
        if (getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
                and item.get_closest_marker("property") is None):
            raise pytest.UsageError(f"{item.nodeid}: mark hypothesis tests with "
                                    "@pytest.mark.property (nox -s fuzz runs them)")
