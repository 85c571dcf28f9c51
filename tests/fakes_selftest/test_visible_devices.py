"""CUDA_VISIBLE_DEVICES as the real driver reads it, for the CUDA side only: the listed
devices become ordinals 0..n-1 in list order for every CUdevice in and out; NVML ignores
it.  The fixture's machine has two devices: 8192 MiB (UUID ...000) and 4096 MiB (...001)."""

from __future__ import annotations

import pytest

from .conftest import MIB, Fake

U0 = "GPU-fa4ecda0-0000-4000-8000-000000000000"
U1 = "GPU-fa4ecda0-0000-4000-8000-000000000001"
CTX = 300 * MIB


@pytest.mark.parametrize(
    ("value", "uuids"),
    [
        ("0,1", [U0, U1]),
        ("1,0", [U1, U0]),
        ("1", [U1]),
        (U1, [U1]),
        (f"{U1},0", [U1, U0]),
        (U1[:-1] + "1", [U1]),  # a unique prefix (here all of it)
        ("GPU-fa4ecda0", []),  # ambiguous prefix: invalid, parsing stops
        ("1,0,1", [U1, U0]),  # a duplicate stops the parsing
        ("0,junk,1", [U0]),  # so does an invalid entry
        ("0,7,1", [U0]),  # and a device that does not exist
        ("", []),
        ("-1", []),
    ],
)
def test_visible_list(fake: Fake, value: str, uuids: list[str]) -> None:
    fake.env["CUDA_VISIBLE_DEVICES"] = value
    got = fake.one("viaproc", "visible")
    if uuids:
        assert got == {"op": "visible", "rc": 0, "count": len(uuids), "uuids": uuids}
    else:
        assert got["rc"] == 100  # cuInit: CUDA_ERROR_NO_DEVICE


def test_ordinals_map_to_physical_devices(fake: Fake) -> None:
    fake.env["CUDA_VISIBLE_DEVICES"] = "1"
    p = fake.start("direct")
    p.ok("use 0")
    assert p.ok("getdev")["dev"] == 0
    assert p.ok("dev 0")["uuid"] == U1 and p.ok("dev 0")["total"] == 4096 * MIB
    assert p.ok("uuid 0") == {"op": "uuid", "rc": 0, "dev": 0, "uuid": U1}
    assert p.ok("uuid 0 legacy")["uuid"] == U1  # cuDeviceGetUuid too
    assert p.ok("attr 0 33")["value"] == 1  # CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
    assert p.do("ctx 1")["rc"] == 101  # CUDA_ERROR_INVALID_DEVICE
    # every allocation path lands on physical device 1 (fake_* exports are physical)
    for op, charged in [
        ("alloc 0 64m", 64 * MIB),
        ("async 0 64m", 64 * MIB),
        ("defpoolalloc 0 2m", 2 * MIB),
        ("memcreate 0 2m", 2 * MIB),
        ("vmm 0 4m", 4 * MIB),
    ]:
        before = p.used(1)
        p.ok(op)
        assert p.used(1) - before == charged, op
    pool = p.ok("pool 0")["id"]  # props.location.id = ordinal 0
    p.ok(f"poolalloc {pool} 8m")
    graph = p.ok("graphalloc 0 2m")["id"]
    p.ok(f"graphlaunch {graph}")
    assert p.used(0) == 0
    assert p.ok("info")["total"] == 4096 * MIB
    assert p.ok("gran 0")["granularity"] == 2 * MIB


def test_reordered_devices(fake: Fake) -> None:
    fake.env["CUDA_VISIBLE_DEVICES"] = f"{U1},{U0}"
    p = fake.start("viaproc")
    p.ok("use 1")
    assert p.ok("getdev")["dev"] == 1
    p.ok("alloc 1 1g")  # ordinal 1 = physical 0
    assert (p.used(0), p.used(1)) == (CTX + 1024 * MIB, 0)
    p.ok("ctx 0")
    assert p.ok("getdev")["dev"] == 0
    assert p.used(1) == CTX


def test_nvml_ignores_it(fake: Fake) -> None:
    fake.env["CUDA_VISIBLE_DEVICES"] = "1"
    p = fake.start("viaproc")
    p.ok("alloc 0 1g")
    nv = fake.nvml()
    assert nv.do("count") == {"count": 2}
    assert nv.do("procs 0")["v3"]["procs"] == {}
    assert nv.do("procs 1")["v3"]["procs"] == {str(p.pid): CTX + 1024 * MIB}
