"""50 pods of different shapes bound concurrently onto one node by the scheduler
(the real extender: informers, ledger and verbs over HTTP, driven the way
kube-scheduler drives it), admitted by the fake kubelet in another order and started
concurrently: every container's limits file is its own pod's assignment.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.plugin.flow import control_plane
from tests.plugin.harness import NODE, Harness, node_harness, pod_manifest
from vgpud.core.codec import ASSIGNMENT, decode_assignment
from vgpud.core.limits import limits_for, render
from vgpud.core.model import ContainerRequest, PodRequest
from vgpud.node.allocations import AllocationStore
from vgpud.node.ids import parse_id

pytestmark = pytest.mark.anyio
PODS_N = 50


def shapes(rng: random.Random) -> list[PodRequest]:
    out = []
    for i in range(PODS_N):
        kind = i % 5
        if kind == 3:  # two containers
            cs = (ContainerRequest("a", 1, memory=rng.randrange(500, 2000, 100), cores=10),
                  ContainerRequest("b", 1, memory=rng.randrange(500, 2000, 100), cores=5))
        elif kind == 4:  # two vGPUs in one container
            cs = (ContainerRequest("main", 2, memory=rng.randrange(500, 3000, 100), cores=15),)
        else:  # cores in all: about 750 % of the node's 800 %, so every pod fits
            cs = (ContainerRequest("main", 1, memory=rng.randrange(256, 4000, 128),
                                   cores=rng.choice([0, 10, 20])),)
        out.append(PodRequest(namespace="default", name=f"pod-{i:02d}", uid="", containers=cs))
    return out


def manifest(p: PodRequest) -> dict[str, Any]:
    m = pod_manifest(p.name, {c.name: c.number for c in p.containers}, None)
    del m["spec"]["nodeName"]
    for c, spec in zip(p.containers, m["spec"]["containers"], strict=True):
        spec["resources"]["limits"].update({"nvidia.com/vgpu-memory": str(c.memory),
                                            "nvidia.com/vgpu-cores": str(c.cores)})
    return m


async def bind_all_with_the_scheduler(h: Harness, pods: list[PodRequest]) -> None:
    """Run the extender in-process over HTTP and schedule every pod concurrently."""
    outcomes = {}
    async with control_plane(h) as cp:

        async def one(p: PodRequest) -> None:
            obj = await cp.driver.pod("default", p.name)
            outcomes[p.name] = await cp.schedule(obj, [NODE])

        async with anyio.create_task_group() as binds:
            for p in pods:
                binds.start_soon(one, p)
        assert cp.alloc.ledger.violations() == []
    assert all(o.node == NODE for o in outcomes.values()), outcomes


async def test_fifty_pods_no_mixups() -> None:
    rng = random.Random(5)
    async with node_harness(8) as h:
        inv = await h.published_inventory()
        pods = shapes(rng)
        for p in pods:
            h.api.create("pods", manifest(p), "default")
        await bind_all_with_the_scheduler(h, pods)
        assert all(h.api.get("pods", p.name)["spec"]["nodeName"] == NODE for p in pods)
        decided = {p.name: decode_assignment(
            h.api.get("pods", p.name)["metadata"]["annotations"][ASSIGNMENT]) for p in pods}
        for p in pods:  # the scheduler gave each container what it asked for
            for c in p.containers:
                grant = decided[p.name].container(c.name)
                assert grant is not None and len(grant.devices) == c.number
                assert all(d.memory == c.memory and d.cores == c.cores for d in grant.devices)

        order = list(pods)
        rng.shuffle(order)
        assert order != pods
        fake = {p.name: FakePod("default", p.name, [(c.name, c.number) for c in p.containers])
                for p in pods}

        def admit_and_start() -> list[object]:
            admitted = [h.kubelet.admit(fake[p.name]) for p in order]  # kubelet admits serially
            with ThreadPoolExecutor(8) as ex:  # containers start concurrently
                list(ex.map(h.kubelet.start, admitted))
            return admitted

        admitted = await anyio.to_thread.run_sync(admit_and_start)
        store = AllocationStore(h.state_dir)
        all_ids: list[str] = []
        for a in admitted:
            final = decode_assignment(h.api.get("pods", a.pod.name)["metadata"]["annotations"]
                                      [ASSIGNMENT])
            assert final == decided[a.pod.name]  # kubelet followed the preference: no rewrite
            for cname, ids in a.ids.items():
                all_ids += ids
                grant = final.container(cname)
                assert grant is not None
                assert sorted(parse_id(i)[0] for i in ids) == sorted(d.uuid for d in grant.devices)
                want = render(limits_for(grant, inv, compute_policy=final.compute_policy,
                                         priority=final.priority, state_dir="/var/run/vgpud",
                                         register="/etc/vgpud/register.sock",
                                         arbiter_dir="/var/run/vgpud-arbiter"))
                assert (store.path(ids) / "etc" / "config").read_text() == want
        assert len(all_ids) == len(set(all_ids))  # replicas exclusive
        assert len(all_ids) == sum(c.number for p in pods for c in p.containers)
