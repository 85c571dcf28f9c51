"""MIG on the fake NVML: an A100-like GPU (7 compute slices, 8 memory slices) of any size,
FAKECUDA_MIG / FAKECUDA_MIG_LAYOUT, GPU and compute instances shared through FAKECUDA_STATE."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.fakes_selftest.conftest import NVML_PRELUDE, Fake

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
GPU_IS_LOST = 15
IN_USE = 19
INSUFFICIENT_RESOURCES = 23

PRELUDE = NVML_PRELUDE + """def gis(h, profile_id):
    arr = (n.c_nvmlGpuInstance_t * 8)()
    count = ctypes.c_uint()
    n.nvmlDeviceGetGpuInstances(h, profile_id, arr, ctypes.byref(count))
    return [n.nvmlGpuInstanceGetInfo(arr[i]).id for i in range(count.value)]
def placements(h, profile_id):
    count = ctypes.c_uint()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    arr = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
    return [[p.start, p.size] for p in arr]
def migs(h):
    out = []
    for k in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except n.NVMLError_NotFound:
            break
        out.append([n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m),
                    n.nvmlDeviceGetUUID(m), n.nvmlDeviceGetName(m)])
    return out
"""


def mig_uuid(dev: int, gi: int, ci: int, gen: int = 0) -> str:
    return f"MIG-fa4ecda1-{gen:04x}-40{gi:02x}-80{ci:02x}-{dev:012x}"


def code(c: int) -> dict[str, int]:
    return {"code": c}


def run(fake: Fake, body: str) -> Any:
    return fake.python(PRELUDE + body)


def test_mig_mode_knob_and_set_mig_mode(fake: Fake) -> None:
    fake.env["FAKECUDA_MIG"] = "0"
    out = run(
        fake,
        """
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
out = {"mode": [n.nvmlDeviceGetMigMode(x) for x in h],
       "max": [n.nvmlDeviceGetMaxMigDeviceCount(x) for x in h],
       "profile_off": val(lambda: n.nvmlDeviceGetGpuInstanceProfileInfo(h[1], 0).id),
       "create_off": val(n.nvmlDeviceCreateGpuInstance, h[1], 19),
       "placements_off": placements(h[1], 9)}
out["enable"] = n.nvmlDeviceSetMigMode(h[1], n.NVML_DEVICE_MIG_ENABLE)
out["mode1"] = n.nvmlDeviceGetMigMode(h[1])
out["max1"] = n.nvmlDeviceGetMaxMigDeviceCount(h[1])
gi = n.nvmlDeviceCreateGpuInstance(h[1], 19)
out["busy"] = val(n.nvmlDeviceSetMigMode, h[1], n.NVML_DEVICE_MIG_DISABLE)
n.nvmlGpuInstanceDestroy(gi)
out["disable"] = n.nvmlDeviceSetMigMode(h[1], n.NVML_DEVICE_MIG_DISABLE)
out["mode2"] = n.nvmlDeviceGetMigMode(h[1])
out["bad"] = val(n.nvmlDeviceSetMigMode, h[1], 2)
print(json.dumps(out))
""",
    )
    assert out["mode"] == [[1, 1], [0, 0]]
    assert out["max"] == [7, 0]
    assert out["profile_off"] == code(NOT_SUPPORTED)
    assert out["create_off"] == code(NOT_SUPPORTED)
    assert out["placements_off"] == [[0, 4], [4, 4]]  # placements whatever the mode
    assert out["enable"] == 0 and out["mode1"] == [1, 1] and out["max1"] == 7
    assert out["busy"] == code(IN_USE)
    assert out["disable"] == 0 and out["mode2"] == [0, 0]
    assert out["bad"] == code(INVALID_ARGUMENT)


def test_gpu_instance_profiles_of_an_80gb_gpu(fake: Fake) -> None:
    fake.env.update(FAKECUDA_DEVICES="81920", FAKECUDA_MIG="0", FAKECUDA_SMS="108")
    out = run(
        fake,
        """
h = n.nvmlDeviceGetHandleByIndex(0)
rows = {}
for c in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
    try:
        i = n.nvmlDeviceGetGpuInstanceProfileInfo(h, c)
        v1 = n.nvmlDeviceGetGpuInstanceProfileInfo(h, c, version=1)
        by_id = n.nvmlDeviceGetGpuInstanceProfileInfoById(h, i.id)
    except n.NVMLError as e:
        rows[c] = e.value
        continue
    assert (v1.id, v1.memorySizeMB, v1.sliceCount) == (i.id, i.memorySizeMB, i.sliceCount)
    assert by_id.name == i.name
    rows[c] = [i.id, i.sliceCount, i.instanceCount, i.multiprocessorCount, i.memorySizeMB,
               i.name.decode() if isinstance(i.name, bytes) else i.name,
               placements(h, i.id), n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, i.id)]
rows["bad_id"] = val(n.nvmlDeviceCreateGpuInstance, h, 7)
print(json.dumps(rows))
""",
    )
    sm = 108 // 7
    assert out["0"] == [19, 1, 7, sm, 9728, "MIG 1g.10gb", [[s, 1] for s in range(7)], 7]
    assert out["9"] == [15, 1, 4, sm, 19456, "MIG 1g.20gb", [[s, 2] for s in (0, 2, 4, 6)], 4]
    assert out["1"] == [14, 2, 3, 2 * sm, 19456, "MIG 2g.20gb", [[0, 2], [2, 2], [4, 2]], 3]
    assert out["2"] == [9, 3, 2, 3 * sm, 38912, "MIG 3g.40gb", [[0, 4], [4, 4]], 2]
    assert out["3"] == [5, 4, 1, 4 * sm, 38912, "MIG 4g.40gb", [[0, 4]], 1]
    assert out["4"] == [0, 7, 1, 7 * sm, 77824, "MIG 7g.80gb", [[0, 8]], 1]
    for other in (5, 6, 7, 8, 10, 17):
        assert out[str(other)] == NOT_SUPPORTED
    assert out[str(0x12)] == INVALID_ARGUMENT  # past NVML_GPU_INSTANCE_PROFILE_COUNT
    assert out["bad_id"] == code(INVALID_ARGUMENT)


def test_gpu_instances_placements_overlap_and_capacity(fake: Fake) -> None:
    fake.env.update(FAKECUDA_DEVICES="81920", FAKECUDA_MIG="0")
    out = run(
        fake,
        """
h = n.nvmlDeviceGetHandleByIndex(0)
def P(start, size):  # pynvml passes the placement as given: a pointer is due
    return ctypes.byref(n.c_nvmlGpuInstancePlacement_t(start, size))
out = {}
g3 = n.nvmlDeviceCreateGpuInstance(h, 9)                     # 3g.40gb at 0
out["g3"] = [n.nvmlGpuInstanceGetInfo(g3).id, n.nvmlGpuInstanceGetInfo(g3).placement.start]
out["cap"] = {p: n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, p) for p in (19, 15, 14, 9, 5, 0)}
out["4g"] = val(n.nvmlDeviceCreateGpuInstance, h, 5)         # overlaps the 3g
out["overlap"] = val(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, P(2, 1))
out["bad_start"] = val(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 14, P(1, 2))
out["bad_size"] = val(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, P(5, 2))
g1 = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, P(6, 1))
out["g1"] = n.nvmlGpuInstanceGetInfo(g1).id
g1b = n.nvmlDeviceCreateGpuInstance(h, 19)                   # lowest free: 4
out["g1b"] = [n.nvmlGpuInstanceGetInfo(g1b).id, n.nvmlGpuInstanceGetInfo(g1b).placement.start]
n.nvmlDeviceCreateGpuInstance(h, 19)                         # 5
out["full"] = val(n.nvmlDeviceCreateGpuInstance, h, 19)
out["rev2"] = val(n.nvmlDeviceCreateGpuInstance, h, 15)
out["gis"] = {p: gis(h, p) for p in (19, 9)}
out["by_id"] = [n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(h, 13)).profileId,
                val(n.nvmlDeviceGetGpuInstanceById, h, 2)]
info = n.nvmlGpuInstanceGetInfo(g3)
out["parent"] = addr(info.device) == addr(h)
n.nvmlGpuInstanceDestroy(g3)
out["destroyed"] = val(n.nvmlGpuInstanceGetInfo, g3)
out["cap_after"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 14)
print(json.dumps(out))
""",
    )
    assert out["g3"] == [1, 0]  # GPU instance ids are the A100's: halves 1-2
    assert out["cap"] == {"19": 3, "15": 2, "14": 1, "9": 1, "5": 0, "0": 0}
    assert out["4g"] == code(INSUFFICIENT_RESOURCES)
    assert out["overlap"] == code(INSUFFICIENT_RESOURCES)
    assert out["bad_start"] == code(INVALID_ARGUMENT)
    assert out["bad_size"] == code(INVALID_ARGUMENT)
    assert out["g1"] == 13  # eighths are 7..13
    assert out["g1b"] == [11, 4]
    assert out["full"] == code(INSUFFICIENT_RESOURCES)
    assert out["rev2"] == code(INSUFFICIENT_RESOURCES)
    assert out["gis"] == {"19": [11, 12, 13], "9": [1]}
    assert out["by_id"] == [19, code(NOT_FOUND)]
    assert out["parent"]
    assert out["destroyed"] == code(INVALID_ARGUMENT)
    assert out["cap_after"] == 2


def test_compute_instances(fake: Fake) -> None:
    fake.env.update(FAKECUDA_DEVICES="81920", FAKECUDA_MIG="0", FAKECUDA_SMS="98")
    out = run(
        fake,
        """
h = n.nvmlDeviceGetHandleByIndex(0)
g = n.nvmlDeviceCreateGpuInstance(h, 9)                      # 3g.40gb
out = {"profiles": {}}
for p in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT + 1):
    try:
        i = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(g, p, 0)
    except n.NVMLError as e:
        out["profiles"][p] = e.value
        continue
    out["profiles"][p] = [i.id, i.sliceCount, i.instanceCount, i.multiprocessorCount,
                          i.name.decode() if isinstance(i.name, bytes) else i.name]
out["eng"] = val(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, g, 0, 1)
cis = [n.nvmlGpuInstanceCreateComputeInstance(g, 0) for _ in range(3)]
out["fourth"] = val(n.nvmlGpuInstanceCreateComputeInstance, g, 0)
out["whole"] = val(n.nvmlGpuInstanceCreateComputeInstance, g, 2)
out["unsupported"] = val(n.nvmlGpuInstanceCreateComputeInstance, g, 1)
info = n.nvmlComputeInstanceGetInfo(cis[2])
out["info"] = [info.id, info.profileId, info.placement.start, info.placement.size,
               addr(info.device) == addr(h), addr(info.gpuInstance) == addr(g)]
out["gi_busy"] = val(n.nvmlGpuInstanceDestroy, g)
out["migs"] = migs(h)
n.nvmlComputeInstanceDestroy(cis[1])
out["destroyed"] = val(n.nvmlComputeInstanceGetInfo, cis[1])
out["migs_after"] = [m[:2] for m in migs(h)]
out["cap"] = n.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(g, 0)
for c in (cis[0], cis[2]):
    n.nvmlComputeInstanceDestroy(c)
out["gi_free"] = val(n.nvmlGpuInstanceDestroy, g)
print(json.dumps(out))
""",
    )
    assert out["profiles"] == {
        "0": [0, 1, 3, 14, "MIG 1c.3g.40gb"],
        "1": NOT_SUPPORTED,
        "2": [2, 3, 1, 42, "MIG 3g.40gb"],
        "3": NOT_SUPPORTED,
        "4": NOT_SUPPORTED,
        "5": NOT_SUPPORTED,
        "6": NOT_SUPPORTED,
        "7": NOT_SUPPORTED,
        "8": NOT_SUPPORTED,
        "9": INVALID_ARGUMENT,
    }
    assert out["eng"] == code(INVALID_ARGUMENT)
    assert out["fourth"] == code(INSUFFICIENT_RESOURCES)
    assert out["whole"] == code(INSUFFICIENT_RESOURCES)
    assert out["unsupported"] == code(NOT_SUPPORTED)
    assert out["info"] == [2, 0, 2, 1, True, True]
    assert out["gi_busy"] == code(IN_USE)
    assert [m[:2] for m in out["migs"]] == [[1, 0], [1, 1], [1, 2]]
    assert out["migs"][0][2:] == [mig_uuid(0, 1, 0), "NVIDIA Fake GPU 80GB MIG 1c.3g.40gb"]
    assert out["destroyed"] == code(INVALID_ARGUMENT)
    assert out["migs_after"] == [[1, 0], [1, 2]]
    assert out["cap"] == 1
    assert out["gi_free"] == 0


def test_mig_device_handles(fake: Fake) -> None:
    fake.env.update(
        FAKECUDA_DEVICES="81920,24576",
        FAKECUDA_MIG="0",
        FAKECUDA_SMS="108",
        FAKECUDA_MIG_LAYOUT="0:2g.20gb,1g.10gb",
    )
    out = run(
        fake,
        """
h = n.nvmlDeviceGetHandleByIndex(0)
full = n.nvmlDeviceGetHandleByIndex(1)
m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
a = n.nvmlDeviceGetAttributes(m)
mem = n.nvmlDeviceGetMemoryInfo(m)
mem2 = n.nvmlDeviceGetMemoryInfo(m, version=n.nvmlMemory_v2)
u = n.nvmlDeviceGetUUID(m)
out = {
    "uuid": u, "name": n.nvmlDeviceGetName(m),
    "is_mig": [n.nvmlDeviceIsMigDeviceHandle(m).value, n.nvmlDeviceIsMigDeviceHandle(h).value],
    "parent": addr(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)) == addr(h),
    "parent_of_gpu": val(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h),
    "ids": [n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m)],
    "ids_gpu": [val(n.nvmlDeviceGetGpuInstanceId, h), val(n.nvmlDeviceGetComputeInstanceId, h)],
    "attrs": [a.multiprocessorCount, a.gpuInstanceSliceCount, a.computeInstanceSliceCount,
              a.memorySizeMB, a.sharedCopyEngineCount],
    "attrs_gpu": val(n.nvmlDeviceGetAttributes, h),
    "mem": [mem.total, mem.used, mem.free, mem2.total],
    "index": n.nvmlDeviceGetIndex(m),
    "minor": val(n.nvmlDeviceGetMinorNumber, m),
    "by_uuid": addr(n.nvmlDeviceGetHandleByUUID(u)) == addr(m),
    "procs": n.nvmlDeviceGetComputeRunningProcesses(m),
    "util": val(n.nvmlDeviceGetUtilizationRates, m),
    "past_end": val(n.nvmlDeviceGetMigDeviceHandleByIndex, h, 2),
    "full_migs": val(n.nvmlDeviceGetMigDeviceHandleByIndex, full, 0),
    "mig_of_mig": val(n.nvmlDeviceGetMigDeviceHandleByIndex, m, 0),
    "count": n.nvmlDeviceGetCount(),
}
ci = n.nvmlGpuInstanceGetComputeInstanceById(n.nvmlDeviceGetGpuInstanceById(h, 9), 0)
n.nvmlComputeInstanceDestroy(ci)
out["gone"] = [val(n.nvmlDeviceGetUUID, m), val(n.nvmlDeviceGetHandleByUUID, u)]
print(json.dumps(out))
""",
    )
    # layout: 2g.20gb at memory slices 0-1 (GI 3), 1g.10gb at 2 (GI 9); MIG index order (3, 9)
    assert out["uuid"] == mig_uuid(0, 9, 0)
    assert out["name"] == "NVIDIA Fake GPU 80GB MIG 1g.10gb"
    assert out["is_mig"] == [1, 0]
    assert out["parent"]
    assert out["parent_of_gpu"] == code(INVALID_ARGUMENT)
    assert out["ids"] == [9, 0]
    assert out["ids_gpu"] == [code(INVALID_ARGUMENT)] * 2
    assert out["attrs"] == [108 // 7, 1, 1, 9728, 1]
    assert out["attrs_gpu"] == code(NOT_SUPPORTED)
    mib = 1024 * 1024
    assert out["mem"] == [9728 * mib, 0, 9728 * mib, 9728 * mib]
    assert out["index"] == 1  # nvml.h: a MIG device's index is its GetMigDeviceHandleByIndex one
    assert out["minor"] == code(NOT_SUPPORTED)
    assert out["by_uuid"]
    assert out["procs"] == []
    assert out["util"] == code(NOT_SUPPORTED)
    assert out["past_end"] == code(NOT_FOUND)
    assert out["full_migs"] == code(NOT_FOUND)
    assert out["mig_of_mig"] == code(INVALID_ARGUMENT)
    assert out["count"] == 2  # MIG devices are not GPUs of the count
    assert out["gone"] == [code(INVALID_ARGUMENT), code(NOT_FOUND)]


def test_layout_knob_skips_bad_entries(fake: Fake) -> None:
    fake.env.update(
        FAKECUDA_DEVICES="81920,81920,24576",
        FAKECUDA_MIG="0,1",
        FAKECUDA_MIG_LAYOUT="0:1g.10gb,1g.10gb,2g.20gb,5g.50gb;1:3g.40gb,3g.40gb,1g.10gb;2:1g.3gb;x",
    )
    out = fake.python(
        PRELUDE
        + """
print(json.dumps([[m[:2] for m in migs(n.nvmlDeviceGetHandleByIndex(i))] for i in range(3)]))
"""
    )
    assert out == [[[4, 0], [7, 0], [8, 0]], [[1, 0], [2, 0]], []]  # 2g after two 1g: at 2
    # the messages: unknown profile, no room, device not in FAKECUDA_MIG, malformed
    err = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
        env={**fake.env, "FAKECUDA_STATE": fake.env["FAKECUDA_STATE"] + ".2"},
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    assert "no profile '5g.50gb'" in err
    assert "no room for 1g.10gb on device 1" in err
    assert "device 2 is not in FAKECUDA_MIG" in err
    assert "ignoring 'x'" in err


def test_instances_are_shared_through_the_state_file(fake: Fake) -> None:
    fake.env.update(FAKECUDA_MIG="0,1")
    a, b = fake.nvml(), fake.nvml()
    assert b.do("migs 0") == {"migs": []}
    fake.python(
        PRELUDE
        + """
h = n.nvmlDeviceGetHandleByIndex(0)
g = n.nvmlDeviceCreateGpuInstance(h, 14)
n.nvmlGpuInstanceCreateComputeInstance(g, 1)
g = n.nvmlDeviceCreateGpuInstance(h, 19)
n.nvmlGpuInstanceCreateComputeInstance(g, 0)
print("{}")
"""
    )
    seen_a, seen_b = a.do("migs 0"), b.do("migs 0")
    assert seen_a == seen_b
    assert [(m["gi"], m["ci"], m["uuid"]) for m in seen_a["migs"]] == [
        (3, 0, mig_uuid(0, 3, 0)),
        (9, 0, mig_uuid(0, 9, 0)),
    ]
    # 8192 MiB: a slice is 1024 MiB, 2g has 2 x 1024 x 0.95 MiB
    assert seen_a["migs"][0]["memory"] == {"total": 1945 * 1024 * 1024, "used": 0}
    assert seen_a["migs"][0]["name"] == "NVIDIA Fake GPU 8GB MIG 2g.2gb"
    assert a.do(f"hold m {mig_uuid(0, 9, 0)}") == {}
    assert a.do("ask m")["index"] == 1


def test_replace_resets_mig_and_reattach_drops_instances(fake: Fake) -> None:
    fake.env.update(FAKECUDA_MIG="0", FAKECUDA_MIG_LAYOUT="0:1g.1gb")
    out = run(
        fake,
        """
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
out = {"start": migs(h[0])}
m = n.nvmlDeviceGetMigDeviceHandleByIndex(h[0], 0)
event("lost 0")
out["lost"] = [val(n.nvmlDeviceGetUUID, m), val(n.nvmlDeviceGetMigMode, h[0])]
event("replace 0")
out["old_board"] = val(n.nvmlDeviceGetMigMode, h[0])
n.nvmlShutdown(); n.nvmlInit()  # the new board is NVML's from its next session
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
out["replaced"] = [n.nvmlDeviceGetMigMode(h[0]), migs(h[0]), val(n.nvmlDeviceGetUUID, m)]
g = n.nvmlDeviceCreateGpuInstance(h[0], 19)
n.nvmlGpuInstanceCreateComputeInstance(g, 0)
out["new"] = migs(h[0])
n.nvmlDeviceSetMigMode(h[1], 1)
g = n.nvmlDeviceCreateGpuInstance(h[1], 0)
event("remove 1")
out["removed"] = val(n.nvmlGpuInstanceGetInfo, g)
event("add 1")
n.nvmlShutdown(); n.nvmlInit()
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
out["readded"] = [n.nvmlDeviceGetMigMode(h[1]),
                  n.nvmlDeviceGetGpuInstanceRemainingCapacity(h[1], 0)]
print(json.dumps(out))
""",
    )
    name = "NVIDIA Fake GPU 8GB MIG 1g.1gb"
    assert out["start"] == [[7, 0, mig_uuid(0, 7, 0), name]]
    assert out["lost"] == [code(GPU_IS_LOST)] * 2
    assert out["old_board"] == code(GPU_IS_LOST)  # the session's board left the slot
    # a new board: MIG mode from FAKECUDA_MIG, no instances (the layout is not re-applied)
    assert out["replaced"] == [[1, 1], [], code(INVALID_ARGUMENT)]
    assert out["new"] == [[7, 0, mig_uuid(0, 7, 0, gen=1), name]]
    assert out["removed"] == code(GPU_IS_LOST)
    # back on the bus: the mode is the board's, the instances did not survive
    assert out["readded"] == [[1, 1], 1]
