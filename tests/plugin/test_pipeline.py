"""50 pods of different shapes bound concurrently onto one node by the scheduler
(the real extender: informers, ledger and verbs over HTTP, driven the way
kube-scheduler drives it), admitted by the fake kubelet in another order and started
concurrently: every container's limits file is its own pod's assignment.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from tests.e2e.cluster import Driver
from tests.fakekubelet import FakePod
from tests.plugin.harness import NODE, node_harness, pod_manifest
from vgpud.core.allocate import Allocator
from vgpud.core.codec import ASSIGNMENT, decode_assignment
from vgpud.core.container import limits_for, render
from vgpud.core.model import ContainerRequest, PodRequest
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.extender.state import SchedulerState, project_node, project_pod
from vgpud.kube.cache import Informer
from vgpud.kube.client import KubeClient
from vgpud.kube.resources import NODES, PODS
from vgpud.kube.writes import PodBinder
from vgpud.plugin.allocations import AllocationStore
from vgpud.plugin.replicas import parse_id

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


async def bind_all_with_the_scheduler(kube: KubeClient, api_url: str,
                                      pods: list[PodRequest]) -> None:
    """Run the extender in-process over HTTP and schedule every pod concurrently."""
    alloc = Allocator()
    nodes: Informer[Any] = Informer(kube, NODES, project=project_node)
    pod_inf: Informer[Any] = Informer(kube, PODS, project=project_pod)
    state = SchedulerState(alloc, pod_lookup=pod_inf.get)
    nodes.subscribe(state.on_node)
    pod_inf.subscribe(state.on_pod)
    ext = Extender(state, writer=PodBinder(kube), events=None, metrics=Metrics(alloc))
    runner = web.AppRunner(make_app(ext, ready=lambda: nodes.has_synced and pod_inf.has_synced))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with anyio.create_task_group() as tg, aiohttp.ClientSession() as s:
            await tg.start(nodes.run)
            await tg.start(pod_inf.run)
            driver = Driver(s, api_url, url)
            outcomes = {}

            async def one(p: PodRequest) -> None:
                obj = await driver.pod("default", p.name)
                outcomes[p.name] = await driver.schedule(obj, [NODE], retries=3)

            async with anyio.create_task_group() as binds:
                for p in pods:
                    binds.start_soon(one, p)
            tg.cancel_scope.cancel()
    finally:
        await runner.cleanup()
    assert all(o.node == NODE for o in outcomes.values()), outcomes
    assert alloc.ledger.violations() == []


async def test_fifty_pods_no_mixups() -> None:
    rng = random.Random(5)
    async with node_harness(8) as h:
        inv = await h.published_inventory()
        pods = shapes(rng)
        for p in pods:
            h.api.create("pods", manifest(p), "default")
        await bind_all_with_the_scheduler(h.kube, h.api.url, pods)
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
                                         register="/etc/vgpud/register.sock"))
                assert (store.path(ids) / "etc" / "config").read_text() == want
        assert len(all_ids) == len(set(all_ids))  # replicas exclusive
        assert len(all_ids) == sum(c.number for p in pods for c in p.containers)
