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
from collections.abc import Iterator
from pathlib import Path

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the real Kubernetes components before the first test when a selected test
    needs them: a cold build takes minutes, more than one test's timeout, and its progress
    should show. A failure is kept for the fixture (tests/realkube/conftest.py) to report
    as a skip (no Go) or an error (a failed build)."""
    if not any("realkube" in item.nodeid.split("::")[0].split("/") for item in session.items):
        return
    from tests.realkube import build

    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            build.ensure()
        except (build.Unavailable, RuntimeError):
            pass


_HOST_PATHS = (Path("/usr/local/vgpud"), Path("/var/lib/vgpud"))  # the plugin's defaults


@pytest.fixture(autouse=True)
def _tests_write_only_their_temporary_directories() -> Iterator[None]:
    """No test may write to the host paths a deployed plugin uses (issue 9)."""
    before = {p: p.exists() for p in _HOST_PATHS}
    yield
    created = [str(p) for p in _HOST_PATHS if p.exists() and not before[p]]
    assert not created, f"this test wrote outside its temporary directories: {created}"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Every async test and fixture runs on asyncio (the product's event loop); session
    scope so module-scoped async fixtures may use it too."""
    return "asyncio"
