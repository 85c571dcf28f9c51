"""Pool IPC, as the real driver has it: a pool created with a POSIX file descriptor
handle type is exported by cuMemPoolExportToShareableHandle (an fd the other process
receives, here through /proc/PID/fd); cuMemPoolImportFromShareableHandle makes an imported
pool there, which allocates nothing; cuMemPoolExportPointer names one allocation of the
pool in 64 bytes, and cuMemPoolImportPointer maps it into the importer, which frees it with
cuMemFree(Async). The exporter freeing it first (the docs: the importers must free first)
is modelled the worst way for a limit, as legacy IPC's: the memory leaves the pool's
reserve but stays allocated, counted by NVML for the exporter, until the last importer
frees it."""

from __future__ import annotations

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB
INVALID_VALUE = 1


def shared_pool(a: Interactive, size: str) -> tuple[int, str, str, int]:
    """A's ipc pool, exported, one allocation of it exported: (pool id, address, export
    data, the pool's descriptor). A pointer of a pool not exported yet is refused."""
    a.ok("use 0")
    pool = a.ok("pool 0 ipc")["id"]
    ptr = a.ok(f"poolalloc {pool} {size}")["ptr"]
    assert a.do(f"ptrexport {ptr}")["rc"] == INVALID_VALUE
    fd = a.ok(f"poolexport {pool}")["fd"]
    data = a.ok(f"ptrexport {ptr}")["data"]
    assert len(data) == 128
    return pool, ptr, data, fd


def imported(b: Interactive, a: Interactive, fd: int) -> int:
    b.ok("use 0")
    return int(b.ok(f"poolimport /proc/{a.pid}/fd/{fd}")["id"])


def test_an_imported_pointer_is_the_exporters_memory(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    pool, ptr, data, fd = shared_pool(a, "64m")
    theirs = imported(b, a, fd)
    got = b.ok(f"ptrimport {theirs} {data}")["ptr"]
    assert got != "0x0"
    assert a.used() == 2 * CTX + 64 * MIB  # mapped, not copied
    assert b.do(f"poolalloc {theirs} 2m")["rc"] == INVALID_VALUE  # imported pools allocate nothing
    b.ok(f"freeasync {got}")
    a.ok(f"freeasync {ptr}")
    a.ok("sync")
    a.ok(f"trim {pool} 0")
    assert a.used() == 2 * CTX


def test_freed_by_the_exporter_while_imported_it_stays_until_the_importer_frees(
        fake: Fake) -> None:
    a, b, nv = fake.start("viaproc"), fake.start("viaproc"), fake.nvml()
    pool, ptr, data, fd = shared_pool(a, "600m")
    got = b.ok(f"ptrimport {imported(b, a, fd)} {data}")["ptr"]
    a.ok(f"freeasync {ptr}")
    a.ok("sync")
    a.ok(f"trim {pool} 0")
    assert a.ok(f"poolattr {pool}")["reserved"] == 0  # out of the pool
    assert a.used() == 2 * CTX + 600 * MIB  # but still allocated
    procs = nv.do("procs 0")["v3"]["procs"]
    assert procs[str(a.pid)] == CTX + 600 * MIB  # and counted for the exporter
    b.ok(f"freeasync {got}")
    assert a.used() == 2 * CTX


def test_what_is_not_shareable_is_refused(fake: Fake) -> None:
    a, b = fake.start("viaproc"), fake.start("viaproc")
    a.ok("use 0")
    plain = a.ok("pool 0")["id"]  # no handle type: not exportable
    assert a.do(f"poolexport {plain}")["rc"] == INVALID_VALUE
    p = a.ok(f"poolalloc {plain} 2m")["ptr"]
    assert a.do(f"ptrexport {p}")["rc"] == INVALID_VALUE
    i = a.ok("alloc 0 2m")["ptr"]  # nor is a cuMemAlloc allocation
    assert a.do(f"ptrexport {i}")["rc"] == INVALID_VALUE
    _, _, data, fd = shared_pool(a, "2m")
    theirs = imported(b, a, fd)
    assert b.do(f"ptrimport {theirs} 00")["rc"] == INVALID_VALUE  # not export data
    own = b.ok("pool 0")["id"]  # a pointer is imported through an imported pool only
    assert b.do(f"ptrimport {own} {data}")["rc"] == INVALID_VALUE
