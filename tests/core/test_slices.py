"""The ResourceSlices of a node's GPUs (vgpud.core.slices): one device per GPU with
vgpud's request rules as capacity request policies, unhealthy GPUs tainted, MIG instances
named apart, and the writes that make the API hold exactly the node's pool. The real
kube-apiserver validates what this builds in tests/realkube/test_dra_scheduling.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from vgpud.core.dra import DRIVER
from vgpud.core.model import Defaults, Gpu, NodeInventory
from vgpud.core.slices import (
    DIGEST,
    MAX_DEVICES_PER_SLICE,
    MIB,
    TAINT_UNHEALTHY,
    DriverFacts,
    GpuFacts,
    Published,
    ResourceSlice,
    Version,
    devices,
    pci_bus_id,
    plan,
    pool,
    published,
    semver,
    slice_name,
)


def _inv(*gpus: Gpu, memory_scaling: float = 1.0, core_scaling: float = 1.0) -> NodeInventory:
    return NodeInventory(gpus, memory_scaling, core_scaling)


def _gpu(i: int, memory: int = 16384, **kw: Any) -> Gpu:
    return Gpu(f"GPU-{i}", i, "NVIDIA A100-SXM4-80GB", memory, **kw)


def _manifest(inv: NodeInventory, defaults: Defaults | None = None, **kw: Any) -> list[Any]:
    return [d.manifest() for d in devices(inv, defaults, **kw)]


def test_one_shareable_device_per_gpu_named_by_index_with_vgpuds_request_rules() -> None:
    (a, b) = _manifest(_inv(_gpu(0), _gpu(1, split=4)))
    assert (a["name"], b["name"]) == ("gpu-0", "gpu-1")
    assert a["allowMultipleAllocations"] is True
    assert a["attributes"]["uuid"] == {"string": "GPU-0"}
    assert a["attributes"]["index"] == {"int": 0}
    assert a["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert a["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    # memory in bytes: no default memory configured, so a claim that names none gets it all
    assert a["capacity"]["memory"] == {"value": str(16384 * MIB), "requestPolicy": {
        "default": str(16384 * MIB),
        "validRange": {"min": str(MIB), "max": str(16384 * MIB), "step": str(MIB)}}}
    assert a["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}
    # the split: each allocation takes exactly one vGPU
    assert b["capacity"]["vgpus"] == {"value": "4", "requestPolicy": {
        "default": "1", "validValues": ["1"]}}
    assert "taints" not in a


def test_the_settings_defaults_and_scalings_shape_capacity_and_policy() -> None:
    inv = _inv(_gpu(0, memory=10000), memory_scaling=1.5, core_scaling=2.0)
    (d,) = _manifest(inv, Defaults(default_mem=3000, default_cores=30))
    assert d["capacity"]["memory"]["value"] == str(15000 * MIB)
    assert d["capacity"]["memory"]["requestPolicy"]["default"] == str(3000 * MIB)
    # cores oversubscribed to 200 %, yet one request is a share of one GPU: at most 100
    assert d["capacity"]["cores"]["value"] == "200"
    assert d["capacity"]["cores"]["requestPolicy"] == {
        "default": "30", "validRange": {"min": "0", "max": "100", "step": "1"}}
    # a default larger than a small GPU is that GPU (the policy's default is within range)
    (small,) = _manifest(_inv(_gpu(0, memory=2000)), Defaults(default_mem=3000,
                                                               default_cores=30))
    assert small["capacity"]["memory"]["requestPolicy"]["default"] == str(2000 * MIB)
    # under 100 % cores the range ends at the capacity
    (slow,) = _manifest(_inv(_gpu(0), core_scaling=0.5))
    assert slow["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] == "50"


def test_an_unhealthy_gpu_keeps_its_name_and_is_tainted_no_schedule() -> None:
    (ok, sick) = _manifest(_inv(_gpu(0), _gpu(1, healthy=False)))
    assert sick["name"] == "gpu-1"
    assert sick["taints"] == [{"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    assert "taints" not in ok


def test_facts_the_backend_read_become_attributes_in_the_apis_forms() -> None:
    (d,) = _manifest(_inv(_gpu(0, numa=1)),
                     facts={"GPU-0": GpuFacts("00000000:3B:00.0", 108, "8.0")},
                     driver=DriverFacts("535.104.05", "12.2"))
    attrs = d["attributes"]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert attrs["multiprocessors"] == {"int": 108}
    assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}
    assert attrs["driverVersion"] == {"version": "535.104.5"}
    assert attrs["cudaDriverVersion"] == {"version": "12.2.0"}
    # unknown facts are absent, never empty or made up
    (bare,) = _manifest(_inv(_gpu(0, numa=-1)))
    assert not {"resource.kubernetes.io/pciBusID", "resource.kubernetes.io/numaNode",
                "multiprocessors", "driverVersion"} & set(bare["attributes"])


def test_versions_and_bus_ids_are_normalised_or_left_out() -> None:
    assert semver("535.104.05") == Version("535.104.5")  # no leading zeros in semver
    assert semver("12.2") == Version("12.2.0")
    assert semver("550") == Version("550.0.0")
    assert semver("r535") is None and semver("") is None
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id("0000:af:00.1") == "0000:af:00.1"
    assert pci_bus_id("00010000:3B:00.0") == ""  # a domain the standard form cannot hold
    assert pci_bus_id("3B:00.0") == ""


def test_nvlink_peers_form_groups_a_claim_can_match() -> None:
    gpus = (_gpu(0, links=("GPU-1",)), _gpu(1, links=("GPU-0",)),
            _gpu(2, links=("GPU-3",)), _gpu(3, links=("GPU-2",)), _gpu(4))
    out = {d["name"]: d["attributes"] for d in _manifest(_inv(*gpus))}
    assert out["gpu-0"]["nvlinkGroup"] == out["gpu-1"]["nvlinkGroup"] == {"int": 0}
    assert out["gpu-2"]["nvlinkGroup"] == out["gpu-3"]["nvlinkGroup"] == {"int": 2}
    assert out["gpu-1"]["nvlinkPeers"] == {"string": "gpu-0"}
    assert "nvlinkGroup" not in out["gpu-4"]


def test_mig_gpus_offer_their_instances_under_names_of_their_own() -> None:
    parent = _gpu(0, memory=81920, mig=True)
    shared = Gpu("MIG-a", 0, "A100", 9856, split=3, parent="GPU-0")
    whole = Gpu("MIG-b", 0, "A100", 19968, split=1, profile="2g.20gb", parent="GPU-0")
    out = _manifest(_inv(parent, shared, whole, _gpu(1)), Defaults(default_cores=10))
    assert [d["name"] for d in out] == ["gpu-0-mig-0", "gpu-0-mig-1", "gpu-1"]
    a, b, _ = out
    assert a["attributes"]["type"] == {"string": "mig"}
    assert a["attributes"]["parentUUID"] == {"string": "GPU-0"}
    assert "migProfile" not in a["attributes"]
    assert a["capacity"]["cores"]["requestPolicy"]["default"] == "10"
    # placed whole: one claim, all of its memory and cores by default
    assert b["attributes"]["migProfile"] == {"string": "2g.20gb"}
    assert b["capacity"]["vgpus"]["value"] == "1"
    assert b["capacity"]["memory"]["requestPolicy"]["default"] == str(19968 * MIB)
    assert b["capacity"]["cores"]["requestPolicy"]["default"] == "100"


def test_a_pool_is_one_slice_named_for_the_node_until_the_apis_limit() -> None:
    devs = devices(_inv(*(_gpu(i) for i in range(3))))
    (s,) = pool("node-a", devs, 7)
    m = s.manifest("uid-1")
    assert m["apiVersion"] == "resource.k8s.io/v1" and m["kind"] == "ResourceSlice"
    assert m["metadata"]["name"] == f"node-a-{DRIVER}-0"
    assert m["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1",
         "controller": True}]
    assert m["metadata"]["annotations"][DIGEST] == s.digest
    assert m["spec"] == {"driver": DRIVER, "nodeName": "node-a",
                         "pool": {"name": "node-a", "generation": 7, "resourceSliceCount": 1},
                         "devices": [d.manifest() for d in devs]}
    many = devices(_inv(*(_gpu(i) for i in range(MAX_DEVICES_PER_SLICE + 1))))
    first, second = pool("node-a", many, 1)
    assert (len(first.devices), len(second.devices)) == (MAX_DEVICES_PER_SLICE, 1)
    assert first.count == second.count == 2
    # a node without GPUs still says its pool is empty
    (empty,) = pool("node-a", (), 1)
    assert empty.devices == () and empty.manifest()["spec"]["devices"] == []


def test_slice_names_stay_within_the_apis_length() -> None:
    long = "n" * 250
    name = slice_name(long, 3)
    assert len(name) <= 253 and name.endswith(f"-{DRIVER}-3")
    assert slice_name(long, 3) != slice_name("n" * 249 + "m", 3)


def _as_published(s: ResourceSlice, version: str = "1") -> Published:
    return published(replace(s, resource_version=version).manifest("uid"))


def test_plan_creates_then_leaves_an_unchanged_pool_alone() -> None:
    devs = devices(_inv(_gpu(0), _gpu(1)))
    first = plan("n", devs, [])
    (created,) = first.creates
    assert created.generation == 1 and not first.updates and not first.deletes
    assert not plan("n", devs, [_as_published(created)])


def test_a_change_bumps_the_generation_and_updates_in_place() -> None:
    devs = devices(_inv(_gpu(0), _gpu(1)))
    (old,) = plan("n", devs, []).creates
    sick = devices(_inv(_gpu(0), _gpu(1, healthy=False)))
    p = plan("n", sick, [_as_published(old, "41")])
    (updated,) = p.updates
    assert updated.generation == 2 and updated.resource_version == "41"
    assert updated.manifest()["metadata"]["resourceVersion"] == "41"
    assert not p.creates and not p.deletes


def test_slices_no_longer_wanted_are_deleted_and_a_mixed_generation_is_rewritten() -> None:
    many = devices(_inv(*(_gpu(i) for i in range(MAX_DEVICES_PER_SLICE + 1))))
    a, b = plan("n", many, []).creates
    few = devices(_inv(_gpu(0)))
    p = plan("n", few, [_as_published(a, "5"), _as_published(b, "6")])
    assert [s.name for s in p.updates] == [a.name] and p.updates[0].generation == 2
    assert p.deletes == ((b.name, "6"),)
    # a slice left at an older generation (a write that failed half way) is rewritten
    x, y = pool("n", many, 3)
    mixed = [published(x.manifest()), published(replace(y, generation=2).manifest())]
    assert {s.generation for s in plan("n", many, mixed).updates} == {4}
    (one,) = pool("n", few, 3)
    fresh = published(one.manifest())
    assert not plan("n", few, [fresh])
    other = published(pool("n", few, 4)[0].manifest() | {"metadata": {"name": "x"}})
    assert plan("n", few, [fresh, other]).deletes == (("x", ""),)


def test_a_slice_without_vgpuds_digest_is_rewritten() -> None:
    devs = devices(_inv(_gpu(0)))
    (s,) = pool("n", devs, 1)
    m = s.manifest()
    del m["metadata"]["annotations"]
    (updated,) = plan("n", devs, [published(m)]).updates
    assert updated.generation == 2


def test_the_slices_match_the_kubernetes_1_37_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    gpus = (_gpu(0, links=("GPU-1",)), _gpu(1, links=("GPU-0",), healthy=False),
            _gpu(2, mig=True), Gpu("MIG-a", 2, "A100", 9856, split=1, profile="1g.10gb",
                                   parent="GPU-2"))
    devs = devices(_inv(*gpus), Defaults(default_mem=1000, default_cores=20),
                   facts={"GPU-0": GpuFacts("00000000:3B:00.0", 108, "8.0")},
                   driver=DriverFacts("535.104.05", "12.2"))
    for s in pool("node-a", devs, 1):
        kv.validate(replace(s, resource_version="9").manifest("uid"), "1.37.0", strict=True)
