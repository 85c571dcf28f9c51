"""The DRA plugin's prepare and unprepare (vgpud.dra.prepare, vgpud.dra.service): the
limits file and the CDI spec a claim gets, idempotence, the checkpoint and a restart, one
claim's failure kept to itself; and both services over their real sockets
(vgpud.dra.kubelet) with grpclib's client."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.client import Channel

from tests.core.test_claims import claim, result
from tests.dra.conftest import (
    NODE,
    REF,
    UID,
    MemoryClaims,
    mig_node,
    named,
    preparer,
)
from vgpud.core.dra import DRIVER
from vgpud.core.limits import parse
from vgpud.dra import cdi
from vgpud.dra._pb import pluginregistration as reg
from vgpud.dra._pb.k8s.io.kubelet.pkg.apis.dra import v1, v1beta1
from vgpud.dra.kubelet import plugin_socket, registry_socket, serve_sockets
from vgpud.dra.prepare import ClaimRef, PrepareFailed
from vgpud.dra.service import DraService, DraServiceV1beta1, RegistrationService
from vgpud.kube.errors import Forbidden, ServerError
from vgpud.node.runtime import collect
from vgpud.node.vendors import Nvidia

pytestmark = pytest.mark.anyio
GIB = 1 << 30


async def test_a_prepared_claim_is_a_limits_file_and_a_cdi_spec(tmp_path: Path,
                                                                 gpus: Nvidia) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim()))
    got = await p.prepare(REF)
    (d,) = got.devices
    assert (d.requests, d.pool, d.device, d.share_id) == (("gpu",), NODE, "gpu-0", "s-1")
    assert d.cdi_ids == (f"gpu.vgpud.io/claim={UID}-gpu-0",)
    alloc = tmp_path / "state" / "allocations" / got.key
    limits = parse((alloc / "etc" / "config").read_text())
    (dev,) = limits.devices
    assert (dev.uuid, dev.memory_limit, dev.core_limit) == ("GPU-0", 4 * GIB, 30)
    assert limits.state_dir == "/var/run/vgpud" and limits.container == "claim:c"
    spec = json.loads(cdi.spec_path(tmp_path / "cdi", UID).read_text())
    assert spec["kind"] == "gpu.vgpud.io/claim"
    (device,) = spec["devices"]
    assert device["name"] == f"{UID}-gpu-0"
    edits = device["containerEdits"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert mounts["/etc/vgpud"]["hostPath"] == str(alloc / "etc")
    assert "ro" in mounts["/etc/vgpud"]["options"]
    assert mounts["/var/run/vgpud"]["hostPath"] == str(alloc / "state")
    assert "rw" in mounts["/var/run/vgpud"]["options"]
    assert mounts["/etc/ld.so.preload"]["hostPath"] == str(tmp_path / "shim" / "ld.so.preload")
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert "/usr/lib/libvgpu.so" in mounts and "/var/run/vgpud-arbiter" in mounts
    assert {n["path"] for n in edits["deviceNodes"]} >= {"/dev/nvidia0", "/dev/nvidiactl"}
    assert "/dev/nvidia1" not in {n["path"] for n in edits["deviceNodes"]}
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in edits["env"]
    # the store knows the claim's owner (the pod it is reserved for) and grant
    (a,) = p.store.configured()
    assert a.owner is not None and a.resource == DRIVER
    assert (a.owner.pod, a.owner.uid, a.owner.container) == ("trainer", "pod-uid-1", "claim:c")


async def test_a_prepared_claim_reports_its_devices_in_the_claims_status(
        tmp_path: Path, gpus: Nvidia) -> None:
    """KEP-4817: per device of this driver, its identity and the limits its containers are
    held to, with a Ready condition, keyed as the API keys them (shareID included); a MIG
    instance names its GPU and profile. Written once: a second prepare is the checkpoint's
    answer. The API refusing it is logged, never the claim's failure."""
    claims = MemoryClaims(claim(result("gpu-0", "a"),
                                result("gpu-1", "b", memory="8Gi", cores="0", share=None)))
    p = await preparer(tmp_path, gpus, claims)
    await p.prepare(REF)
    first, second = claims.statuses[UID]
    assert {k: first[k] for k in ("driver", "pool", "device", "shareID")} == {
        "driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": "s-1"}
    assert first["data"] == {"uuid": "GPU-0", "index": 0, "model": "NVIDIA Fake",
                             "memoryLimitBytes": 4 * GIB, "coreLimitPercent": 30}
    (ready,) = first["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert "4096 MiB" in ready["message"] and "30 % of its SMs" in ready["message"]
    assert ready["lastTransitionTime"].endswith("Z")
    assert "shareID" not in second and second["data"]["coreLimitPercent"] == 0
    assert "no SM limit" in second["conditions"][0]["message"]
    claims.statuses.clear()
    await p.prepare(REF)
    assert claims.statuses == {}
    # refused by the API: prepared all the same
    refused = MemoryClaims(claim())
    refused.fail_status = Forbidden(403, "Forbidden", "cannot patch resourceclaims/driver")
    q = await preparer(tmp_path / "q", gpus, refused)
    assert (await q.prepare(REF)).devices[0].device == "gpu-0"
    # a MIG instance: its GPU and profile
    m = MemoryClaims(claim(result("gpu-1-mig-1", memory=None, cores=None, share=None)))
    r = await preparer(tmp_path / "r", gpus, m, found=mig_node(), mig="mixed")
    await r.prepare(REF)
    (mig,) = m.statuses[UID]
    assert {k: mig["data"].get(k) for k in ("uuid", "parentUUID", "migProfile")} == {
        "uuid": "MIG-b", "parentUUID": "GPU-mig-parent", "migProfile": "1g.10gb"}


async def test_a_claim_on_two_gpus_has_a_cdi_device_per_gpu_and_one_limits_file(
        tmp_path: Path, gpus: Nvidia) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim(
        result("gpu-0", "a"), result("gpu-1", "b", memory="8Gi", cores="50"))))
    got = await p.prepare(REF)
    assert [d.cdi_ids for d in got.devices] == [(f"gpu.vgpud.io/claim={UID}-gpu-0",),
                                                (f"gpu.vgpud.io/claim={UID}-gpu-1",)]
    limits = parse((p.store.root / got.key / "etc" / "config").read_text())
    assert [(d.uuid, d.memory_limit, d.core_limit) for d in limits.devices] == \
        [("GPU-0", 4 * GIB, 30), ("GPU-1", 8 * GIB, 50)]
    spec = json.loads(cdi.spec_path(tmp_path / "cdi", UID).read_text())
    nodes = {d["name"]: {n["path"] for n in d["containerEdits"]["deviceNodes"]}
             for d in spec["devices"]}
    assert "/dev/nvidia1" in nodes[f"{UID}-gpu-1"] and "/dev/nvidia1" not in nodes[f"{UID}-gpu-0"]


def _nodes(spec: dict[str, Any]) -> dict[str, set[str]]:
    return {d["name"]: {n["path"] for n in d["containerEdits"]["deviceNodes"]}
            for d in spec["devices"]}


async def test_a_claim_on_a_mig_instance_gets_that_instance(tmp_path: Path,
                                                            gpus: Nvidia) -> None:
    """A device the slices name ``gpu-1-mig-1`` (the second of GPU 1's instances in uuid
    order) is that instance: its uuid in the limits file with all of its memory when the
    claim consumed none, its GPU's device node and its own access devices, nothing of the
    GPU's other instances nor of the whole GPU beside it."""
    p = await preparer(tmp_path, gpus, MemoryClaims(claim(
        result("gpu-1-mig-1", memory=None, cores=None, share=None),
        result("gpu-0", "b", memory="8Gi", cores="50"))), found=mig_node(), mig="mixed")
    got = await p.prepare(REF)
    assert [(d.device, d.cdi_ids) for d in got.devices] == [
        ("gpu-1-mig-1", (f"gpu.vgpud.io/claim={UID}-gpu-1-mig-1",)),
        ("gpu-0", (f"gpu.vgpud.io/claim={UID}-gpu-0",))]
    limits = parse((p.store.root / got.key / "etc" / "config").read_text())
    assert [(d.uuid, d.memory_limit, d.core_limit) for d in limits.devices] == \
        [("GPU-0", 8 * GIB, 50), ("MIG-b", 9856 << 20, 100)]
    nodes = _nodes(json.loads(cdi.spec_path(tmp_path / "cdi", UID).read_text()))
    mig = nodes[f"{UID}-gpu-1-mig-1"]
    assert {"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22",
            "/dev/nvidiactl"} <= mig
    assert not mig & {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12",
                      "/dev/nvidia-caps/nvidia-cap30"}
    assert "/dev/nvidia0" in nodes[f"{UID}-gpu-0"]
    # the claim asked less than the instance: that much; the SM share it consumed
    q = await preparer(tmp_path / "q", gpus, MemoryClaims(claim(
        result("gpu-1-mig-2", memory="4Gi", cores="60"))), found=mig_node(), mig="mixed")
    (d,) = parse((q.store.root / (await q.prepare(REF)).key / "etc" / "config")
                 .read_text()).devices
    assert (d.uuid, d.memory_limit, d.core_limit) == ("MIG-c", 4 * GIB, 60)


async def test_a_mig_instance_shared_like_a_gpu_takes_claims_like_one(
        tmp_path: Path, gpus: Nvidia) -> None:
    """``migStrategy: single``: the instances are shared in vGPUs; a claim's share of one
    is what it consumed, as on a GPU."""
    p = await preparer(tmp_path, gpus, MemoryClaims(claim(result("gpu-1-mig-0", memory="2Gi",
                                                                 cores="25"))),
                       found=mig_node(), mig="single")
    (d,) = parse((p.store.root / (await p.prepare(REF)).key / "etc" / "config")
                 .read_text()).devices
    assert (d.uuid, d.memory_limit, d.core_limit) == ("MIG-a", 2 * GIB, 25)


async def test_a_mig_instance_that_is_gone_is_refused_with_the_reason(
        tmp_path: Path, gpus: Nvidia) -> None:
    claims = MemoryClaims(*(named(claim(result(dev)), n, f"u-{n}") for n, dev in (
        ("third", "gpu-1-mig-2"), ("again", "gpu-1-mig-2"), ("whole", "gpu-1"),
        ("first", "gpu-1-mig-0"))))
    p = await preparer(tmp_path, gpus, claims, found=mig_node(), mig="mixed")
    # the GPU's MIG layout changed: MIG-c is no longer found; it keeps its name a while
    changes = p.devices.update(tuple(d for d in mig_node() if d.gpu.uuid != "MIG-c"))
    assert changes.gone == ("MIG-c",)
    with pytest.raises(PrepareFailed) as e:
        await p.prepare(ClaimRef("ns", "third", "u-third"))
    assert str(e.value) == (
        "ResourceClaim ns/third: device gpu-1-mig-2 (MIG instance MIG-c) is no longer found "
        f"on node {NODE} (removed, off the bus, or its GPU's MIG layout changed since the "
        "claim was allocated)")
    assert p.devices.drop(("MIG-c",))  # and then it is not the node's at all
    with pytest.raises(PrepareFailed) as e:
        await p.prepare(ClaimRef("ns", "again", "u-again"))
    assert f"device 'gpu-1-mig-2': node {NODE} has no MIG instance gpu-1-mig-2: GPU 1's " \
        "instances are gpu-1-mig-0, gpu-1-mig-1" in str(e.value)
    with pytest.raises(PrepareFailed, match="has GPU 1 in MIG mode"):
        await p.prepare(ClaimRef("ns", "whole", "u-whole"))
    assert not cdi.spec_path(tmp_path / "cdi", "u-third").exists()
    assert p.store.configured() == [] and p.prepared == {}
    # the instances still there are prepared as before
    assert (await p.prepare(ClaimRef("ns", "first", "u-first"))).devices[0].device == \
        "gpu-1-mig-0"
    assert [d.uuid for a in p.store.configured() for d in a.devices] == ["MIG-a"]


async def test_prepare_twice_is_one_answer_and_one_read(tmp_path: Path, gpus: Nvidia) -> None:
    claims = MemoryClaims(claim())
    p = await preparer(tmp_path, gpus, claims)
    first = await p.prepare(REF)
    config = p.store.root / first.key / "etc" / "config"
    written = config.stat().st_mtime_ns
    assert await p.prepare(REF) == first
    assert claims.reads == 1 and config.stat().st_mtime_ns == written


async def test_a_restarted_plugin_answers_and_unprepares_what_its_predecessor_prepared(
        tmp_path: Path, gpus: Nvidia) -> None:
    claims = MemoryClaims(claim())
    first = await (await preparer(tmp_path, gpus, claims)).prepare(REF)
    again = await preparer(tmp_path, gpus, claims)  # a new process: memory is empty
    assert await again.prepare(REF) == first and claims.reads == 1
    await again.unprepare(REF)
    assert not cdi.spec_path(tmp_path / "cdi", UID).exists()
    assert not (again.store.root / first.key).exists()
    third = await preparer(tmp_path, gpus, claims)
    assert third.prepared == {}
    await third.unprepare(REF)  # unprepared already: nothing to do, no error


async def test_an_unreadable_checkpoint_is_logged_not_fatal(tmp_path: Path,
                                                            gpus: Nvidia) -> None:
    cp = tmp_path / "state" / "dra" / "cp.json"
    cp.parent.mkdir(parents=True)
    cp.write_text('{"v": 9}')
    p = await preparer(tmp_path, gpus, MemoryClaims(claim()))
    assert p.prepared == {}
    assert (await p.prepare(REF)).devices


async def test_each_claim_gets_its_own_answer_and_bad_ones_a_clear_error(
        tmp_path: Path, gpus: Nvidia) -> None:
    good = claim()
    other_node = named(claim(node="gpu-node-2"), "far", "u-far")
    unknown = named(claim(result("gpu-9")), "nine", "u-nine")
    unallocated = named(claim(allocated=False), "waiting", "u-wait")
    claims = MemoryClaims(good, other_node, unknown, unallocated)
    service = DraService(await preparer(tmp_path, gpus, claims))
    ask = [v1.Claim(namespace="ns", name=n, uid=u) for n, u in (
        ("c", UID), ("far", "u-far"), ("nine", "u-nine"), ("waiting", "u-wait"),
        ("gone", "u-gone"), ("c", "u-stale"))]
    got = await service.node_prepare_resources(v1.NodePrepareResourcesRequest(claims=ask))
    assert set(got.claims) == {c.uid for c in ask}
    assert not got.claims[UID].error and got.claims[UID].devices[0].share_id == "s-1"
    errors = {u: r.error for u, r in got.claims.items() if u != UID}
    assert "allocated on node gpu-node-2, not on gpu-node-1" in errors["u-far"]
    assert "has no such GPU" in errors["u-nine"]
    assert "is not allocated" in errors["u-wait"]
    assert errors["u-gone"] == "ResourceClaim ns/gone no longer exists"
    assert "kubelet asked for u-stale" in errors["u-stale"]
    assert all(not r.devices for u, r in got.claims.items() if u != UID)


async def test_an_api_failure_is_that_claims_error(tmp_path: Path, gpus: Nvidia) -> None:
    claims = MemoryClaims(claim())
    claims.fail = ServerError(503, "ServiceUnavailable", "etcd is slow")
    service = DraServiceV1beta1(await preparer(tmp_path, gpus, claims))
    got = await service.node_prepare_resources(v1beta1.NodePrepareResourcesRequest(
        claims=[v1beta1.Claim(namespace="ns", name="c", uid=UID)]))
    assert "ResourceClaim ns/c: cannot read it" in got.claims[UID].error
    claims.fail = None  # kubelet tries again
    got = await service.node_prepare_resources(v1beta1.NodePrepareResourcesRequest(
        claims=[v1beta1.Claim(namespace="ns", name="c", uid=UID)]))
    assert not got.claims[UID].error and got.claims[UID].devices[0].device_name == "gpu-0"


async def test_housekeeping_leaves_the_allocations_an_adapter_owns(tmp_path: Path,
                                                                   gpus: Nvidia) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim()))
    got = await p.prepare(REF)

    class NothingListed:  # kubelet's PodResources lists no DRA claim, nor the pod yet
        async def snapshot(self) -> tuple[set[Any], set[Any]]:
            return set(), set()

    assert await collect(p.store, NothingListed(), grace=0.0, owned={DRIVER}) == 0  # type: ignore[arg-type]
    assert (p.store.root / got.key).exists()
    assert await collect(p.store, NothingListed(), grace=0.0) == 1  # type: ignore[arg-type]


async def test_kubelet_sees_registration_and_both_dra_versions_on_their_sockets(
        tmp_path: Path, gpus: Nvidia) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim()))
    # short: a unix socket's path must fit 108 bytes, pytest's tmp_path may not
    kubelet = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    plugin, registry = plugin_socket(kubelet / "plugins", DRIVER), \
        registry_socket(kubelet / "plugins_registry", DRIVER)
    registration = RegistrationService(DRIVER, str(plugin))
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: serve_sockets(
            [DraService(p), DraServiceV1beta1(p)], [registration], plugin, registry,
            poll=0.05, task_status=task_status))
        assert registry == kubelet / "plugins_registry" / "gpu.vgpud.io-reg.sock"
        channel = Channel(path=str(registry))
        try:
            info = await reg.RegistrationStub(channel).get_info(reg.InfoRequest())
            assert (info.type, info.name, info.endpoint, info.supported_versions) == (
                "DRAPlugin", DRIVER, str(plugin), ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
            await reg.RegistrationStub(channel).notify_registration_status(
                reg.RegistrationStatus(plugin_registered=True))
        finally:
            channel.close()
        assert registration.registered.is_set()
        channel = Channel(path=str(plugin))
        try:
            got = await v1.DraPluginStub(channel).node_prepare_resources(
                v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", name="c",
                                                                uid=UID)]))
            assert got.claims[UID].devices[0].cdi_device_ids == \
                [f"gpu.vgpud.io/claim={UID}-gpu-0"]
            old = await v1beta1.DraPluginStub(channel).node_unprepare_resources(
                v1beta1.NodeUnprepareResourcesRequest(claims=[v1beta1.Claim(
                    namespace="ns", name="c", uid=UID)]))
            assert old.claims[UID].error == ""
        finally:
            channel.close()
        # a removed registration socket is served anew
        registry.unlink()
        with anyio.fail_after(10):
            while not registry.exists():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert not registry.exists()  # gone with the server: kubelet forgets the plugin
    shutil.rmtree(kubelet)


async def test_a_socket_path_kubelet_cannot_have_is_an_error_not_a_hang(
        tmp_path: Path, gpus: Nvidia) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim()))
    deep = tmp_path / ("x" * 120)
    with pytest.raises(ExceptionGroup) as e:
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: serve_sockets(
                [DraService(p)], [RegistrationService(DRIVER, "")],
                plugin_socket(deep, DRIVER), registry_socket(deep, DRIVER),
                task_status=task_status))
    assert e.group_contains(OSError, match="too long")  # not grpclib's "not started"
