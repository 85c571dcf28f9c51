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

Least privilege, proven: every test that ran with the control plane fails if the API
server's audit log shows a request from one of vgpud's ServiceAccounts (or kube-scheduler,
which runs with the scheduler's) refused with 403 while it ran
(``_no_role_was_refused``).
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


VGPUD_USERS = "system:serviceaccount:kube-system:vgpud-"


def refused(events: list[dict[str, object]]) -> list[str]:
    """The requests of vgpud's ServiceAccounts that RBAC refused (403), as lines."""
    out = []
    for e in events:
        user = str((e.get("user") or {}).get("username", ""))  # type: ignore[union-attr]
        code = (e.get("responseStatus") or {}).get("code")  # type: ignore[union-attr]
        if user.startswith(VGPUD_USERS) and code == 403:
            out.append(f"{user}: {e.get('verb')} {e.get('requestURI')} -> 403")
    return out


@pytest.fixture(autouse=True)
def _no_role_was_refused(request: pytest.FixtureRequest) -> Iterator[None]:
    if "control_plane" not in request.fixturenames:
        yield
        return
    cp: ControlPlane = request.getfixturevalue("control_plane")
    _, start = cp.audit()
    yield
    events, _ = cp.audit(max(start, cp.audit_checked))
    denied = refused(events)
    assert not denied, "a vgpud role was refused by its RBAC:\n" + "\n".join(denied)


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
