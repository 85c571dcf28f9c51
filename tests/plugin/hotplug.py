"""GPUs that come and go, end to end: the plugin (API stand-in, fake kubelet) over a
*bus* that removes, adds and swaps GPUs. The same scenario runs over the fake-devices
file (:class:`FileBus`, ``tests/plugin/test_hotplug.py``) and over the fake NVML's
device events (``tests/node/test_nvml_scenarios.py``, in a child process), whose device
list is fixed at ``nvmlInit`` as the real NVML's is: the plugin finds an added GPU only by
initialising NVML again.

The scheduler is ``vgpud scheduler``'s own code (:func:`run_scheduler`, in this
process, over the same API stand-in), asked over HTTP as kube-scheduler asks it.

Removing a GPU while three pods use it: ListAndWatch marks its IDs unhealthy, then
drops them; each of the three pods gets a ``VgpuDeviceGone`` event; the node annotation
loses the GPU, so the scheduler's next filter does not offer it; the pod on another
GPU is undisturbed (healthy throughout, its limits file unchanged). Adding a GPU: it
is advertised, and the scheduler filters and binds a pod onto it from the next
inventory update. Swapping a board (a
new UUID at the old one's index): the old IDs go, the new ones come, and the new
board starts empty — nothing held on the old UUID is charged to it, and a pod
assigned to the old board that kubelet puts on the new one is re-assigned (room
checked), never run under the old assignment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio

from tests.e2e.cluster import free_port
from tests.fakekubelet import FakePod
from tests.plugin.harness import NODE, Harness, wait_for
from vgpud.core.codec import NODE_DEVICES, decode_assignment, decode_node_devices
from vgpud.core.model import ContainerGrant, DeviceGrant, NodeInventory, Placement
from vgpud.extender.run import run_scheduler
from vgpud.node.allocations import AllocationStore

# fast enough for a test: rediscover every 0.2 s, keep a gone GPU unhealthy for 0.6 s
SETTINGS: dict[str, Any] = {"plugin": {"rediscoverSeconds": 0.2, "goneLingerSeconds": 0.6}}


class Bus(Protocol):
    """Where the GPUs live; each call returns at once, the plugin notices on its own."""

    def present(self) -> list[str]: ...  # uuids in index order

    def remove(self, uuid: str) -> None: ...

    def add(self) -> None: ...

    def replace(self, uuid: str) -> None: ...


@dataclass
class FileBus:
    """GPUs of a fake-devices file: each change rewrites it."""

    path: Path
    devices: list[dict[str, Any]]
    spare: list[dict[str, Any]]

    @classmethod
    def of(cls, path: Path) -> FileBus:
        devices = json.loads(path.read_text())["devices"]
        spare = dict(devices[-1], uuid="GPU-fa4ecda0-0000-4000-8000-0000000000aa",
                     index=devices[-1]["index"] + 1)
        return cls(path, devices, [spare])

    def _write(self) -> None:
        self.path.write_text(json.dumps({"devices": self.devices}))

    def present(self) -> list[str]:
        return [d["uuid"] for d in self.devices]

    def remove(self, uuid: str) -> None:
        self.devices = [d for d in self.devices if d["uuid"] != uuid]
        self._write()

    def add(self) -> None:
        self.devices.append(self.spare.pop())
        self._write()

    def replace(self, uuid: str) -> None:
        self.devices = [dict(d, uuid=d["uuid"][:-4] + "beef") if d["uuid"] == uuid else d
                        for d in self.devices]
        self._write()


def _on(uuid: str, memory: int = 2000, cores: int = 20) -> Placement:
    return Placement(node=NODE, containers=(ContainerGrant("main", False, (
        DeviceGrant(uuid, memory, cores),)),), time="2026-01-01T00:00:00Z")


def _inventory(h: Harness) -> NodeInventory:
    """The node's published inventory (none yet: empty)."""
    ann = h.api.get("nodes", NODE, "")["metadata"].get("annotations") or {}
    return decode_node_devices(ann[NODE_DEVICES]) if NODE_DEVICES in ann else NodeInventory(())


def _config(h: Harness, ids: list[str]) -> str:
    return (AllocationStore(h.state_dir).path(ids) / "etc" / "config").read_text()


def _gone_events(h: Harness) -> dict[str, str]:
    return {e["involvedObject"]["name"]: e["message"] for e in h.api.objects("events")
            if e["reason"] == "VgpuDeviceGone"}


async def _changes(h: Harness) -> dict[str, float]:
    assert h.running is not None and h.running.metrics_port
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{h.running.metrics_port}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("vgpud_gpu_changes_total{"):
            change = line.split('change="')[1].split('"')[0]
            out[change] = float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class Scheduler:
    url: str
    session: aiohttp.ClientSession

    async def get(self, path: str) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}{path}") as r:
            assert r.status == 200, await r.text()
            items: list[dict[str, Any]] = (await r.json())["items"]
            return items

    async def verb(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.url}/{verb}", json=body) as r:
            assert r.status == 200, await r.text()
            doc: dict[str, Any] = await r.json()
            return doc


async def _scheduler(h: Harness, session: aiohttp.ClientSession) -> Scheduler:
    """``vgpud scheduler`` in this process, on the harness's API stand-in, ready."""
    kubeconfig = h.api.write_kubeconfig(h.root / "scheduler.kubeconfig")
    port = free_port()
    h.tg.start_soon(partial(run_scheduler, h.settings, kubeconfig=str(kubeconfig),
                            listen=f"127.0.0.1:{port}"))
    url = f"http://127.0.0.1:{port}"
    with anyio.fail_after(30):
        while True:
            try:
                async with session.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return Scheduler(url, session)
            except aiohttp.ClientError:
                pass
            await anyio.sleep(0.05)


def _pending(h: Harness, name: str, limits: dict[str, Any],
             annotations: dict[str, str]) -> dict[str, Any]:
    """A GPU pod as the webhook leaves it: for vgpud's scheduler, not yet on a node."""
    pod: dict[str, Any] = h.api.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [
            {"name": "main", "image": "cuda",
             "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]},
        "status": {"phase": "Pending"}}, "default")
    return pod


async def _run(h: Harness, name: str, uuid: str) -> list[str]:
    h.add_pod(name, {"main": 1}, _on(uuid))
    a = await h.kubelet_call(h.kubelet.run, FakePod("default", name, [("main", 1)]))
    ids: list[str] = a.ids["main"]
    assert [i.split("::")[0] for i in ids] == [uuid], (name, ids)
    return ids


async def hotplug_scenario(h: Harness, bus: Bus) -> None:
    async with aiohttp.ClientSession() as session:
        await _scenario(h, bus, await _scheduler(h, session))


async def _scenario(h: Harness, bus: Bus, sched: Scheduler) -> None:
    gpus = bus.present()
    assert len(gpus) >= 4
    await wait_for(lambda: {g.uuid for g in _inventory(h).devices} == set(gpus))
    users = {n: await _run(h, n, gpus[1]) for n in ("a", "b", "c")}
    bystander = await _run(h, "d", gpus[0])
    before = _config(h, bystander)

    # -- remove a GPU three pods use --------------------------------------------------------
    bus.remove(gpus[1])
    await wait_for(lambda: not any(i.startswith(gpus[1]) for i in h.kubelet.devices()))
    history = h.kubelet.device_history()
    mine = [{i: s for i, s in snap.items() if i.startswith(gpus[1])} for snap in history]
    unhealthy = [k for k, m in enumerate(mine) if m and set(m.values()) == {"Unhealthy"}]
    assert unhealthy, "the gone GPU was never advertised unhealthy before it was dropped"
    assert not mine[-1] and set(mine[unhealthy[0] - 1].values()) == {"Healthy"}
    assert all(snap[i] == "Healthy" for snap in history for i in snap
               if i.startswith(gpus[0])), "another GPU's replicas changed health"
    await wait_for(lambda: set(_gone_events(h)) == {"a", "b", "c"})
    for name, msg in _gone_events(h).items():
        assert gpus[1] in msg and "container 'main'" in msg, (name, msg)
    await wait_for(lambda: gpus[1] not in {g.uuid for g in _inventory(h).devices})
    small = {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 100}
    pinned = _pending(h, "pin", small, {"nvidia.com/include-gpu-uuid": gpus[1]})
    refused = await sched.verb("filter", {"Pod": pinned, "NodeNames": [NODE]})
    assert refused["NodeNames"] == [] and NODE in refused["FailedAndUnresolvableNodes"]
    assert _config(h, bystander) == before
    assert (await _changes(h)).get("removed") == 1
    assert users  # their allocations stay until kubelet removes the pods

    # -- add a GPU ------------------------------------------------------------------------
    bus.add()
    await wait_for(lambda: len(set(bus.present()) - set(gpus)) == 1)
    (new,) = set(bus.present()) - set(gpus)
    await wait_for(lambda: new in {g.uuid for g in _inventory(h).devices})
    # ListAndWatch and the annotation are two paths from the same change: wait for both
    await wait_for(lambda: new in {i.split("::")[0] for i, s in h.kubelet.devices().items()
                                   if s == "Healthy"})
    e = _pending(h, "e", {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 1000},
                 {"nvidia.com/include-gpu-uuid": new})
    with anyio.fail_after(10):  # the scheduler's node informer sees the new inventory
        while True:
            if (await sched.verb("filter", {"Pod": e, "NodeNames": [NODE]}))["NodeNames"]:
                break
            await anyio.sleep(0.05)
    bound = await sched.verb("bind", {"PodName": "e", "PodNamespace": "default",
                                      "PodUID": e["metadata"]["uid"], "Node": NODE})
    assert not bound.get("Error"), bound
    assigned = decode_assignment(h.api.get("pods", "e", "default")["metadata"]["annotations"]
                                 ["vgpud.io/assignment"])
    assert [d.uuid for d in assigned.containers[0].devices] == [new]
    a = await h.kubelet_call(h.kubelet.run, FakePod("default", "e", [("main", 1)]))
    assert f"device.0.uuid={new}" in _config(h, a.ids["main"])
    assert (await _changes(h)).get("added") == 1

    # -- swap a board in place ----------------------------------------------------------
    old = gpus[2]
    old_index = next(g.index for g in _inventory(h).devices if g.uuid == old)
    running = await _run(h, "f", old)
    h.add_pod("g", {"main": 1}, _on(old, memory=3000))  # assigned, not started yet
    bus.replace(old)
    await wait_for(lambda: old not in bus.present())
    await wait_for(lambda: not any(i.startswith(old) for i in h.kubelet.devices()))
    swapped = next(u for u in bus.present() if u not in gpus and u != new)
    await wait_for(lambda: swapped in {g.uuid for g in _inventory(h).devices})
    assert next(g.index for g in _inventory(h).devices if g.uuid == swapped) == old_index, (
        old_index, _inventory(h))
    await wait_for(lambda: "f" in _gone_events(h))
    assert f"device.0.uuid={old}" in _config(h, running)  # f keeps what it had
    # the new board starts empty: what f holds on the old UUID is not charged to it
    with anyio.fail_after(10):
        while True:
            rows = {g["uuid"]: g for g in await sched.get(f"/api/v1/gpus?node={NODE}")}
            if swapped in rows and old not in rows:  # the old board: dropped after linger
                break
            await anyio.sleep(0.05)
    assert (rows[swapped]["vgpusAllocated"], rows[swapped]["memoryAllocated"]) == (0, 0)

    def on_swapped(_c: str, free: list[str], _pref: list[str], n: int) -> list[str]:
        return [i for i in free if i.startswith(swapped)][:n]

    a = await h.kubelet_call(h.kubelet.run, FakePod("default", "g", [("main", 1)]), on_swapped)
    cfg = _config(h, a.ids["main"])
    assert f"device.0.uuid={swapped}" in cfg and old not in cfg
    rewritten = decode_assignment(h.api.get("pods", "g", "default")["metadata"]["annotations"]
                                  ["vgpud.io/assignment"])
    assert [d.uuid for d in rewritten.containers[0].devices] == [swapped]
    assert (await _changes(h)).get("replaced") == 1
