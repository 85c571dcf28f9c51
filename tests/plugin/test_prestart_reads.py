"""PreStartContainer's API reads (issue 25, item 6: the allocation path's latency),
through the in-memory API client and a PodResources double: no API server, no kubelet.

- The pod GetPreferredAllocation found kubelet admitting is read while PodResources is
  asked who holds the IDs; when it is the owner, that one GET is all the start reads of
  it. A wrong guess costs the owner's own GET, and the limits are the owner's.
- The node's compute policy is read at most once per ``policy_max_age`` seconds: a
  change reaches the containers started after that age.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.doubles import LivePods, MemoryCluster
from tests.kube.clocks import ManualClock
from tests.plugin.harness import NODE, placement, uuid_of
from vgpud.core.codec import ASSIGNMENT, encode_assignment
from vgpud.core.model import Gpu
from vgpud.core.requests import COMPUTE_POLICY
from vgpud.node.allocations import AllocationStore
from vgpud.node.devices import DeviceInfo, NodeDevices
from vgpud.node.podresources import Held
from vgpud.node.pods import NodePods
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.resources import served
from vgpud.plugin.service import PluginService

pytestmark = pytest.mark.anyio

NS = "default"


class Listing:
    """kubelet's PodResources as the plugin asks it: ``held`` is what it lists now."""

    def __init__(self) -> None:
        self.held: list[Held] = []
        self.calls = 0
        self.gate: anyio.Event | None = None  # set: a call waits for it

    async def list(self) -> list[Held]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        await anyio.lowlevel.checkpoint()
        return list(self.held)


def setup(tmp_path: Path, clock: ManualClock | None = None,
          ) -> tuple[PluginService, MemoryCluster, Listing, AllocationStore]:
    api = MemoryCluster()
    api.objects.add_node(NODE)
    found = tuple(DeviceInfo(Gpu(uuid_of(i), i, "m", 10000), minor=i) for i in range(2))
    devices = NodeDevices(found, split=4, memory_scaling=1.0, core_scaling=1.0)
    listing = Listing()
    store = AllocationStore(tmp_path)
    service = PluginService(
        resource=served("vgpu-manager", split=4)[0], node=NODE, devices=devices,
        store=store, podresources=listing, gpus=None,  # type: ignore[arg-type]  # not asked
        cluster=api, pods=NodePods(LivePods(api, NODE), api.get_pod),  # type: ignore[arg-type]
        clock=clock or ManualClock())
    for name, gpu, mib in (("p", 0, 4000), ("q", 1, 3000)):
        api.objects.add_pod({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": {
                ASSIGNMENT: encode_assignment(placement({"main": [(gpu, mib, 20)]}))}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {
                "limits": {service.resource.name: 1}}}]},
            "status": {"phase": "Pending"}})
    return service, api, listing, store


def ids_on(gpu: int) -> list[str]:
    return [f"{uuid_of(gpu)}::0"]


async def admit(service: PluginService, listing: Listing, pod: str, gpu: int) -> None:
    """kubelet admits ``pod``: GetPreferredAllocation while its container holds nothing,
    then (Allocate) the IDs on ``gpu``."""
    listing.held = [h for h in listing.held if h.pod != pod] + [Held(NS, pod, "main",
                                                                   frozenset())]
    await service.get_preferred_allocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=[f"{uuid_of(g)}::{i}" for g in range(2) for i in range(4)],
            allocation_size=1)]))
    listing.held = [h for h in listing.held if h.pod != pod] + [Held(NS, pod, "main",
                                                                   frozenset(ids_on(gpu)))]


def limits(store: AllocationStore, gpu: int) -> str:
    return store.path(ids_on(gpu), served("vgpu-manager", split=4)[0].name).joinpath(
        "etc", "config").read_text()


async def test_the_pod_admitted_last_is_read_while_podresources_is_asked(
        tmp_path: Path) -> None:
    service, api, listing, store = setup(tmp_path)
    await admit(service, listing, "p", 0)
    listing.gate = anyio.Event()  # PodResources does not answer ...
    release = api.faults.hold("get_pod")
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.pre_start_container,
                      pb.PreStartContainerRequest(devices_ids=ids_on(0)))
        with anyio.fail_after(5):
            await api.faults.arrived["get_pod"].wait()  # ... and the pod is read meanwhile
        listing.gate.set()
        release()
    assert api.faults.calls["get_pod"] == 1  # no second read of the owner
    assert "device.0.memory_limit=4194304000" in limits(store, 0)


async def test_a_wrong_guess_reads_the_owner_and_writes_the_owners_limits(
        tmp_path: Path) -> None:
    """GetPreferredAllocation last saw q admitted; kubelet starts p's container."""
    service, api, listing, store = setup(tmp_path)
    await admit(service, listing, "p", 0)
    await admit(service, listing, "q", 1)
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(0)))
    assert "device.0.memory_limit=4194304000" in limits(store, 0)  # p's 4000 MiB
    # q's container starts next: no guess is left, its pod is read once
    before = api.faults.calls["get_pod"]
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(1)))
    assert "device.0.memory_limit=3145728000" in limits(store, 1)  # q's 3000 MiB
    assert api.faults.calls["get_pod"] == before + 1


async def test_the_nodes_policy_is_read_at_most_once_per_max_age(tmp_path: Path) -> None:
    clock = ManualClock()
    service, api, listing, store = setup(tmp_path, clock)
    api.objects.nodes[NODE]["metadata"]["annotations"][COMPUTE_POLICY] = "balance"
    await admit(service, listing, "p", 0)
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(0)))
    assert "device.0.core_policy=balance" in limits(store, 0)
    api.objects.nodes[NODE]["metadata"]["annotations"][COMPUTE_POLICY] = "fixed"
    clock.advance(service.configurer.policy_max_age - 1)
    await admit(service, listing, "q", 1)
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(1)))
    assert api.faults.calls["node_annotation"] == 1
    assert "device.0.core_policy=balance" in limits(store, 1)  # read 9 s ago
    clock.advance(1)
    listing.held = []
    await admit(service, listing, "p", 1)  # p's container again, after a restart
    api.objects.change_pod(NS, "p", **{ASSIGNMENT: encode_assignment(
        placement({"main": [(1, 4000, 20)]}))})
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(1)))
    assert api.faults.calls["node_annotation"] == 2
    assert "device.0.core_policy=fixed" in limits(store, 1)


async def test_a_node_that_cannot_be_read_is_asked_again_at_the_next_start(
        tmp_path: Path) -> None:
    from tests.doubles import timeout

    service, api, listing, store = setup(tmp_path)
    api.objects.nodes[NODE]["metadata"]["annotations"][COMPUTE_POLICY] = "balance"
    api.faults.fail("node_annotation", timeout, times=10)  # the plugin's retries too
    await admit(service, listing, "p", 0)
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(0)))
    assert "device.0.core_policy=fixed" in limits(store, 0)  # unread: the default
    api.faults.clear()
    await admit(service, listing, "q", 1)
    await service.pre_start_container(pb.PreStartContainerRequest(devices_ids=ids_on(1)))
    assert "device.0.core_policy=balance" in limits(store, 1)
