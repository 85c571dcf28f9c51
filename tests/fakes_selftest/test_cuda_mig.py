"""A MIG device on the CUDA side: CUDA_VISIBLE_DEVICES=MIG-<uuid> makes one compute
instance the process's device; its memory is the GPU instance's, charged to the parent GPU.

The machine: 8192 MiB (slices of 1024 MiB) + 4096 MiB; device 0 in MIG mode with a 3g.4gb
(memory slices 0-3: GPU instance 1, 4 x 1024 x 0.95 = 3891 MiB) and a 1g.1gb (slice 4: GPU
instance 11, 972 MiB), each with one compute instance covering it."""

from __future__ import annotations

import pytest

from .conftest import MIB, Fake

U0 = "GPU-fa4ecda0-0000-4000-8000-000000000000"
U1 = "GPU-fa4ecda0-0000-4000-8000-000000000001"
CTX = 300 * MIB
OUT_OF_MEMORY = 2
NO_DEVICE = 100


def mig_uuid(dev: int, gi: int, ci: int, gen: int = 0) -> str:
    return f"MIG-fa4ecda1-{gen:04x}-40{gi:02x}-80{ci:02x}-{dev:012x}"


SMALL = mig_uuid(0, 11, 0)  # 1g.1gb: 972 MiB, 1 compute slice
BIG = mig_uuid(0, 1, 0)  # 3g.4gb: 3891 MiB, 3 compute slices


def as_gpu(mig: str) -> str:
    """The test programs print CUuuid bytes as GPU-...; the bytes are the MIG UUID's."""
    return "GPU-" + mig[4:]


@pytest.fixture
def mig(fake: Fake) -> Fake:
    fake.env.update(FAKECUDA_MIG="0", FAKECUDA_MIG_LAYOUT="0:3g.4gb,1g.1gb", FAKECUDA_SMS="108")
    return fake


def test_the_mig_device_as_cuda_sees_it(mig: Fake) -> None:
    mig.env["CUDA_VISIBLE_DEVICES"] = SMALL
    got = mig.run("viaproc", "visible;uuid 0 legacy;totalmem 0;attr 0 16;dev 0")
    assert got[0] == {"op": "visible", "rc": 0, "count": 1, "uuids": [as_gpu(SMALL)]}
    assert got[1]["uuid"] == U0  # cuDeviceGetUuid (v1): the parent GPU's bytes
    assert got[2]["total"] == 972 * MIB
    assert got[3]["value"] == 108 // 7  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    assert got[4]["name"] == "NVIDIA Fake GPU 8GB MIG 1g.1gb"
    mig.env["CUDA_VISIBLE_DEVICES"] = BIG
    got = mig.run("viaproc", "init;totalmem 0;attr 0 16")[1:]
    assert [got[0]["total"], got[1]["value"]] == [3891 * MIB, 3 * (108 // 7)]


@pytest.mark.parametrize(
    ("value", "uuids"),
    [
        (f"{SMALL},{BIG}", [SMALL]),  # only the first MIG device is enumerated
        (f"1,{BIG},{SMALL}", [U1, BIG]),
        (f"{BIG},1", [BIG, U1]),
        (f"{BIG},0", [BIG]),  # its own GPU after it: a duplicate, parsing stops
        (f"0,{BIG}", [U0]),
        (f"MIG-{U0}/11/0", [SMALL]),  # the legacy MIG-<GPU uuid>/<gi>/<ci> form
        (f"{mig_uuid(0, 7, 0)},1", []),  # no such instance: the list ends there
        (f"1,{mig_uuid(0, 1, 0, gen=1)}", [U1]),  # another board's instance
        (f"{SMALL[:-1]}", []),  # MIG UUIDs are not matched by prefix
    ],
)
def test_visible_mig_devices(mig: Fake, value: str, uuids: list[str]) -> None:
    mig.env["CUDA_VISIBLE_DEVICES"] = value
    got = mig.one("viaproc", "visible")
    if uuids:
        shown = [as_gpu(u) if u.startswith("MIG-") else u for u in uuids]
        assert got == {"op": "visible", "rc": 0, "count": len(uuids), "uuids": shown}
    else:
        assert got["rc"] == NO_DEVICE


NVML_VIEW = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
out = {"parent_used": n.nvmlDeviceGetMemoryInfo(h).used, "migs": {}}
out["procs"] = [[p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
for k in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
    try:
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
    except n.NVMLError_NotFound:
        break
    mem = n.nvmlDeviceGetMemoryInfo(m)
    out["migs"][n.nvmlDeviceGetGpuInstanceId(m)] = [
        mem.total, mem.used, len(n.nvmlDeviceGetComputeRunningProcesses(m))]
ci = n.nvmlGpuInstanceGetComputeInstanceById(n.nvmlDeviceGetGpuInstanceById(h, 11), 0)
try:
    n.nvmlComputeInstanceDestroy(ci)
    out["destroy"] = 0
except n.NVMLError as e:
    out["destroy"] = e.value
print(json.dumps(out))
"""


def test_allocations_are_limited_by_the_instance_and_seen_by_nvml(mig: Fake) -> None:
    p = mig.start("viaproc", env={"CUDA_VISIBLE_DEVICES": SMALL})
    p.ok("use 0")
    assert p.ok("info") | {"op": "info"} == {
        "op": "info",
        "rc": 0,
        "free": 972 * MIB - CTX,
        "total": 972 * MIB,
    }
    p.ok("alloc 0 600m")
    assert p.do("alloc 0 100m")["rc"] == OUT_OF_MEMORY  # 72 MiB left in the instance
    assert p.ok("info")["free"] == 972 * MIB - CTX - 600 * MIB
    held = CTX + 600 * MIB
    assert p.used(0) == held  # charged to the parent GPU
    view = mig.python(NVML_VIEW)
    assert view["parent_used"] == held
    assert view["procs"] == [[held, 11, 0]]
    assert view["migs"] == {"1": [3891 * MIB, 0, 0], "11": [972 * MIB, held, 1]}
    assert view["destroy"] == 19  # NVML_ERROR_IN_USE: a CUDA process is on it
    p.kill()
    view = mig.python(NVML_VIEW)  # the dead process's memory is reclaimed
    assert view["parent_used"] == 0 and view["procs"] == []
    assert view["destroy"] == 0


def test_a_full_gpu_next_to_the_mig_device_keeps_its_memory(mig: Fake) -> None:
    p = mig.start("viaproc", env={"CUDA_VISIBLE_DEVICES": f"1,{BIG}"})
    assert p.ok("use 0")
    assert p.ok("info")["total"] == 4096 * MIB
    p.ok("alloc 0 2g")  # more than any instance: a full GPU is not limited by MIG
    assert p.ok("use 1")
    assert p.ok("info")["total"] == 3891 * MIB
    assert p.do("alloc 1 3700m")["rc"] == OUT_OF_MEMORY
    assert p.used(1) == CTX + 2048 * MIB
    assert p.used(0) == CTX
