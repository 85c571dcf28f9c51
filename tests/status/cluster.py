"""A small cluster for the status page's end-to-end tests: the API stand-in, a real
``vgpud scheduler`` with a separate ops port (``--metrics-listen``), and pods placed
through the e2e driver (kube-scheduler's side of the extender protocol).

Nodes: ``gpu-node-1`` (2 x V100 32 GiB), ``gpu-node-2`` (4 x A100 80 GiB) and
``gpu-node-3`` (2 x L4, the second unhealthy). Pods: four placed by filter /
prioritize / bind (:data:`PLACED`), one that fits nowhere (``team-c/too-big``: pending,
with the scheduler's reason), and one created already bound whose name is markup
(:data:`EVIL`: must show as text).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from tests.builders import gpu_node, gpu_pod
from tests.e2e.cluster import Driver, Scheduler, free_port, standin
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES, encode_assignment, encode_node_devices
from vgpud.core.model import ContainerGrant, DeviceGrant, Gpu, NodeInventory, Placement

EVIL = "<script>alert('pwned')</script>"
NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
PLACED = {  # name: (namespace, limits, annotations)
    "train-1": ("team-a", {"nvidia.com/vgpu-number": 2, "nvidia.com/vgpu-memory": 8000,
                           "nvidia.com/vgpu-cores": 30}, {}),
    "train-2": ("team-a", {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 12000,
                           "nvidia.com/vgpu-cores": 50}, {}),
    "infer-1": ("team-b", {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 4000,
                           "nvidia.com/vgpu-cores": 20}, {"nvidia.com/vgpu-priority": "1"}),
    "notebook": ("team-b", {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 2000}, {}),
}
TOO_BIG = ("team-c", "too-big", {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 99999})


def nodes() -> list[dict[str, Any]]:
    l4 = NodeInventory((Gpu("GPU-gpu-node-3-0", 0, "NVIDIA L4", 23034, 4),
                        Gpu("GPU-gpu-node-3-1", 1, "NVIDIA L4", 23034, 4, healthy=False)),
                       1.0, 1.0)
    return [gpu_node("gpu-node-1", 2, 32768),
            gpu_node("gpu-node-2", 4, 81920, model="NVIDIA A100-SXM4-80GB"),
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": "gpu-node-3",
                          "annotations": {NODE_DEVICES: encode_node_devices(l4)}}}]


def evil_pod() -> dict[str, Any]:
    p = gpu_pod(EVIL, {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 1000})
    a = Placement("gpu-node-3", (ContainerGrant("main", False, (
        DeviceGrant("GPU-gpu-node-3-0", 1000, 0),)),), time="2026-11-21T00:00:00Z")
    p["metadata"]["annotations"][ASSIGNMENT] = encode_assignment(a)
    p["spec"]["nodeName"] = "gpu-node-3"
    p["status"] = {"phase": "Running"}
    return p


@dataclass
class Placed:
    api: str
    sched: Scheduler


async def place(api: str, sched: Scheduler) -> None:
    """Create the nodes and pods, schedule them, and wait until the scheduler holds
    every bound pod as confirmed."""
    async with aiohttp.ClientSession() as s:
        d = Driver(s, api, sched.url)
        await d._post(f"{api}/_standin/objects", {"items": nodes()})
        await sched.wait_ready()
        pods = [gpu_pod(n, lim, namespace=ns, annotations=ann)
                for n, (ns, lim, ann) in PLACED.items()]
        big = gpu_pod(TOO_BIG[1], TOO_BIG[2], namespace=TOO_BIG[0])
        await d.create([*pods, big, evil_pod()])
        for p in pods:
            got = await d.schedule(p, NODES)
            assert got.node is not None, got
        got = await d.schedule(big, NODES)
        assert got.node is None and "99999" in got.reason, got
        with anyio.fail_after(30):
            while True:
                async with s.get(f"{sched.ops_url}/api/v1/pods?state=confirmed") as r:
                    if r.status == 200 and (await r.json())["total"] == len(PLACED) + 1:
                        return
                await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def placed_cluster(tmp: Path) -> AsyncIterator[Placed]:
    with standin(tmp) as (api, kubeconfig):
        sched = Scheduler(kubeconfig, tmp, ops_port=free_port())
        sched.start()
        try:
            await place(api, sched)
            yield Placed(api, sched)
        finally:
            sched.stop()


@contextlib.contextmanager
def placed_cluster_sync(tmp: Path) -> Iterator[Placed]:
    """The same, for synchronous fixtures (the browser tests)."""
    with standin(tmp) as (api, kubeconfig):
        sched = Scheduler(kubeconfig, tmp, ops_port=free_port())
        sched.start()
        try:
            anyio.run(place, api, sched)
            yield Placed(api, sched)
        finally:
            sched.stop()
