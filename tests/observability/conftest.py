"""Fixtures of the observability tests.

- ``prometheus_tools`` (session): :class:`~tests.observability.prometheus.Tools`, the
  real ``prometheus`` and ``promtool`` (Debian's ``prometheus`` package, installed with
  apt-get when missing and we are root). Where they cannot be had the tests that need
  them are skipped with the reason, or fail with it when ``VGPUD_PROMETHEUS_REQUIRED=1``
  (for CI, where a skip would hide a broken setup).
"""

from __future__ import annotations

import pytest

from tests.debian import unavailable
from tests.observability.prometheus import PrometheusUnavailable, Tools, obtain_tools


@pytest.fixture(scope="session")
def prometheus_tools() -> Tools:
    try:
        return obtain_tools()
    except PrometheusUnavailable as e:
        unavailable("prometheus", "VGPUD_PROMETHEUS_REQUIRED", e)
