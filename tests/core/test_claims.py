"""vgpud.core.claims: what a ResourceClaim's allocation grants on this node, or why not."""

from __future__ import annotations

from typing import Any

import pytest

from vgpud.core.claims import ClaimError, PodRef, allocated_nodes, grant_of
from vgpud.core.dra import DRIVER
from vgpud.core.model import DeviceGrant, Gpu, NodeInventory
from vgpud.core.slices import devices

NODE = "gpu-node-1"
UID = "0f4a1c2e-0000-4000-8000-000000000001"
INVENTORY = NodeInventory((Gpu("GPU-a", 0, "NVIDIA Fake", 24576),
                           Gpu("GPU-b", 1, "NVIDIA Fake", 24576)))
GIB = 1 << 30


def result(device: str = "gpu-0", request: str = "gpu", *, memory: Any = "4Gi",
           cores: Any = "30", driver: str = DRIVER, share: str | None = "s-1") -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": NODE, "device": device}
    if consumed:
        r["consumedCapacity"] = consumed
    if share is not None:
        r["shareID"] = share
    return r


def claim(*results: dict[str, Any], uid: str = UID, node: str | None = NODE,
          allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"reservedFor": [
        {"resource": "pods", "name": "trainer", "uid": "pod-uid-1"}]}
    if allocated:
        allocation: dict[str, Any] = {"devices": {"results": list(results or [result()])}}
        if node is not None:
            allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        status["allocation"] = allocation
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": uid}, "status": status}


def grant(obj: dict[str, Any], uid: str = UID) -> Any:
    return grant_of(obj, namespace="ns", name="c", uid=uid, node=NODE, inventory=INVENTORY)


def test_a_share_of_one_gpu_is_its_consumed_memory_and_cores() -> None:
    g = grant(claim())
    (s,) = g.shares
    assert (s.device, s.uuid, s.memory, s.cores, s.share_id, s.pool, s.request) == \
        ("gpu-0", "GPU-a", 4096, 30, "s-1", NODE, "gpu")
    assert g.pods == (PodRef("trainer", "pod-uid-1"),)
    c = g.container_grant(INVENTORY)
    assert c.name == "claim:c" and c.devices == (DeviceGrant("GPU-a", 4096, 30),)


def test_memory_is_bytes_in_any_quantity_form() -> None:
    for memory in (str(4 * GIB), "4096Mi", 4 * GIB, "4294967296"):
        (s,) = grant(claim(result(memory=memory))).shares
        assert s.memory == 4096, memory


def test_a_result_without_consumed_capacity_holds_the_whole_gpu() -> None:
    (s,) = grant(claim(result(memory=None, cores=None, share=None))).shares
    assert (s.memory, s.cores, s.share_id) == (24576, 100, None)


def test_shares_on_one_gpu_add_up_and_gpus_come_in_index_order() -> None:
    g = grant(claim(result("gpu-1", "b"), result("gpu-0", "a", memory="1Gi", cores="10"),
                    result("gpu-0", "c", memory="2Gi", cores="95")))
    assert g.devices(INVENTORY) == (DeviceGrant("GPU-a", 3072, 100),
                                    DeviceGrant("GPU-b", 4096, 30))


def test_a_share_of_no_cores_has_no_sm_limit_and_lifts_its_gpus() -> None:
    """0 %: what kube-scheduler records for a claim that asks no cores where the slices'
    policy defaults to ``defaultCores`` 0; in the limits file, no SM limit."""
    (s,) = grant(claim(result(memory="10Gi", cores="0"))).shares
    assert s.cores == 0
    g = grant(claim(result("gpu-0", "a", memory="1Gi", cores="30"),
                    result("gpu-0", "c", memory="1Gi", cores="0")))
    assert g.devices(INVENTORY) == (DeviceGrant("GPU-a", 2048, 0),)


def test_results_of_other_drivers_are_not_ours() -> None:
    g = grant(claim(result("nic-0", driver="net.example.com"), result("gpu-1")))
    assert [s.device for s in g.shares] == ["gpu-1"]


@pytest.mark.parametrize(("obj", "uid", "message"), [
    (claim(allocated=False), UID, "ResourceClaim ns/c is not allocated"),
    (claim(uid="other"), UID, "has uid other, kubelet asked for " + UID),
    (claim(node="gpu-node-2"), UID, "is allocated on node gpu-node-2, not on gpu-node-1"),
    (claim(result("gpu-7")), UID, "device 'gpu-7': node gpu-node-1 has no such GPU "
                                  "(it has gpu-0, gpu-1)"),
    (claim(result(driver="other.example.com")), UID, "has no device of driver gpu.vgpud.io"),
    (claim(result(memory="4.5")), UID, "consumedCapacity memory: '4.5' is not a whole number"),
    (claim(result(memory="100Gi")), UID, "consumes 102400 MiB of memory, more than the "
                                         "GPU's 24576 MiB"),
    (claim(result(memory="512Ki")), UID, "less than 1 MiB"),
    (claim(result(cores="130")), UID, "consumes 130 % of the cores, not 0-100"),
    (claim(result(cores="-1")), UID, "consumedCapacity cores: '-1' is negative"),
    ({"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": 3}}}}, UID,
     "allocation.devices.results is not a list"),
])
def test_a_claim_that_cannot_be_prepared_here_says_why(obj: dict[str, Any], uid: str,
                                                       message: str) -> None:
    with pytest.raises(ClaimError, match=None) as e:
        grant(obj, uid)
    assert message in str(e.value)


def test_the_node_selector_names_nodes_by_name_only() -> None:
    assert allocated_nodes({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}]}) is None
    assert allocated_nodes({"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}) \
        == {"n1", "n2"}
    # a selector that pins no node by name (a label, say) does not refuse this one
    g = grant_of(claim() | {"status": claim()["status"] | {"allocation": {
        "devices": {"results": [result()]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": []}]}}}},
        namespace="ns", name="c", uid=UID, node=NODE, inventory=INVENTORY)
    assert len(g.shares) == 1


# -- MIG instances: the names the slices publish are the devices a claim gets ----------------

A100 = "NVIDIA A100-SXM4-80GB"


def mixed_node(*, whole: bool = True) -> NodeInventory:
    """GPU 0 whole, GPU 1 in MIG mode with three instances (offered whole, ``mixed``, or
    shared like GPUs, ``single``), GPU 2 whole; the instances listed out of uuid order."""
    def inst(uuid: str, profile: str, mib: int) -> Gpu:
        return Gpu(uuid, 1, f"{A100} MIG {profile}", mib, split=1 if whole else 4,
                   profile=profile if whole else "", parent="GPU-m")
    return NodeInventory((Gpu("GPU-a", 0, A100, 81920), Gpu("GPU-m", 1, A100, 81920, mig=True),
                          inst("MIG-z", "3g.40gb", 39424), inst("MIG-x", "1g.10gb", 9856),
                          inst("MIG-y", "2g.20gb", 19968), Gpu("GPU-c", 2, A100, 81920)))


def mig_grant(obj: dict[str, Any], inventory: NodeInventory | None = None) -> Any:
    return grant_of(obj, namespace="ns", name="c", uid=UID, node=NODE,
                    inventory=inventory or mixed_node())


def test_a_claim_on_a_mig_instance_is_granted_that_instance() -> None:
    # gpu-1-mig-1: the second of GPU 1's instances in uuid order (x, y, z)
    (s,) = mig_grant(claim(result("gpu-1-mig-1", memory=None, cores=None))).shares
    assert (s.device, s.uuid, s.memory, s.cores) == ("gpu-1-mig-1", "MIG-y", 19968, 100)
    # the claim's consumed capacity, where it asks less than the instance
    (s,) = mig_grant(claim(result("gpu-1-mig-0", memory="4Gi", cores="50"))).shares
    assert (s.uuid, s.memory, s.cores) == ("MIG-x", 4096, 50)
    g = mig_grant(claim(result("gpu-1-mig-2", "a", memory=None, cores=None),
                        result("gpu-0", "b")))
    assert g.devices(mixed_node()) == (DeviceGrant("GPU-a", 4096, 30),
                                       DeviceGrant("MIG-z", 39424, 100))
    with pytest.raises(ClaimError, match="consumes 20480 MiB of memory, more than the MIG "
                                         "instance's 9856 MiB"):
        mig_grant(claim(result("gpu-1-mig-0", memory="20Gi")))


@pytest.mark.parametrize("whole", [True, False])
def test_every_device_the_slices_publish_is_the_device_a_claim_on_it_gets(whole: bool) -> None:
    """For each inventory entry the slices offer, the claim naming it is granted exactly
    it, whatever order the inventory lists the entries in."""
    inv = mixed_node(whole=whole)
    published = devices(inv)
    assert [d.name for d in published] == ["gpu-0", "gpu-1-mig-2", "gpu-1-mig-0",
                                           "gpu-1-mig-1", "gpu-2"]
    assert {d.uuid for d in published} == {g.uuid for g in inv.devices if not g.mig}
    backwards = NodeInventory(inv.devices[::-1])
    assert {d.name: d.uuid for d in devices(backwards)} == {d.name: d.uuid for d in published}
    for d in published:
        for node in (inv, backwards):
            (s,) = mig_grant(claim(result(d.name, memory=None, cores=None)), node).shares
            assert (s.device, s.uuid) == (d.name, d.uuid)
            assert s.memory == node.capacity(next(g for g in node.devices
                                                  if g.uuid == d.uuid)).memory


@pytest.mark.parametrize(("device", "message"), [
    ("gpu-1", "node gpu-node-1 has GPU 1 in MIG mode: a claim is given one of its MIG "
              "instances (gpu-1-mig-0, gpu-1-mig-1, gpu-1-mig-2), never the whole GPU"),
    ("gpu-1-mig-3", "node gpu-node-1 has no MIG instance gpu-1-mig-3: GPU 1's instances are "
                    "gpu-1-mig-0, gpu-1-mig-1, gpu-1-mig-2; the instance was removed, or the "
                    "GPU's MIG layout changed, since the claim was allocated"),
    ("gpu-0-mig-0", "node gpu-node-1 has no MIG instance gpu-0-mig-0: GPU 0 is not in MIG "
                    "mode (its device is gpu-0)"),
    ("gpu-7-mig-0", "node gpu-node-1 has no such MIG instance: no GPU 7 (it has gpu-0, "
                    "gpu-1-mig-2, gpu-1-mig-0, gpu-1-mig-1, gpu-2)"),
    ("gpu-7", "node gpu-node-1 has no such GPU (it has gpu-0, gpu-1-mig-2, gpu-1-mig-0, "
              "gpu-1-mig-1, gpu-2)"),
    ("gpu-01", "node gpu-node-1 has no device 'gpu-01': the devices of gpu.vgpud.io are "
               "named gpu-<index>, and gpu-<index>-mig-<gi>-<ci> for the MIG instances of a GPU "
               "in MIG mode"),
    ("GPU-a", "has no device 'GPU-a'"),
    ("gpu-1-mig-", "has no device 'gpu-1-mig-'"),
    ("", "has no device ''"),
])
def test_a_device_the_node_does_not_have_is_refused_saying_why(device: str,
                                                               message: str) -> None:
    with pytest.raises(ClaimError) as e:
        mig_grant(claim(result(device)))
    assert f"ResourceClaim ns/c: request 'gpu' device {device!r}: " in str(e.value)
    assert message in str(e.value)
