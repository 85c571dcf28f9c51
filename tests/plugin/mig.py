"""MIG end to end on one node: the plugin (API stand-in, fake kubelet) over two
A100-like GPUs in MIG mode, pods placed by the scheduler's own core from the node's
published inventory. The scenarios run over a fake-devices file
(``tests/plugin/test_mig.py``) and over the fake NVML (``tests/node/test_nvml_mig.py``,
in a child process), so what the plugin does with MIG devices does not depend on
where they were discovered.

- ``mixed``: each instance is a device of its profile's resource
  (``nvidia.com/mig-1g.10gb``), one ID each, placed whole: the container's edits name
  the instance's ``MIG-`` UUID, its limits file gives it the instance's memory and all
  of its SMs; the GPUs themselves are not offered.
- ``single``: the instances are shared like GPUs under the vGPU resource: ``split`` IDs
  each, and a vGPU slice's memory limit inside the instance.
"""

from __future__ import annotations

from typing import Any

from tests.fakekubelet import FakePod
from tests.plugin.harness import NODE, Harness, wait_for
from vgpud.core.limits import MIB, Limits, parse
from vgpud.core.model import NodeInventory
from vgpud.core.requests import parse_pod
from vgpud.node.allocations import AllocationStore
from vgpud.node.ids import parse_id

A100 = "NVIDIA A100-SXM4-80GB"
# the fake NVML's sizes for an 81920 MiB GPU: an instance of m memory slices has
# m × 10240 × 95 % MiB (a real A100 80GB's 1g.10gb has 9728 MiB)
SIZES = {"1g.10gb": 9728, "2g.20gb": 19456, "3g.40gb": 38912}
# GPU 0: 1g.10gb ×3 + 2g.20gb; GPU 1: 3g.40gb ×2
LAYOUT = {0: ["1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb"], 1: ["3g.40gb", "3g.40gb"]}


def mig_devices() -> list[dict[str, Any]]:
    """The fake-devices file of :data:`LAYOUT` (UUIDs in the fake NVML's style)."""
    out: list[dict[str, Any]] = []
    for g, profiles in LAYOUT.items():
        parent = f"GPU-fa4ecda0-0000-4000-8000-{g:012x}"
        out.append({"uuid": parent, "index": g, "model": A100, "memory": 81920, "numa": 0,
                    "mig": True})
        out += [{"uuid": f"MIG-fa4ecda0-{g:04x}-4000-8000-{i:012x}", "index": g,
                 "model": f"{A100} MIG {p}", "memory": SIZES[p], "numa": 0, "profile": p,
                 "parent": parent} for i, p in enumerate(profiles)]
    return out


def limits_of(h: Harness, ids: list[str], resource: str) -> Limits:
    return parse((AllocationStore(h.state_dir).path(ids, resource) / "etc" / "config")
                 .read_text())


def env_of(reply: Any) -> dict[str, str]:
    return dict(reply.envs)


async def mixed_scenario(h: Harness, number: str = "nvidia.com/vgpu-number") -> None:
    """Profile resources, whole instances, the right MIG device in each container."""
    inv: NodeInventory = await h.published_inventory()
    instances = {g.uuid: g for g in inv.devices if g.parent}
    assert sorted(g.profile for g in instances.values()) == sorted(
        p for ps in LAYOUT.values() for p in ps)
    assert all(g.split == 1 for g in instances.values())
    parents = [g for g in inv.devices if g.mig]
    assert len(parents) == 2 and all(g.memory == 81920 for g in parents)
    one, two, three = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"
    await wait_for(lambda: {one, two, three} <= h.kubelet.registered() and all(
        h.kubelet.list_and_watch_updates(r) for r in (one, two, three)))
    assert len(h.kubelet.devices(one)) == 3 and len(h.kubelet.devices(three)) == 2
    assert len(h.kubelet.devices(two)) == 1
    assert {parse_id(i)[1] for i in h.kubelet.devices(one)} == {0}  # one ID per instance
    # the MIG-mode GPUs are not offered as vGPUs, nor advertised
    assert not any(i.startswith(tuple(g.uuid for g in parents))
                   for i in h.kubelet.devices(number))

    seen: set[str] = set()
    for k in range(3):
        placed = await h.schedule(f"small{k}", {"main": {one: 1}})
        (grant,) = placed.containers[0].devices
        assert instances[grant.uuid].profile == "1g.10gb" and grant.uuid not in seen
        seen.add(grant.uuid)
        a = await h.kubelet_call(h.kubelet.run,
                                 FakePod("default", f"small{k}", [("main", {one: 1})]))
        ids = a.held[("main", one)]
        assert [parse_id(i)[0] for i in ids] == [grant.uuid]  # steered to the assignment
        assert env_of(a.replies[("main", one)])["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
        lim = limits_of(h, ids, one)
        assert [(d.uuid, d.memory_limit, d.core_limit) for d in lim.devices] == [
            (grant.uuid, SIZES["1g.10gb"] * MIB, 100)]
    # all three 1g.10gb instances are held: a fourth waits (the scheduler says why)
    extra = h.add_pod("small3", {"main": {one: 1}}, None)
    assert h.allocator is not None
    refused = h.allocator.filter(parse_pod(extra, h.settings.defaults()), [NODE])
    assert refused.feasible == [] and refused.failed[NODE].resolvable

    placed = await h.schedule("big", {"main": {three: 2}})
    got = sorted(d.uuid for d in placed.containers[0].devices)
    assert got == sorted(u for u, g in instances.items() if g.profile == "3g.40gb")
    a = await h.kubelet_call(h.kubelet.run, FakePod("default", "big", [("main", {three: 2})]))
    ids = a.held[("main", three)]
    assert sorted(parse_id(i)[0] for i in ids) == got
    assert sorted(env_of(a.replies[("main", three)])["NVIDIA_VISIBLE_DEVICES"].split(",")) == got
    limits = limits_of(h, ids, three).devices
    assert [d.memory_limit for d in limits] == [SIZES["3g.40gb"] * MIB] * 2


async def single_scenario(h: Harness, number: str = "nvidia.com/vgpu-number",
                          memory: str = "nvidia.com/vgpu-memory", split: int = 4) -> None:
    """Instances shared like GPUs: vGPU slices inside them."""
    inv = await h.published_inventory()
    instances = {g.uuid: g for g in inv.devices if g.parent}
    assert len(instances) == 6 and all(not g.profile and g.split == split
                                       for g in instances.values())
    devs = h.kubelet.devices(number)
    assert {parse_id(i)[0] for i in devs} == set(instances)  # the GPUs themselves: not offered
    assert len(devs) == 6 * split
    assert not any(r.startswith("nvidia.com/mig-") for r in h.kubelet.registered())
    used: dict[str, int] = {}
    for k in range(5):
        placed = await h.schedule(f"slice{k}", {"main": {number: 1, memory: 4000}})
        (grant,) = placed.containers[0].devices
        assert grant.uuid in instances and grant.memory == 4000
        used[grant.uuid] = used.get(grant.uuid, 0) + 1
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", f"slice{k}",
                                                        [("main", {number: 1})]))
        ids = a.held[("main", number)]
        assert [parse_id(i)[0] for i in ids] == [grant.uuid]
        assert env_of(a.replies[("main", number)])["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
        lim = limits_of(h, ids, number)
        assert [(d.uuid, d.memory_limit) for d in lim.devices] == [(grant.uuid, 4000 * MIB)]
    # binpack: slices share an instance while it has room (1g.10gb: two of 4000 MiB)
    assert max(used.values()) >= 2
    # a slice larger than any instance never fits
    assert h.allocator is not None
    big = h.add_pod("huge", {"main": {number: 1, memory: 40000}}, None)
    refused = h.allocator.filter(parse_pod(big, h.settings.defaults()), [NODE])
    assert refused.feasible == [] and not refused.failed[NODE].resolvable
