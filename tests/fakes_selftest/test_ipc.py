"""Legacy CUDA IPC, as the real driver has it: cuIpcGetMemHandle names a cuMemAlloc
allocation in a 64-byte handle; cuIpcOpenMemHandle in another process maps the same memory
at an address of its own (a second open there: the same address, one more reference), in
the exporting process it fails with INVALID_CONTEXT, a stale or unknown handle with
INVALID_HANDLE; cuIpcCloseMemHandle gives each open back.  Freeing the exported allocation
while it is open elsewhere ("undefined" in the docs) does what a real driver does: the
memory stays until the last opener closes, and NVML keeps counting it for the exporter
(for an opener once the exporter exited)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB
INVALID_VALUE = 1
INVALID_CONTEXT = 201
INVALID_HANDLE = 400


def procs(nv: Interactive) -> dict[str, int]:
    got: Any = nv.do("procs 0")
    return got["v3"]["procs"]


def export(a: Interactive, size: str) -> tuple[int, str]:
    a.ok("use 0")
    i = a.ok(f"alloc 0 {size}")["id"]
    h = a.ok(f"ipcget {i}")["handle"]
    assert len(h) == 128  # CU_IPC_HANDLE_SIZE bytes
    return i, h


@pytest.mark.parametrize("prog", ["viaproc", "direct", "viadlsym"])
def test_open_maps_the_exporters_memory_in_another_process(fake: Fake, prog: str) -> None:
    a, b, nv = fake.start("viaproc"), fake.start(prog), fake.nvml()
    i, h = export(a, "64m")
    assert a.ok(f"ipcget {i}")["handle"] == h  # one handle per allocation
    b.ok("use 0")
    o1 = b.ok(f"ipcopen {h}")
    o2 = b.ok(f"ipcopen {h} 1")
    assert o1["ptr"] == o2["ptr"]  # opened twice: the same address
    assert b.do(f"ipcget {o1['ptr']}")["rc"] == INVALID_VALUE  # not this process's allocation
    assert a.used() == 2 * CTX + 64 * MIB  # the same memory, not a copy
    assert procs(nv) == {str(a.pid): CTX + 64 * MIB, str(b.pid): CTX}
    b.ok(f"ipcclose {o1['id']}")
    b.ok(f"ipcclose {o2['id']}")
    assert b.do(f"ipcclose {o1['ptr']}")["rc"] == INVALID_VALUE  # every open closed
    a.ok(f"free {i}")
    assert a.used() == 2 * CTX
    assert b.do(f"ipcopen {h}")["rc"] == INVALID_HANDLE  # stale: freed, nobody held it


def test_the_legacy_open_name_is_the_same(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    i, h = export(a, "2m")
    o = b.ok(f"ipcopen {h} 1 v1")
    b.ok(f"ipcclose {o['id']}")
    a.ok(f"free {i}")


def test_open_in_the_exporting_process_and_bad_handles_fail(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    i, h = export(a, "2m")
    assert a.do(f"ipcopen {h}")["rc"] == INVALID_CONTEXT
    b.ok("use 0")
    assert b.do("ipcopen 00")["rc"] == INVALID_HANDLE  # not a handle at all
    forged = h[:16] + "ff" + h[18:]  # another entry of the table
    assert b.do(f"ipcopen {forged}")["rc"] == INVALID_HANDLE
    assert b.do(f"ipcopen {h} 2")["rc"] == INVALID_VALUE  # an unknown flag
    assert a.do("ipcget 0x12345000")["rc"] == INVALID_VALUE  # not an allocation
    assert b.do("ipcclose 0x12345000")["rc"] == INVALID_VALUE
    p = a.ok("defpoolalloc 0 2m")["id"]  # pool memory cannot be exported this way
    assert a.do(f"ipcget {p}")["rc"] == INVALID_VALUE
    a.ok(f"free {i}")


def test_a_free_before_the_importer_closes_keeps_the_memory_for_the_opener(fake: Fake) -> None:
    """As on a real driver (an H200, driver 580): NVML counts the allocation for the
    exporter while it holds it, for the opener once the exporter has freed it."""
    a, b, nv = fake.start("viaproc"), fake.start("viaproc"), fake.nvml()
    i, h = export(a, "100m")
    b.ok("use 0")
    o = b.ok(f"ipcopen {h}")
    assert procs(nv) == {str(a.pid): CTX + 100 * MIB, str(b.pid): CTX}  # the exporter's
    a.ok(f"free {i}")
    assert a.used() == 2 * CTX + 100 * MIB  # still allocated ...
    assert procs(nv) == {str(a.pid): CTX, str(b.pid): CTX + 100 * MIB}  # ... the opener's
    info = a.ok("info")
    assert info["total"] - info["free"] == 2 * CTX + 100 * MIB
    assert b.do(f"ipcopen {h}")["ptr"] == o["ptr"]  # still open here: one more reference
    b.ok(f"ipcclose {o['id']}")
    assert a.used() == 2 * CTX + 100 * MIB
    b.ok(f"ipcclose {o['ptr']}")  # the last close frees it
    assert a.used() == 2 * CTX
    assert procs(nv) == {str(a.pid): CTX, str(b.pid): CTX}
    assert b.do(f"ipcopen {h}")["rc"] == INVALID_HANDLE


def test_an_exporter_that_exits_leaves_the_memory_to_an_opener(fake: Fake) -> None:
    a, b, c, nv = fake.start("viaproc"), fake.start("viaproc"), fake.start("viaproc"), fake.nvml()
    _, h = export(a, "50m")
    b.ok("use 0")
    c.ok("use 0")
    ob = b.ok(f"ipcopen {h}")
    oc = c.ok(f"ipcopen {h}")
    a.kill()
    assert b.used() == 2 * CTX + 50 * MIB  # a's context went; the memory stays
    mine = procs(nv)
    assert sorted(mine.values()) == [CTX, CTX + 50 * MIB]  # one opener carries it
    holder, other = (b, c) if mine[str(b.pid)] > CTX else (c, b)
    holder.ok(f"ipcclose {(ob if holder is b else oc)['id']}")
    assert b.used() == 2 * CTX + 50 * MIB
    assert procs(nv) == {str(holder.pid): CTX, str(other.pid): CTX + 50 * MIB}
    other.kill()  # the last opener exits without closing
    assert holder.used() == CTX
    assert holder.do(f"ipcopen {h}")["rc"] == INVALID_HANDLE


def test_an_opener_that_exits_stops_holding_it(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    i, h = export(a, "8m")
    b.ok("use 0")
    b.ok(f"ipcopen {h}")
    b.kill()
    a.ok(f"free {i}")
    assert a.used() == CTX


def test_destroying_the_openers_context_closes_it(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    i, h = export(a, "8m")
    b.ok("use 0")
    b.ok(f"ipcopen {h}")
    a.ok(f"free {i}")
    assert a.used() == 2 * CTX + 8 * MIB
    b.ok("reset 0")  # the primary context goes, and its mappings with it
    assert a.used() == CTX
