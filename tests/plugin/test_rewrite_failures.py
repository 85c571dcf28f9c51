"""The plugin's reconciliation when its assignment rewrite fails, through the in-memory
API client (tests/doubles.py ``MemoryCluster``): no API server, no kubelet.

kubelet chose other GPUs than the pod's assignment names; the plugin rewrites the
assignment (``Configurer.reconcile``, the node's side of PreStartContainer). What it
promises: a ``Conflict`` (the pod changed meanwhile) is decided again over the pod read
anew, at most five times, then refused; a pod gone is refused as gone; any other API
failure is refused with the API's words; a rewrite that went through is announced with a
``VgpuReassigned`` event. A refusal writes nothing.
"""

from __future__ import annotations

import pytest

from tests.doubles import LivePods, MemoryCluster, forbidden, modified
from tests.plugin.harness import NODE, placement, uuid_of
from vgpud.core.codec import ASSIGNMENT, decode_assignment, encode_assignment
from vgpud.core.model import Gpu
from vgpud.kube.errors import NotFound
from vgpud.node.cluster import PodView, view
from vgpud.node.configure import AllocationFailed
from vgpud.node.devices import DeviceInfo, NodeDevices
from vgpud.node.pods import NodePods
from vgpud.node.startup import Configure, Refuse
from vgpud.plugin.resources import served
from vgpud.plugin.service import PluginService

pytestmark = pytest.mark.anyio

NS = "default"
WHERE = f"pod {NS}/p container 'main'"


def setup() -> tuple[PluginService, MemoryCluster, PodView]:
    """A pod assigned GPU 0; kubelet will choose GPU 1 (free)."""
    api = MemoryCluster()
    found = tuple(DeviceInfo(Gpu(uuid_of(i), i, "m", 10000), minor=i) for i in range(2))
    devices = NodeDevices(found, split=4, memory_scaling=1.0, core_scaling=1.0)
    service = PluginService(
        resource=served("vgpu-manager", split=4)[0], node=NODE, devices=devices,
        store=None, podresources=None, gpus=None,  # type: ignore[arg-type]  # not asked
        cluster=api, pods=NodePods(LivePods(api, NODE), api.get_pod),  # type: ignore[arg-type]
        rewrite_wait=0.01)
    pod = api.objects.add_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": NS, "annotations": {
            ASSIGNMENT: encode_assignment(placement({"main": [(0, 4000, 20)]}))}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": "Pending"}})
    return service, api, view(pod)


def assigned_gpus(api: MemoryCluster) -> list[str]:
    raw = api.objects.pod(NS, "p")["metadata"]["annotations"][ASSIGNMENT]
    return [d.uuid for c in decode_assignment(raw).containers for d in c.devices]


async def reconcile(service: PluginService, pod: PodView) -> Configure | Refuse:
    return await service.configurer.reconcile(WHERE, pod, "main", [uuid_of(1)],
                                              resource=service.resource.name,
                                              per_gpu=service.resource.per_gpu)


async def test_a_rewrite_moves_the_assignment_and_says_so() -> None:
    service, api, pod = setup()
    got = await reconcile(service, pod)
    assert isinstance(got, Configure) and got.rewrite
    assert assigned_gpus(api) == [uuid_of(1)]
    assert [e[1] for e in api.events] == ["VgpuReassigned"]


async def test_a_conflict_is_decided_again_over_the_pod_read_anew() -> None:
    service, api, pod = setup()
    api.faults.fail("rewrite_assignment", modified("p"))
    got = await reconcile(service, pod)
    assert isinstance(got, Configure) and assigned_gpus(api) == [uuid_of(1)]
    assert api.faults.calls["rewrite_assignment"] == 2
    assert api.faults.calls["get_pod"] >= 1


async def test_a_conflict_with_someone_elses_rewrite_follows_theirs() -> None:
    """Another write already moved the assignment to the GPU kubelet chose: the pod
    read anew needs no rewrite, and none is made."""
    service, api, pod = setup()
    api.objects.change_pod(NS, "p", **{ASSIGNMENT: encode_assignment(
        placement({"main": [(1, 4000, 20)]}))})
    got = await reconcile(service, pod)
    assert isinstance(got, Configure) and not got.rewrite
    assert api.faults.calls["rewrite_assignment"] == 1  # the one that found it changed
    assert api.events == []


async def test_conflicts_without_end_are_refused() -> None:
    service, api, pod = setup()
    api.faults.fail("rewrite_assignment", lambda: modified("p"), times=100)
    got = await reconcile(service, pod)
    assert isinstance(got, Refuse)
    assert got.message == f"{WHERE}: the assignment kept changing while it was being reconciled"
    assert api.faults.calls["rewrite_assignment"] == 5
    assert assigned_gpus(api) == [uuid_of(0)] and api.events == []


async def test_a_pod_gone_or_a_refused_write_is_refused() -> None:
    service, api, pod = setup()
    api.faults.fail("rewrite_assignment", NotFound(404, "NotFound", 'pods "p" not found'))
    got = await reconcile(service, pod)
    assert isinstance(got, Refuse)
    assert got.message == f"{WHERE}: the pod no longer exists in the API"

    api.faults.fail("rewrite_assignment", forbidden("patch", "pods", "p"))
    got = await reconcile(service, pod)
    assert isinstance(got, Refuse)
    assert got.message.startswith(f"{WHERE}: cannot rewrite the assignment: 403 Forbidden")
    assert assigned_gpus(api) == [uuid_of(0)] and api.events == []


async def test_a_conflict_then_the_pod_gone_fails_the_allocation() -> None:
    """The rewrite conflicts, and the re-read finds no pod: the allocation fails with
    the reason kubelet will show (PreStartContainer turns it into its error)."""
    service, api, pod = setup()
    api.faults.fail("rewrite_assignment", modified("p"))
    api.objects.delete_pod(NS, "p")
    with pytest.raises(AllocationFailed, match="the pod no longer exists in the API"):
        await reconcile(service, pod)
    assert api.faults.calls["rewrite_assignment"] == 1 and api.events == []
