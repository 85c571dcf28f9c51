"""Fixtures of the real-component tests.

- ``components`` (session): the directory of the six executables (``build.py``; the
  build itself runs once before the first test, see ``tests/conftest.py``). Where they
  cannot be built (no Go) the tests skip with the reason, or fail with it when
  ``VGPUD_REALKUBE_REQUIRED=1``.
- ``control_plane`` (session): etcd and kube-apiserver (:class:`ControlPlane`).
- ``release`` (module): vgpud installed from the rendered chart, its webhook, extender and
  kube-scheduler running; a module sets ``chart_values`` (a tuple of ``--set`` values) to
  render it otherwise.
- ``scenario`` (function): the test's namespace and nodes, removed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.debian import unavailable
from tests.realkube import build
from tests.realkube.cluster import Scenario
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import Release, lease_released

REQUIRED = "VGPUD_REALKUBE_REQUIRED"


@pytest.fixture(scope="session")
def components() -> Path:
    try:
        return build.ensure()
    except build.Unavailable as e:
        unavailable("real Kubernetes components", REQUIRED, e)


@pytest.fixture(scope="session")
def control_plane(components: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[ControlPlane]:
    cp = ControlPlane(components, tmp_path_factory.mktemp("controlplane"))
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def chart_values() -> tuple[str, ...]:
    return ()


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, chart_values: tuple[str, ...],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    rel = Release(control_plane, tmp_path_factory.mktemp("release"), chart_values)
    try:
        rel.start()
        yield rel
    finally:
        rel.uninstall()
        lease_released(control_plane, "vgpu-scheduler")


@pytest.fixture
def scenario(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    name = request.node.name.removeprefix("test_").replace("_", "-").lower()
    s = Scenario(control_plane, name)
    try:
        yield s
    finally:
        s.close()
