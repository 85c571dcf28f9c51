"""Other systems' resource names end to end: the plugin registers each enabled preset's
number resource with the fake kubelet, and pods asking in HAMi's, Volcano's or TKE's
names get Allocate, PreStartContainer and a limits file, as native pods do.

Each pod is placed by the scheduler's own core (:meth:`Harness.schedule`: the request
parser under the same settings, the allocator), so the assignment the plugin reads is
the one the scheduler would write for those names.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.fakekubelet import AdmitError, FakePod
from tests.plugin.harness import VGPU, Harness, node_harness, placement, uuid_of
from vgpud.core.codec import decode_assignment
from vgpud.core.limits import MIB, Limits, parse
from vgpud.node.allocations import AllocationStore, allocation_key
from vgpud.node.ids import parse_id
from vgpud.node.podresources import PodResourcesClient

pytestmark = pytest.mark.anyio

HAMI = "nvidia.com/gpu"
VOLCANO = "volcano.sh/vgpu-number"
TKE = "tencent.com/vcuda-core"


def limits_of(h: Harness, ids: list[str], resource: str) -> Limits:
    return parse((AllocationStore(h.state_dir).path(ids, resource) / "etc" / "config")
                 .read_text())


def record_of(h: Harness, ids: list[str], resource: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (AllocationStore(h.state_dir).path(ids, resource) / "record.json").read_text())
    return doc


def per_gpu(ids: list[str]) -> dict[str, int]:
    return dict(Counter(parse_id(i)[0] for i in ids))


@pytest.mark.parametrize(("preset", "number", "memory", "cores", "socket"), [
    ("hami", HAMI, "nvidia.com/gpumem", "nvidia.com/gpucores", "vgpud-nvidia.com-gpu.sock"),
    ("volcano", VOLCANO, "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores",
     "vgpud-volcano.sh-vgpu-number.sock"),
])
async def test_a_preset_registers_its_number_only_and_its_pods_get_their_limits(
        preset: str, number: str, memory: str, cores: str, socket: str) -> None:
    async with node_harness(4, settings={"resourcePreset": preset}, resources=[number]) as h:
        assert h.kubelet.registered() == {number}  # not vgpu-number, not memory or cores
        assert [r.resource_name for r in h.kubelet.registrations] == [number]
        assert sorted(p.name for p in h.kubelet.plugin_dir.glob("*.sock")) == [
            "kubelet.sock", socket]
        assert len(h.kubelet.devices()) == 4 * 10  # split replicas of each GPU
        asks = {number: 1, memory: 3000, cores: 30}
        p = await h.schedule("user", {"main": asks})
        gpu = p.containers[0].devices[0].uuid
        # kubelet allocates the registered name and ignores the scheduler-managed ones
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "user", [("main", asks)]))
        assert list(a.held) == [("main", number)]
        ids = a.held[("main", number)]
        assert per_gpu(ids) == {gpu: 1}
        assert a.replies[("main", number)].envs["NVIDIA_VISIBLE_DEVICES"] == gpu
        got = limits_of(h, ids, number)
        assert [(d.uuid, d.memory_limit, d.core_limit) for d in got.devices] == [
            (gpu, 3000 * MIB, 30)]
        assert got.container == "main"
        assert record_of(h, ids, number)["resource"] == number
        assert record_of(h, ids, number)["owner"]["pod"] == "user"
        assert decode_assignment(h.assignment("user")) == p  # kubelet followed: no rewrite


async def test_native_and_hami_pods_share_a_gpu_with_separate_allocations() -> None:
    async with node_harness(4, settings={"compatPresets": ["hami"]},
                            resources=[VGPU, HAMI]) as h:
        assert h.kubelet.registered() == {VGPU, HAMI}
        assert {p.name for p in h.kubelet.plugin_dir.glob("vgpud-*.sock")} == {
            "vgpud-vgpu-number.sock", "vgpud-nvidia.com-gpu.sock"}
        # both resources advertise the same replica IDs
        assert h.kubelet.devices(VGPU) == h.kubelet.devices(HAMI)
        native_asks = {VGPU: 1, "nvidia.com/vgpu-memory": 2000, "nvidia.com/vgpu-cores": 20}
        hami_asks = {HAMI: 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
        pn = await h.schedule("native", {"main": native_asks})
        ph = await h.schedule("hami", {"main": hami_asks})
        gpu = pn.containers[0].devices[0].uuid
        assert ph.containers[0].devices[0].uuid == gpu  # binpack: one GPU for both
        n = await h.kubelet_call(h.kubelet.run, FakePod("default", "native",
                                                        [("main", native_asks)]))
        m = await h.kubelet_call(h.kubelet.run, FakePod("default", "hami",
                                                        [("main", hami_asks)]))
        # kubelet gave both containers the very same ID string, each of its own resource
        assert n.held[("main", VGPU)] == m.held[("main", HAMI)] == [f"{gpu}::0"]
        ids = [f"{gpu}::0"]
        store = AllocationStore(h.state_dir)
        assert store.path(ids, VGPU) != store.path(ids, HAMI)
        assert store.path(ids, VGPU).name == allocation_key(ids)  # the key before presets
        assert [(d.memory_limit, d.core_limit) for d in limits_of(h, ids, VGPU).devices] == [
            (2000 * MIB, 20)]
        assert [(d.memory_limit, d.core_limit) for d in limits_of(h, ids, HAMI).devices] == [
            (3000 * MIB, 30)]
        assert record_of(h, ids, VGPU)["owner"]["pod"] == "native"
        assert record_of(h, ids, HAMI)["owner"]["pod"] == "hami"
        mounts = {r: next(m.host_path for m in a.replies[("main", r)].mounts
                          if m.container_path == "/etc/vgpud")
                  for a, r in ((n, VGPU), (m, HAMI))}
        assert mounts[VGPU] != mounts[HAMI]


async def test_a_pod_of_one_resource_does_not_steer_another() -> None:
    """GetPreferredAllocation of nvidia.com/gpu must not follow a running native pod's
    container (which holds no nvidia.com/gpu IDs) to its GPU."""
    async with node_harness(4, settings={"compatPresets": ["hami"]},
                            resources=[VGPU, HAMI]) as h:
        h.add_pod("native", {"main": 1}, placement({"main": [(0, 1000, 10)]}))
        await h.kubelet_call(h.kubelet.run, FakePod("default", "native", [("main", 1)]))
        h.add_pod("hami", {"main": {HAMI: 1}}, placement({"main": [(2, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "hami",
                                                        [("main", {HAMI: 1})]))
        assert per_gpu(a.held[("main", HAMI)]) == {uuid_of(2): 1}
        assert not [e for e in h.api.objects("events") if e["reason"] == "VgpuReassigned"]


async def test_tke_vcuda_core_is_a_percent_of_one_gpu() -> None:
    async with node_harness(4, settings={"resourcePreset": "tke"}, resources=[TKE]) as h:
        assert h.kubelet.registered() == {TKE}
        devs = h.kubelet.devices()
        assert len(devs) == 4 * 100  # one ID per percent of each GPU
        assert Counter(parse_id(i)[0] for i in devs) == {uuid_of(g): 100 for g in range(4)}

        share = {TKE: 30, "tencent.com/vcuda-memory": 12}  # 30 %, 12 × 256 MiB
        p = await h.schedule("share", {"main": share})
        gpu = p.containers[0].devices[0].uuid
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "share", [("main", share)]))
        ids = a.held[("main", TKE)]
        assert per_gpu(ids) == {gpu: 30}  # steered: all 30 on the assigned GPU
        got = limits_of(h, ids, TKE)
        assert [(d.uuid, d.memory_limit, d.core_limit) for d in got.devices] == [
            (gpu, 3072 * MIB, 30)]  # one GPU, not 30

        whole = {TKE: 200}  # two whole GPUs
        p2 = await h.schedule("whole", {"main": whole})
        gpus = {d.uuid for d in p2.containers[0].devices}
        assert len(gpus) == 2 and gpu not in gpus
        b = await h.kubelet_call(h.kubelet.run, FakePod("default", "whole", [("main", whole)]))
        ids2 = b.held[("main", TKE)]
        assert per_gpu(ids2) == dict.fromkeys(gpus, 100)
        assert not set(ids) & set(ids2)
        got2 = limits_of(h, ids2, TKE)
        assert {d.uuid for d in got2.devices} == gpus
        assert [(d.memory_limit, d.core_limit) for d in got2.devices] == [
            (24576 * MIB, 100)] * 2
        assert decode_assignment(h.assignment("whole")) == p2


async def test_tke_ids_spread_over_more_gpus_than_assigned_fail_clearly() -> None:
    async with node_harness(2, settings={"resourcePreset": "tke"}, resources=[TKE]) as h:
        share = {TKE: 30}
        await h.schedule("p", {"main": share})

        def split_over_two(name, free, preferred, n):  # type: ignore[no-untyped-def]
            return ([i for i in free if i.startswith(uuid_of(0))][:20]
                    + [i for i in free if i.startswith(uuid_of(1))][:10])

        with pytest.raises(AdmitError) as e:
            await h.kubelet_call(h.kubelet.run, FakePod("default", "p", [("main", share)]),
                                 split_over_two)
        assert e.value.phase == "PreStartContainer" and "default/p" in e.value.message
        assert "FAILED_PRECONDITION" in str(e.value.code)


ALL = [VGPU, HAMI, VOLCANO, TKE]
EVERY = {"compatPresets": ["hami", "volcano", "tke"]}


async def test_kubelet_restart_reregisters_every_resource() -> None:
    async with node_harness(4, settings=EVERY, resources=ALL) as h:
        assert h.kubelet.registered() == set(ALL)
        await h.kubelet_call(h.kubelet.restart)
        await h.kubelet_call(lambda: h.kubelet.wait_registered(2, timeout=30, resources=ALL))
        again = Counter(r.resource_name for r in h.kubelet.registrations)
        assert set(again) == set(ALL) and min(again.values()) >= 2
        assert {r: len(h.kubelet.devices(r)) for r in ALL} == {
            VGPU: 40, HAMI: 40, VOLCANO: 40, TKE: 400}
        for i, r in enumerate(ALL):  # every resource serves pods again
            asks = {r: 100 if r == TKE else 1}
            await h.schedule(f"p{i}", {"main": asks})
            a = await h.kubelet_call(h.kubelet.run, FakePod("default", f"p{i}",
                                                            [("main", asks)]))
            assert limits_of(h, a.held[("main", r)], r).devices


async def test_plugin_restart_finds_every_resources_allocations() -> None:
    async with node_harness(4, settings=EVERY, resources=ALL) as h:
        pods = {"native": {VGPU: 1, "nvidia.com/vgpu-memory": 1000},
                "hami": {HAMI: 1, "nvidia.com/gpumem": 2000},
                "volcano": {VOLCANO: 1, "volcano.sh/vgpu-memory": 3000},
                "tke": {TKE: 40, "tencent.com/vcuda-memory": 16}}
        held = {}
        for name, asks in pods.items():
            await h.schedule(name, {"main": asks})
            a = await h.kubelet_call(h.kubelet.run, FakePod("default", name, [("main", asks)]))
            (((_c, resource), ids),) = a.held.items()
            held[name] = (resource, ids)
        store = AllocationStore(h.state_dir)
        files = {n: store.path(ids, r) / "etc" / "config" for n, (r, ids) in held.items()}

        def snapshot() -> dict[str, tuple[str, int, int]]:
            return {n: (f.read_text(), f.stat().st_mtime_ns, f.stat().st_ino)
                    for n, f in files.items()}

        before = snapshot()
        # a record the plugin wrote before it served several resources has no "resource"
        native = files["native"].parent.parent / "record.json"
        legacy = json.loads(native.read_text())
        del legacy["resource"]
        native.write_text(json.dumps(legacy))

        await h.stop_plugin()
        running = await h.start_plugin()
        await h.kubelet_call(lambda: h.kubelet.wait_registered(2, timeout=30, resources=ALL))
        assert snapshot() == before
        assert set(running.services) == set(ALL)
        restored = {(a.owner.pod, a.resource, a.ids) for a in running.service.store.configured()
                    if a.owner is not None}
        assert restored == {(n, r, tuple(sorted(ids))) for n, (r, ids) in held.items()}
        mem = {a.owner.pod: a.devices[0].memory for a in running.service.store.configured()
               if a.owner is not None}
        assert mem == {"native": 1000, "hami": 2000, "volcano": 3000, "tke": 4096}

        # housekeeping tells the resources apart: kubelet still lists all four...
        assert await running.service.collect(grace=0) == 0
        # ...and once the HAMi pod is gone only its directory goes
        await h.kubelet_call(h.kubelet.remove, "default", "hami")
        assert await running.service.collect(grace=0) == 1
        assert {n for n, f in files.items() if f.exists()} == {"native", "volcano", "tke"}


async def test_a_container_asking_for_two_resources_is_listed_per_resource() -> None:
    """The fake kubelet as the real one: one Allocate per resource, and PodResources
    lists each device under its resource name (a ContainerDevices per device, as kubelet
    does: the fake used to list one per resource); each service finds only its own."""
    async with node_harness(4, settings={"compatPresets": ["hami"]},
                            resources=[VGPU, HAMI]) as h:
        h.add_pod("both", {"main": {VGPU: 1, HAMI: 1}}, placement({"main": [(1, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "both",
                                                        [("main", {VGPU: 1, HAMI: 1})]))
        assert set(a.held) == {("main", VGPU), ("main", HAMI)}
        sock = str(h.kubelet.podres_socket)
        for r in (VGPU, HAMI):
            listed = await PodResourcesClient(sock, r).list()
            assert [(x.pod, x.container, x.ids) for x in listed] == [
                ("both", "main", frozenset(a.held[("main", r)]))]
        assert await PodResourcesClient(sock, VGPU).live() == {
            (r, frozenset(a.held[("main", r)])) for r in (VGPU, HAMI)}
        for r in (VGPU, HAMI):  # each resource's allocation was configured on its own
            assert [d.uuid for d in limits_of(h, a.held[("main", r)], r).devices] == [
                uuid_of(1)]
