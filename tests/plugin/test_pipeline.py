"""50 pods of different shapes placed by the core allocator, bound concurrently through
the Kubernetes layer, admitted by the fake kubelet in another order and started
concurrently: every container's limits file is its own pod's assignment.

The ``schedule`` step is the scheduler's bind step in miniature (core placement →
assignment patch with precondition → Binding); swap in the extender's bind handler
when it exists.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.plugin.harness import NODE, Harness, node_harness, pod_manifest
from vgpud.core.choose import charge, place
from vgpud.core.cluster import Cluster
from vgpud.core.codec import ASSIGNMENT, decode_assignment, decode_node_devices, encode_assignment
from vgpud.core.container import render_shim_config
from vgpud.core.model import ContainerRequest, Node, Placement, PodRequest
from vgpud.kube.writes import PodWriter
from vgpud.plugin.allocations import AllocationStore
from vgpud.plugin.replicas import parse_id

pytestmark = pytest.mark.anyio
PODS = 50


def shapes(rng: random.Random) -> list[PodRequest]:
    out = []
    for i in range(PODS):
        kind = i % 5
        if kind == 3:  # two containers
            cs = (ContainerRequest("a", 1, memory=rng.randrange(500, 2000, 100), cores=10),
                  ContainerRequest("b", 1, memory=rng.randrange(500, 2000, 100), cores=5))
        elif kind == 4:  # two vGPUs in one container
            cs = (ContainerRequest("main", 2, memory=rng.randrange(500, 3000, 100), cores=15),)
        else:
            cs = (ContainerRequest("main", 1, memory=rng.randrange(256, 4000, 128),
                                   cores=rng.choice([0, 10, 20, 30])),)
        out.append(PodRequest(namespace="default", name=f"pod-{i:02d}", uid="", containers=cs))
    return out


async def schedule(h: Harness, writer: PodWriter, cluster: Cluster, pod: PodRequest,
                   decided: dict[str, Placement]) -> None:
    p = place(cluster, pod, NODE)
    assert isinstance(p, Placement), p
    cluster.add_usage(NODE, charge(p), +1)  # the scheduler's ledger assumes it
    decided[pod.name] = p
    obj = await writer.read_pod(pod.namespace, pod.name)
    await writer.patch_annotations(pod.namespace, pod.name, {ASSIGNMENT: encode_assignment(p)},
                                   resource_version=obj["metadata"]["resourceVersion"])
    await writer.bind(pod.namespace, pod.name, NODE)


async def test_fifty_pods_no_mixups() -> None:
    rng = random.Random(5)
    async with node_harness(8) as h:
        node = h.api.get("nodes", NODE, "")
        inv = decode_node_devices(node["metadata"]["annotations"]["vgpud.io/node-devices"])
        cluster = Cluster()
        cluster.set_node(Node(NODE, inv))
        pods = shapes(rng)
        for p in pods:
            m = pod_manifest(p.name, {c.name: c.number for c in p.containers}, None)
            del m["spec"]["nodeName"]
            h.api.create("pods", m, "default")
        writer = PodWriter(h.kube)
        decided: dict[str, Placement] = {}
        async with anyio.create_task_group() as tg:
            for p in pods:
                tg.start_soon(schedule, h, writer, cluster, p, decided)
        assert all(h.api.get("pods", p.name)["spec"]["nodeName"] == NODE for p in pods)

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
                want = render_shim_config(grant, inv, compute_policy=final.compute_policy,
                                          priority=final.priority, state_dir="/var/run/vgpud")
                assert (store.path(ids) / "etc" / "config").read_text() == want.text
        assert len(all_ids) == len(set(all_ids))  # replicas exclusive
        assert len(all_ids) == sum(c.number for p in pods for c in p.containers)
