"""The ResourceSlice publisher's rounds over an in-memory API (the real kube-apiserver
takes its slices in tests/realkube/test_dra_scheduling.py): it writes only while the plugin
is registered, follows the inventory, and starts a round again when someone else wrote
between its read and its write."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest

from tests.kube.waiting import eventually
from vgpud.core.dra import DRIVER
from vgpud.core.model import Gpu
from vgpud.dra.publisher import RESOURCESLICES, run_publisher
from vgpud.kube.errors import Conflict, NotFound
from vgpud.node.devices import DeviceInfo, HealthEvent, NodeDevices

pytestmark = pytest.mark.anyio


class SliceApi:
    """The calls the publisher makes, answered as kube-apiserver does: a Node to read,
    ResourceSlices listed by field selector, created, replaced with a resourceVersion
    precondition (409 when stale), deleted."""

    def __init__(self, node: str) -> None:
        self.node = {"metadata": {"name": node, "uid": "node-uid"}}
        self.slices: dict[str, dict[str, Any]] = {}
        self.versions = itertools.count(1)
        self.calls: list[str] = []
        self.stale_puts = 0  # the next PUTs answer 409, as after another writer's update

    async def request(self, method: str, path: str, *, query: Any = None, body: Any = None,
                      content_type: str | None = None) -> dict[str, Any]:
        self.calls.append(f"{method} {path}")
        if path == f"/api/v1/nodes/{self.node['metadata']['name']}":
            return self.node
        name = path.removeprefix(RESOURCESLICES.collection_path()).strip("/")
        if method == "GET":
            want = dict(kv.split("=") for kv in query["fieldSelector"].split(","))
            return {"items": [s for s in self.slices.values()
                              if s["spec"]["nodeName"] == want["spec.nodeName"]
                              and s["spec"]["driver"] == want["spec.driver"]]}
        if method == "DELETE":
            if name not in self.slices:
                raise NotFound(404, "NotFound", f"{name} not found")
            del self.slices[name]
            return {}
        obj = dict(body, metadata=dict(body["metadata"]))
        if method == "PUT" and (self.stale_puts or obj["metadata"].get(
                "resourceVersion") != self.slices[name]["metadata"]["resourceVersion"]):
            self.stale_puts = max(0, self.stale_puts - 1)
            raise Conflict(409, "Conflict", "the object has been modified")
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        self.slices[obj["metadata"]["name"]] = obj
        return obj


def _devices(n: int = 2) -> NodeDevices:
    return NodeDevices(tuple(DeviceInfo(Gpu(f"GPU-{i}", i, "T4", 16384), minor=i)
                             for i in range(n)), split=10, memory_scaling=1.0, core_scaling=1.0)


def _generation(api: SliceApi) -> int:
    (s,) = api.slices.values()
    return int(s["spec"]["pool"]["generation"])


async def test_it_writes_nothing_until_registered_then_follows_the_inventory() -> None:
    api, devices = SliceApi("n1"), _devices()
    registered = False
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_publisher(api, "n1", devices,  # type: ignore[arg-type]
                                            registered=lambda: registered, recheck=0.05))
        await anyio.sleep(0.2)
        assert api.calls == []  # a plugin the kubelet does not know lets the wipe stand
        registered = True
        await eventually(lambda: bool(api.slices), what="the slice")
        (s,) = api.slices.values()
        assert s["spec"]["pool"]["generation"] == 1 and s["spec"]["driver"] == DRIVER
        assert s["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
        devices.apply(HealthEvent("GPU-1", False, "XID 79"))
        await eventually(lambda: _generation(api) == 2, what="generation 2")
        (s,) = api.slices.values()
        assert "taints" in s["spec"]["devices"][1]
        tg.cancel_scope.cancel()


async def test_a_conflict_starts_the_round_again_and_a_wiped_slice_comes_back() -> None:
    api, devices = SliceApi("n1"), _devices()
    async with anyio.create_task_group() as tg:
        pub = await tg.start(lambda task_status: run_publisher(
            api, "n1", devices, recheck=0.05, task_status=task_status))  # type: ignore[arg-type]
        assert pub.writes == 1
        api.stale_puts = 1
        devices.apply(HealthEvent("GPU-0", False, "XID 79"))
        await eventually(lambda: _generation(api) == 2, what="generation 2")
        assert sum(c.startswith("PUT") for c in api.calls) == 2  # one refused, one written
        api.slices.clear()  # the kubelet's wipe, or someone's delete
        await eventually(lambda: bool(api.slices), what="the slice again")  # next recheck
        tg.cancel_scope.cancel()
