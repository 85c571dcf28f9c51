"""VMM references and sharing, as the real driver has them: cuMemRetainAllocationHandle
returns the mapping's own handle with one more reference; an allocation created with
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR exports to an fd that cuMemImportFromShareableHandle
turns into a new handle.  The physical memory lives while any handle to it is unreleased,
any mapping of it remains or any exported fd is open, and stays charged to the creating
process (NVML, cuMemGetInfo) all that time."""

from __future__ import annotations

from typing import Any

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB
INVALID_VALUE = 1


def seen(fake: Fake, nv: Interactive, p: Interactive, total: int) -> None:
    """p's memory on device 0 is total for cuMemGetInfo and NVML (per process and device).
    cuMemGetInfo first: a driver call is where the fake notices closed exported fds."""
    info = p.ok("info")
    assert info["total"] - info["free"] == total
    procs: Any = nv.do("procs 0")
    assert procs["v3"]["procs"] == {str(p.pid): total}, procs
    assert p.used() == total


def test_retain_returns_the_same_handle_and_keeps_the_memory(fake: Fake) -> None:
    p, nv = fake.start("viaproc"), fake.nvml()
    p.ok("use 0")
    v = p.ok("vmm 0 4m")
    r1 = p.ok(f"retain {v['id']}")
    assert r1["handle"] == v["handle"] and r1["same"] == 1
    r2 = p.ok(f"retain {v['id']} 2m")  # any address inside the mapping
    assert r2["handle"] == v["handle"]
    p.ok(f"memrelease {v['id']}")
    p.ok(f"unmap {v['id']}")
    seen(fake, nv, p, CTX + 4 * MIB)  # two retained references left
    p.ok(f"memrelease {r1['id']}")
    seen(fake, nv, p, CTX + 4 * MIB)
    p.ok(f"memrelease {r2['id']}")
    seen(fake, nv, p, CTX)
    assert p.do(f"memrelease {r2['id']}")["rc"] == INVALID_VALUE


def test_retain_through_getprocaddress_and_direct(fake: Fake) -> None:
    for prog in ("direct", "viadlsym"):
        out = fake.run(
            prog,
            "vmm 0 2m; retain 0; memrelease 0; unmap 0; memrelease 1; fake_device_used_bytes 0",
        )
        assert [o["rc"] for o in out] == [0] * 6, out
        assert out[1]["same"] == 1 and out[-1]["value"] == 0


def test_retain_of_an_unmapped_address_fails(fake: Fake) -> None:
    p = fake.start("viaproc")
    v = p.ok("vmm 0 2m")["id"]
    p.ok(f"unmap {v}")
    assert p.do(f"retain {v}")["rc"] == INVALID_VALUE  # the address it was mapped at
    assert p.do("retain 0x0")["rc"] == INVALID_VALUE  # NULL
    assert p.do("retain 0x12345000")["rc"] == INVALID_VALUE
    p.ok(f"memrelease {v}")
    assert p.used() == 0


def test_export_import_in_one_process(fake: Fake) -> None:
    p, nv = fake.start("viaproc"), fake.nvml()
    p.ok("use 0")
    v = p.ok("vmm 0 6m fd")
    fd = p.ok(f"export {v['id']}")["fd"]
    assert fd >= 0
    imp = p.ok(f"import {fd}")
    assert imp["handle"] != v["handle"]  # a new handle to the same memory
    p.ok(f"closefd {fd}")
    p.ok(f"memrelease {v['id']}")
    p.ok(f"unmap {v['id']}")
    seen(fake, nv, p, CTX + 6 * MIB)  # the imported handle keeps it
    m = p.ok(f"map {imp['id']} 6m 0")  # and maps it
    p.ok(f"memrelease {imp['id']}")
    seen(fake, nv, p, CTX + 6 * MIB)  # mapped
    r = p.ok(f"retain {m['id']}")
    assert r["handle"] == imp["handle"]  # the handle the mapping was made with
    p.ok(f"unmap {m['id']}")
    seen(fake, nv, p, CTX + 6 * MIB)
    p.ok(f"memrelease {r['id']}")
    seen(fake, nv, p, CTX)


def test_an_open_exported_fd_keeps_the_memory(fake: Fake) -> None:
    # cuda.h: "Once all shareable handles are closed and the allocation is released, the
    # allocated memory referenced will be released"
    p, nv = fake.start("viaproc"), fake.nvml()
    p.ok("use 0")
    v = p.ok("vmm 0 2m fd")["id"]
    fd = p.ok(f"export {v}")["fd"]
    p.ok(f"memrelease {v}")
    p.ok(f"unmap {v}")
    seen(fake, nv, p, CTX + 2 * MIB)
    again = p.ok(f"import {fd}")  # still importable
    p.ok(f"memrelease {again['id']}")
    seen(fake, nv, p, CTX + 2 * MIB)
    p.ok(f"closefd {fd}")
    seen(fake, nv, p, CTX)  # noticed at the next driver call (cuMemGetInfo here)
    assert p.do(f"import {fd}")["rc"] == INVALID_VALUE  # closed


def test_import_in_another_process_keeps_the_creators_memory(fake: Fake) -> None:
    a, b, nv = fake.start("viaproc"), fake.start("direct"), fake.nvml()
    a.ok("use 0")
    v = a.ok("vmm 0 4m fd")["id"]
    fd = a.ok(f"export {v}")["fd"]
    imp = b.ok(f"import /proc/{a.pid}/fd/{fd}")  # opened, imported, closed again
    b.ok(f"map {imp['id']} 4m 0")
    a.ok(f"closefd {fd}")
    a.ok(f"memrelease {v}")
    a.ok(f"unmap {v}")
    seen(fake, nv, a, CTX + 4 * MIB)  # the creator's, while b holds it
    b.ok(f"free {imp['id']}")  # unmap + release
    seen(fake, nv, a, CTX)


def test_export_needs_a_shareable_allocation(fake: Fake) -> None:
    p = fake.start("viaproc")
    v = p.ok("vmm 0 2m")["id"]  # requestedHandleTypes NONE
    out = p.do(f"export {v}")
    assert out["rc"] == INVALID_VALUE and out["fd"] == -1
    assert p.do("import -1")["rc"] == INVALID_VALUE
    assert p.do("import 0")["rc"] == INVALID_VALUE  # stdin: not an exported handle
    p.ok(f"free {v}")
    assert p.used() == 0
