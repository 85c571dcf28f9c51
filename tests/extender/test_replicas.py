"""Two ``vgpud scheduler`` replicas with leader election, in this process, over the API
stand-in: both serve bind, only the Lease's holder reschedules, and when it stops the
other takes over.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from anyio.abc import TaskGroup

from tests.builders import node
from tests.e2e.cluster import free_port
from tests.kube.clocks import ManualClock
from tests.kube.waiting import eventually
from tests.scheduling.test_reschedule import ADMISSION, created
from tests.standin import ApiServer
from vgpud.config import parse_settings
from vgpud.core.codec import NODE_DEVICES, encode_node_devices
from vgpud.extender.run import run_scheduler

pytestmark = pytest.mark.anyio

LEASE = "vgpud-scheduler"
RETRY = 2.0  # the elector's default retry period, on the manual clock
GPU = {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1000"}


@dataclass
class Replica:
    name: str
    url: str
    scope: anyio.CancelScope

    async def post(self, session: aiohttp.ClientSession, verb: str,
                   body: dict[str, Any]) -> dict[str, Any]:
        async with session.post(f"{self.url}/{verb}", json=body) as r:
            assert r.status == 200, await r.text()
            doc: dict[str, Any] = await r.json()
            return doc

    async def deleted(self, session: aiohttp.ClientSession) -> float:
        """This replica's ``vgpud_scheduler_reschedules_total{action="deleted"}``."""
        async with session.get(f"{self.url}/metrics") as r:
            text = await r.text()
        m = re.search(r'^vgpud_scheduler_reschedules_total\{action="deleted"\} (\S+)$',
                      text, re.M)
        return float(m.group(1)) if m else 0.0


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer() as server:
        yield server


async def _start(tg: TaskGroup, api: ApiServer, kubeconfig: Path, clock: ManualClock,
                 session: aiohttp.ClientSession, name: str) -> Replica:
    port = free_port()
    scope = anyio.CancelScope()

    async def run() -> None:
        with scope:
            await run_scheduler(parse_settings({}), kubeconfig=str(kubeconfig),
                                listen=f"127.0.0.1:{port}", leader_elect=True,
                                lease_namespace="kube-system", identity=name,
                                lease_clock=clock)

    tg.start_soon(run)
    url = f"http://127.0.0.1:{port}"
    with anyio.fail_after(20):
        while True:
            try:
                async with session.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return Replica(name, url, scope)
            except aiohttp.ClientError:
                pass
            await anyio.sleep(0.02)


def _holder(api: ApiServer) -> str:
    try:
        holder: str = api.get("leases", LEASE, "kube-system")["spec"]["holderIdentity"]
    except Exception:  # not created yet
        return ""
    return holder


def _pending(api: ApiServer, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = api.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": GPU}}]},
        "status": {"phase": "Pending"}}, "default")
    return pod


def _refused(api: ApiServer, name: str) -> None:
    """A GPU pod bound to n1 that kubelet refused (Allocate failed), owned by a ReplicaSet."""
    pod = created(name, owner="ReplicaSet/web", status=ADMISSION)
    pod["spec"]["containers"] = [{"name": "main", "resources": {"limits": GPU}}]
    api.create("pods", pod)


def _gone(api: ApiServer, name: str) -> bool:
    return all(p["metadata"]["name"] != name for p in api.objects("pods"))


async def test_every_replica_binds_only_the_leader_reschedules(
        api: ApiServer, tmp_path: Path) -> None:
    n1 = node("n1", 2)
    api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "n1", "annotations": {NODE_DEVICES: encode_node_devices(n1.inventory)}}})
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    clock = ManualClock()
    async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
        a = await _start(tg, api, kubeconfig, clock, session, "a")
        b = await _start(tg, api, kubeconfig, clock, session, "b")
        await eventually(lambda: _holder(api) in ("a", "b"), what="a leader")
        leader, follower = (a, b) if _holder(api) == "a" else (b, a)

        # Every replica serves bind: kube-scheduler's Lease, not the extender's, picks
        # which replica's kube-scheduler asks its extender.
        for replica in (leader, follower):
            pod = _pending(api, f"fresh-{replica.name}")
            with anyio.fail_after(10):
                while True:  # the replica's pod informer must have seen the pod
                    got = await replica.post(session, "bind", {
                        "PodName": pod["metadata"]["name"], "PodNamespace": "default",
                        "PodUID": pod["metadata"]["uid"], "Node": "n1"})
                    if "not found" not in got.get("Error", ""):
                        break
                    await anyio.sleep(0.02)
            assert got.get("Error", "") == "", (replica.name, got)
            assert api.get("pods", f"fresh-{replica.name}")["spec"]["nodeName"] == "n1"

        # Exactly one replica, the leader, reschedules a refused pod.
        _refused(api, "r1")
        with anyio.fail_after(10):
            while not _gone(api, "r1"):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert await leader.deleted(session) == 1
        assert await follower.deleted(session) == 0
        assert api.count("delete", "pods") == 1

        # The leader stops (and releases the Lease); the other takes over at its next
        # poll and reschedules the next refused pod.
        leader.scope.cancel()
        await eventually(lambda: _holder(api) == "", what="the lease to be released")
        _refused(api, "r2")
        with anyio.fail_after(10):
            while _holder(api) != follower.name:
                clock.advance(RETRY)
                await anyio.sleep(0.02)
            while not _gone(api, "r2"):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert await follower.deleted(session) == 1
        assert api.count("delete", "pods") == 2
        tg.cancel_scope.cancel()
