"""GPUs that come and go, end to end: the plugin (API stand-in, fake kubelet) over a
*bus* that removes, adds and swaps GPUs. The same scenario runs over the fake-devices
file (:class:`FileBus`, ``tests/plugin/test_hotplug.py``) and over the fake NVML's
device events (``tests/node/test_nvml_hotplug.py``, in a child process).

Removing a GPU while three pods use it: ListAndWatch marks its IDs unhealthy, then
drops them; each of the three pods gets a ``VgpuDeviceGone`` event; the node annotation
loses the GPU, so the scheduler's next filter cannot place on it; the pod on another
GPU is undisturbed (healthy throughout, its limits file unchanged). Adding a GPU: it
is advertised and a pod is placed on it from the next inventory. Swapping a board (a
new UUID at the old one's index): the old IDs go, the new ones come, and the new
board starts empty — nothing held on the old UUID is charged to it, and a pod
assigned to the old board that kubelet puts on the new one is re-assigned (room
checked), never run under the old assignment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from tests.fakekubelet import FakePod
from tests.plugin.harness import NODE, Harness, wait_for
from vgpud.core.allocate import Allocator
from vgpud.core.codec import NODE_DEVICES, decode_assignment, decode_node_devices
from vgpud.core.model import ContainerGrant, DeviceGrant, Node, NodeInventory, Placement
from vgpud.core.requests import parse_pod
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


def _scheduler(h: Harness) -> Allocator:
    """The scheduler's view as the extender builds it: the node's annotation and every
    pod's assignment."""
    a = Allocator(h.settings.defaults())
    a.set_node(Node(NODE, _inventory(h)))
    for p in h.api.objects("pods"):
        text = (p["metadata"].get("annotations") or {}).get("vgpud.io/assignment")
        if text:
            placed = decode_assignment(text)
            a.assume(parse_pod(p, h.settings.defaults()), placed)
    return a


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


async def _run(h: Harness, name: str, uuid: str) -> list[str]:
    h.add_pod(name, {"main": 1}, _on(uuid))
    a = await h.kubelet_call(h.kubelet.run, FakePod("default", name, [("main", 1)]))
    ids: list[str] = a.ids["main"]
    assert [i.split("::")[0] for i in ids] == [uuid], (name, ids)
    return ids


async def hotplug_scenario(h: Harness, bus: Bus) -> None:
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
    pinned = parse_pod({"metadata": {"name": "pin", "namespace": "default", "uid": "pin",
                                     "annotations": {"nvidia.com/include-gpu-uuid": gpus[1]}},
                        "spec": {"containers": [{"name": "main", "resources": {"limits": {
                            "nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 100}}}]}},
                       h.settings.defaults())
    refused = _scheduler(h).filter(pinned, [NODE])
    assert refused.feasible == [] and not refused.failed[NODE].resolvable
    assert _config(h, bystander) == before
    assert (await _changes(h)).get("removed") == 1
    assert users  # their allocations stay until kubelet removes the pods

    # -- add a GPU ------------------------------------------------------------------------
    bus.add()
    await wait_for(lambda: len(set(bus.present()) - set(gpus)) == 1)
    (new,) = set(bus.present()) - set(gpus)
    await wait_for(lambda: new in {g.uuid for g in _inventory(h).devices})
    assert {i.split("::")[0] for i, s in h.kubelet.devices().items() if s == "Healthy"} >= {new}
    pin_new = parse_pod({"metadata": {"name": "e", "namespace": "default", "uid": "e",
                                      "annotations": {"nvidia.com/include-gpu-uuid": new}},
                         "spec": {"containers": [{"name": "main", "resources": {"limits": {
                             "nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 1000}}}]}},
                        h.settings.defaults())
    placed = _scheduler(h).schedule(pin_new, [NODE]).placement
    assert placed is not None and placed.containers[0].devices[0].uuid == new
    ids = await _run(h, "e", new)
    assert f"device.0.uuid={new}" in _config(h, ids)
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
    view = next(v for v in _scheduler(h).cluster.gpus(NODE) if v.gpu.uuid == swapped)
    assert view.used_vgpus == 0 and view.free_memory == view.cap_memory

    def on_swapped(_c: str, free: list[str], _pref: list[str], n: int) -> list[str]:
        return [i for i in free if i.startswith(swapped)][:n]

    a = await h.kubelet_call(h.kubelet.run, FakePod("default", "g", [("main", 1)]), on_swapped)
    cfg = _config(h, a.ids["main"])
    assert f"device.0.uuid={swapped}" in cfg and old not in cfg
    rewritten = decode_assignment(h.api.get("pods", "g", "default")["metadata"]["annotations"]
                                  ["vgpud.io/assignment"])
    assert [d.uuid for d in rewritten.containers[0].devices] == [swapped]
    assert (await _changes(h)).get("replaced") == 1
