"""Webhook → scheduler → bind → Allocate/PreStartContainer → limits file, each step by
the real role (tests/plugin/flow.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.plugin.flow import Denied, control_plane
from tests.plugin.harness import NODE, node_harness
from vgpud.core.codec import ASSIGNMENT, decode_assignment
from vgpud.core.container import parse
from vgpud.core.requests import parse_quantity
from vgpud.node.allocations import AllocationStore

pytestmark = pytest.mark.anyio


def limits_file(state_dir: Any, ids: list[str]) -> str:
    return (AllocationStore(state_dir).path(ids) / "etc" / "config").read_text()


async def test_a_pod_pinned_by_node_name_gets_its_gpus_assigned() -> None:
    async with node_harness(2) as h, control_plane(h) as cp:
        inv = await h.published_inventory()
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "pinned", "namespace": "default"},
               "spec": {"nodeName": NODE, "containers": [
                   {"name": "main", "image": "cuda",
                    "resources": {"limits": {"nvidia.com/vgpu-memory": "3000"}}}]}}
        created = await cp.create(pod)
        spec = created["spec"]
        assert "nodeName" not in spec and spec["schedulerName"] == "vgpu-scheduler"
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/vgpu-number"] == "1"
        outcome = await cp.schedule(created, [NODE])
        assert outcome.node == NODE, outcome
        placed = decode_assignment(h.api.get("pods", "pinned")["metadata"]["annotations"][
            ASSIGNMENT])
        grant = placed.container("main")
        assert grant is not None and [d.memory for d in grant.devices] == [3000]

        def admit() -> Any:
            a = h.kubelet.admit(FakePod("default", "pinned", [("main", 1)]))
            h.kubelet.start(a)
            return a

        admitted = await anyio.to_thread.run_sync(admit)
        limits = parse(limits_file(h.state_dir, admitted.ids["main"]))
        (dev,) = limits.devices
        assert dev.uuid == grant.devices[0].uuid and dev.memory_limit == 3000 << 20
        assert dev.uuid in {g.uuid for g in inv.devices}


async def test_the_webhook_refuses_what_no_gpu_of_the_cluster_can_hold() -> None:
    async with node_harness(2, memory=24576) as h, control_plane(h) as cp:
        await h.published_inventory()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
               "spec": {"containers": [{"name": "main", "resources": {"limits": {
                   "nvidia.com/vgpu-memory": "30000"}}}]}}
        with anyio.fail_after(10):
            while True:  # the webhook learns the node from its annotation
                try:
                    await cp.create(pod)
                except Denied as e:
                    assert "'main'" in str(e) and "24576 MiB" in str(e)
                    break
                h.api.delete("pods", "huge")
                await anyio.sleep(0.05)
        assert h.api.get("pods", "huge") is None


@pytest.mark.parametrize(("preset", "limits", "annotations", "number", "memory", "cores"), [
    ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
     {"nvidia.com/use-gputype": "Fake", "hami.io/gpu-scheduler-policy": "spread"},
     "nvidia.com/gpu", 3000, 30),
    ("volcano", {"volcano.sh/vgpu-memory": 3000, "volcano.sh/vgpu-cores": 30}, {},
     "volcano.sh/vgpu-number", 3000, 30),
    ("tke", {"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 12}, {},
     "tencent.com/vcuda-core", 12 * 256, 30),
])
async def test_another_systems_pod_goes_through_every_role_under_its_preset(
        preset: str, limits: dict[str, int], annotations: dict[str, str], number: str,
        memory: int, cores: int) -> None:
    async with node_harness(2, settings={"resourcePreset": preset}, resources=[number]) as h, \
            control_plane(h) as cp:
        await h.published_inventory()
        assert h.kubelet.registered() == {number}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "migrated", "namespace": "default",
                            "annotations": annotations},
               "spec": {"containers": [{"name": "main", "image": "cuda",
                                        "resources": {"limits": dict(limits)}}]}}
        created = await cp.create(pod)
        assert created["spec"]["schedulerName"] == "vgpu-scheduler"
        asked = {k: parse_quantity(v, k) for k, v in created["spec"]["containers"][0][
            "resources"]["limits"].items()}  # as the API server stores them: "3000" is "3k"
        assert number in asked  # the webhook added the count where the preset has one
        outcome = await cp.schedule(created, [NODE])
        assert outcome.node == NODE, outcome
        placed = decode_assignment(h.assignment("migrated"))
        grant = placed.container("main")
        assert grant is not None
        assert [(d.memory, d.cores) for d in grant.devices] == [(memory, cores)]

        def admit() -> Any:
            return h.kubelet.run(FakePod("default", "migrated", [("main", asked)]))

        admitted = await anyio.to_thread.run_sync(admit)
        ids = admitted.held[("main", number)]
        path = AllocationStore(h.state_dir).path(ids, number) / "etc" / "config"
        (dev,) = parse(path.read_text()).devices
        assert (dev.uuid, dev.memory_limit, dev.core_limit) == (
            grant.devices[0].uuid, memory << 20, cores)
