"""What ``vgpud inspect`` shows of DRA nodes (vgpud.core.dra_report): the GPUs of the
driver's newest slices, with what the allocated claims consumed of each. The real API
server's objects go through it in tests/realkube/test_dra_end_to_end.py."""

from __future__ import annotations

from typing import Any

from vgpud.core.dra import DRIVER
from vgpud.core.dra_report import ALLOCATED, RESERVED, dra_rows
from vgpud.core.model import Gpu, NodeInventory
from vgpud.core.slices import devices, pool

MIB = 1 << 20
GIB = 1 << 30


def _slices(node: str, *gpus: Gpu, generation: int = 1) -> list[dict[str, Any]]:
    inv = NodeInventory(gpus, 1.0, 1.0)
    return [s.manifest() for s in pool(node, devices(inv), generation)]


def _gpu(i: int, memory: int = 16384, **kw: Any) -> Gpu:
    return Gpu(f"GPU-{i}", i, "NVIDIA L4", memory, **kw)


def _claim(name: str, *results: dict[str, Any], pods: tuple[str, ...] = (),
           namespace: str = "team") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "status": {
        "allocation": {"devices": {"results": list(results)}},
        "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]}}


def _result(device: str, pool: str = "n1", request: str = "gpu",
            driver: str = DRIVER, **consumed: Any) -> dict[str, Any]:
    r = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed:
        r["consumedCapacity"] = consumed
    return r


def test_a_gpu_shows_the_sum_of_what_its_claims_consumed_and_the_pods_they_are_for() -> None:
    rows = dra_rows(_slices("n1", _gpu(0), _gpu(1)), [
        _claim("a", _result("gpu-0", memory="4Gi", cores="30", vgpus="1"), pods=("p1",)),
        _claim("b", _result("gpu-0", memory=str(2 * GIB), cores=20), pods=("p2",)),
    ])
    assert not rows.warnings
    g0, g1 = rows.gpus
    assert (g0.node, g0.index, g0.uuid, g0.model, g0.healthy) == (
        "n1", 0, "GPU-0", "NVIDIA L4", True)
    assert (g0.memory_capacity, g0.memory_allocated, g0.cores_capacity, g0.cores_allocated,
            g0.vgpus_allocated) == (16 * GIB, 6 * GIB, 100, 50, 2)
    assert [(s.pod, s.container, s.memory, s.cores, s.state) for s in g0.slices] == [
        ("p1", "a/gpu", 4 * GIB, 30, RESERVED), ("p2", "b/gpu", 2 * GIB, 20, RESERVED)]
    assert (g1.memory_allocated, g1.cores_allocated, g1.vgpus_allocated, g1.slices) == (
        0, 0, 0, ())
    assert [(p.namespace, p.name, p.uid, p.node, [(g.container, g.uuid, g.memory, g.cores)
                                                   for g in p.grants]) for p in rows.pods] == [
        ("team", "p1", "uid-p1", "n1", [("a/gpu", "GPU-0", 4 * GIB, 30)]),
        ("team", "p2", "uid-p2", "n1", [("b/gpu", "GPU-0", 2 * GIB, 20)])]


def test_a_result_without_consumed_capacity_holds_the_whole_device() -> None:
    # as the node grants it (vgpud.core.claims.grant_of); reserved for no pod yet: the
    # claim shows under its own name
    rows = dra_rows(_slices("n1", _gpu(0)), [_claim("whole", _result("gpu-0"))])
    (g,) = rows.gpus
    assert (g.memory_allocated, g.cores_allocated, g.vgpus_allocated) == (16 * GIB, 100, 1)
    assert [(s.pod, s.state) for s in g.slices] == [("(claim whole)", ALLOCATED)]
    assert rows.pods == []


def test_only_the_newest_generation_of_a_pool_and_only_vgpuds_driver_count() -> None:
    old = _slices("n1", _gpu(0), _gpu(1), _gpu(2), generation=1)
    new = _slices("n1", _gpu(0), _gpu(1), generation=2)
    other = _slices("n2", _gpu(0))
    for s in other:
        s["spec"]["driver"] = "gpu.nvidia.com"
    rows = dra_rows(old + new + other, [
        _claim("c", _result("gpu-0", driver="gpu.nvidia.com", pool="n2"), pods=("x",))])
    assert [(g.node, g.index) for g in rows.gpus] == [("n1", 0), ("n1", 1)]
    assert rows.pods == [] and not rows.warnings


def test_an_unhealthy_gpu_and_a_mig_instance_read_back_from_the_slice() -> None:
    mig = Gpu("MIG-a", 1, "NVIDIA A100 MIG 3g.20gb", 20096, parent="GPU-1", profile="3g.20gb")
    rows = dra_rows(_slices("n1", _gpu(0, healthy=False), _gpu(1, mig=True), mig), [])
    assert [(g.index, g.uuid, g.healthy, g.parent, g.profile) for g in rows.gpus] == [
        (0, "GPU-0", False, "", ""), (1, "MIG-a", True, "GPU-1", "3g.20gb")]


def test_what_cannot_be_read_is_said_never_guessed() -> None:
    rows = dra_rows(_slices("n1", _gpu(0)), [
        _claim("gone", _result("gpu-7", memory="1Gi"), pods=("p",)),
        _claim("odd", _result("gpu-0", memory="lots", cores=10), pods=("q",)),
    ])
    assert rows.warnings == [
        "ResourceClaim team/gone: request 'gpu' holds device n1/gpu-7, which no "
        f"ResourceSlice of {DRIVER} publishes (its node's driver is gone, or the device "
        "was removed)",
        "ResourceClaim team/odd: consumedCapacity memory: 'lots' is not a quantity"]
    (g,) = rows.gpus
    assert (g.memory_allocated, g.cores_allocated, g.vgpus_allocated) == (0, 10, 1)
