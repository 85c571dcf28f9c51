"""Device memory the driver takes outside explicit allocations, as a real one does: each
loaded module (FAKECUDA_MODULE_MIB), the limits of cuCtxSetLimit (the stack for every
resident thread, the malloc heap, the printf FIFO) and a context's growth at its first
kernel launch (FAKECUDA_CTX_GROW_MIB). Each is charged to the device and to the process
(NVML's per-process figure and the device's used memory, cuMemGetInfo), counts against the
device's capacity, and goes back with the module / the smaller limit / the context. Run
without the shim."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB
SMS = 108  # the FAKECUDA_SMS default
THREADS_PER_SM = 2048  # compute capability 8.0
DEV0 = 8192 * MIB  # the fixture's FAKECUDA_DEVICES=8192,4096
DEV1 = 4096 * MIB


def nvml_self(p: Interactive, dev: int = 0) -> dict[str, Any]:
    """The interpreter's own NVML view of dev (nvmlDeviceGetMemoryInfo, its process row)."""
    return p.ok(f"nvml {dev}")


def check_everywhere(fake: Fake, p: Interactive, expect: int, dev: int = 0) -> None:
    """expect bytes held by p on dev, as every view sees them: the fake's device total,
    cuMemGetInfo, NVML in p itself and NVML in another process (v3, v2, v1 lists)."""
    total = DEV0 if dev == 0 else DEV1
    assert p.used(dev) == expect
    p.ok(f"use {dev}")
    info = p.ok("info")
    assert (info["free"], info["total"]) == (total - expect, total)
    mine = nvml_self(p, dev)
    assert (mine["used"], mine["free"], mine["self"]) == (expect, total - expect, expect)
    assert mine["procs"] == [[p.pid, expect]]
    nv = fake.nvml()
    procs = nv.do(f"procs {dev}")
    for v in ("v3", "v2", "v1"):
        assert procs[v]["procs"] == {str(p.pid): expect}, (v, procs)


# ---- modules ----

@pytest.mark.parametrize("how", ["data", "dataex", "fatbin", "file", "library", "libfile"])
def test_each_module_takes_memory_until_unloaded(fake: Fake, how: str) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_MODULE_MIB": "64"})
    p.ok("use 0")
    check_everywhere(fake, p, CTX)
    a = p.ok(f"module 0 {how}")["id"]
    b = p.ok(f"module 0 {how}")["id"]
    check_everywhere(fake, p, CTX + 128 * MIB)
    assert p.ok(f"unmodule {a}")["id"] == a
    check_everywhere(fake, p, CTX + 64 * MIB)
    assert p.do(f"unmodule {a}")["rc"] == 1  # the interpreter's id is gone
    p.ok(f"free {b}")  # the same as unmodule
    check_everywhere(fake, p, CTX)


def test_modules_take_nothing_by_default(fake: Fake) -> None:
    p = fake.start("direct")
    p.ok("use 0")
    for how in ("data", "dataex", "fatbin", "file", "library", "libfile"):
        p.ok(f"module 0 {how}")
    p.ok("launch 1")  # the interpreter's own module, and the first launch
    assert p.used() == CTX


def test_a_module_that_does_not_fit_fails_with_oom(fake: Fake) -> None:
    p = fake.start("viadlsym", env={"FAKECUDA_MODULE_MIB": "2000"})
    p.ok("use 1")
    p.ok("module 1")
    assert p.used(1) == CTX + 2000 * MIB
    for how in ("data", "dataex", "fatbin", "file", "library", "libfile"):
        r = p.do(f"module 1 {how}")
        assert (r["rc"], r["id"]) == (2, -1), r  # CUDA_ERROR_OUT_OF_MEMORY, no module
    assert p.used(1) == CTX + 2000 * MIB
    # the interpreter's kernel needs a module too: the launch cannot happen
    assert p.do("launch 1")["rc"] == 2


def test_a_context_takes_its_modules_with_it(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_MODULE_MIB": "64"})
    p.ok("use 0")
    ctx = p.ok("ctx 0")["id"]  # created and current
    mod = p.ok("module 0")["id"]
    lib = p.ok("module 0 library")["id"]
    p.ok("launch 1")  # the interpreter's module, loaded in that context
    check_everywhere(fake, p, 2 * CTX + 3 * 64 * MIB)
    p.ok(f"free {ctx}")  # cuCtxDestroy: the modules go, and their handles
    assert p.used() == CTX
    assert p.do(f"unmodule {mod}")["rc"] == 400  # CUDA_ERROR_INVALID_HANDLE
    p.ok("launch 1")  # in the primary context: its own module now
    assert p.used() == CTX + 64 * MIB
    p.ok(f"unmodule {lib}")  # the library outlives the context; nothing left to free
    assert p.used() == CTX + 64 * MIB
    p.ok("release 0")  # the primary context's module goes with it
    assert p.used() == 0


def test_a_library_loads_into_each_context_that_needs_it(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_MODULE_MIB": "64"})
    p.ok("use 0")
    lib = p.ok("module 0 library")["id"]  # into the current (primary) context at once
    assert p.used() == CTX + 64 * MIB
    m1 = p.ok(f"libmodule {lib}")["handle"]
    assert p.ok(f"libmodule {lib}")["handle"] == m1  # already loaded there
    assert p.used() == CTX + 64 * MIB
    ctx = p.ok("ctx 0")["id"]
    assert p.used() == 2 * CTX + 64 * MIB  # not loaded in the new context yet
    f = p.ok(f"libfunc {lib} fake_ns_10")["handle"]  # needs it there: loaded
    assert p.ok(f"libfunc {lib} fake_ns_10")["handle"] == f
    assert p.ok(f"libmodule {lib}")["handle"] != m1
    check_everywhere(fake, p, 2 * CTX + 128 * MIB)
    p.ok(f"free {ctx}")
    assert p.used() == CTX + 64 * MIB
    p.ok(f"unmodule {lib}")  # cuLibraryUnload: its module in every context
    assert p.used() == CTX
    assert p.do(f"libmodule {lib}")["rc"] == 1  # the interpreter's id is gone


# ---- cuCtxSetLimit ----

def test_limits_start_at_the_real_defaults(fake: Fake) -> None:
    p = fake.start("direct")
    p.ok("use 0")
    assert p.ok("getlimit stack")["value"] == 1024
    assert p.ok("getlimit heap")["value"] == 8 * MIB
    assert p.ok("getlimit fifo")["value"] == 1 * MIB
    assert p.ok("getlimit 3")["value"] == 2  # CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
    assert p.ok("getlimit 4")["value"] == 2048  # CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
    assert p.do("getlimit 11")["rc"] == 215  # CU_LIMIT_MAX: CUDA_ERROR_UNSUPPORTED_LIMIT
    assert p.do("setlimit 8 1")["rc"] == 1  # CU_LIMIT_CIG_ENABLED is query-only
    assert p.used() == CTX


@pytest.mark.parametrize("sms", [SMS, 20])
def test_stack_is_reserved_for_every_resident_thread(fake: Fake, sms: int) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_SMS": str(sms)})
    p.ok("use 0")
    threads = sms * THREADS_PER_SM
    p.ok("setlimit stack 4096")
    assert p.ok("getlimit stack")["value"] == 4096
    check_everywhere(fake, p, CTX + (4096 - 1024) * threads)
    p.ok("setlimit stack 2048")  # smaller: gives the difference back
    assert p.used() == CTX + (2048 - 1024) * threads
    # more than the device has: OUT_OF_MEMORY, the limit and the memory unchanged
    too_big = DEV0 // threads + 1024
    assert p.do(f"setlimit stack {too_big}")["rc"] == 2
    assert p.ok("getlimit stack")["value"] == 2048
    assert p.used() == CTX + (2048 - 1024) * threads
    assert p.do("setlimit stack 0x7fffffffffffffff")["rc"] == 2  # overflows: cannot fit
    p.ok("setlimit stack 512")  # below the default: only the growth was extra
    assert p.ok("getlimit stack")["value"] == 512
    check_everywhere(fake, p, CTX)


def test_stack_growth_counts_against_capacity(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 1")
    threads = SMS * THREADS_PER_SM
    big = p.ok("alloc 1 3000m")["id"]
    # (8192 - 1024) x 221184 = 1512 MiB does not fit beside 300 + 3000 MiB on 4096 MiB
    assert p.do("setlimit stack 8192")["rc"] == 2
    assert p.ok("getlimit stack")["value"] == 1024
    assert p.used(1) == CTX + 3000 * MIB
    p.ok(f"free {big}")
    p.ok("setlimit stack 8192")
    assert p.used(1) == CTX + (8192 - 1024) * threads
    # and now an allocation that no longer fits fails
    free = DEV1 - CTX - (8192 - 1024) * threads
    assert p.do(f"alloc 1 {free + 1}")["rc"] == 2
    p.ok(f"alloc 1 {free}")


def test_heap_and_fifo_take_their_size(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 0")
    p.ok("setlimit heap 1g")
    assert p.ok("getlimit heap")["value"] == 1024 * MIB
    check_everywhere(fake, p, CTX + 1016 * MIB)  # beyond the default 8 MiB
    p.ok("setlimit fifo 33m")
    assert p.ok("getlimit fifo")["value"] == 33 * MIB
    check_everywhere(fake, p, CTX + 1016 * MIB + 32 * MIB)
    assert p.do("setlimit heap 8g")["rc"] == 2  # does not fit
    assert p.ok("getlimit heap")["value"] == 1024 * MIB
    assert p.used() == CTX + 1048 * MIB
    p.ok("setlimit heap 4m")  # below the default: the growth goes, no more
    p.ok("setlimit fifo 1m")
    assert p.ok("getlimit heap")["value"] == 4 * MIB
    check_everywhere(fake, p, CTX)


def test_limits_go_with_the_context(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 0")
    p.ok("setlimit heap 108m")
    ctx = p.ok("ctx 0")["id"]
    assert p.ok("getlimit heap")["value"] == 8 * MIB  # a new context: the defaults
    p.ok("setlimit stack 2048")
    p.ok("setlimit fifo 11m")
    threads = SMS * THREADS_PER_SM
    assert p.used() == 2 * CTX + 100 * MIB + 1024 * threads + 10 * MIB
    p.ok(f"free {ctx}")
    assert p.used() == CTX + 100 * MIB
    p.ok("release 0")
    assert p.used() == 0
    p.ok("use 0")  # the primary context again: defaults, nothing extra
    assert p.ok("getlimit heap")["value"] == 8 * MIB
    assert p.used() == CTX


# ---- lazy growth at the first launch ----

@pytest.mark.parametrize("launch", ["launch 1", "launchex 1", "coop 1", "graph 1 2"])
def test_context_grows_at_its_first_launch(fake: Fake, launch: str) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_CTX_GROW_MIB": "50"})
    p.ok("use 0")
    p.ok("kernel")  # a module (FAKECUDA_MODULE_MIB 0) and a function: no launch yet
    assert p.used() == CTX
    p.ok(launch)
    check_everywhere(fake, p, CTX + 50 * MIB)
    p.ok(launch)
    p.ok("launch 3")
    assert p.used() == CTX + 50 * MIB  # once per context
    ctx = p.ok("ctx 0")["id"]
    p.ok(launch)
    assert p.used() == 2 * CTX + 100 * MIB
    p.ok("sync")
    p.ok(f"free {ctx}")
    assert p.used() == CTX + 50 * MIB
    p.ok("release 0")
    assert p.used() == 0
    p.ok("use 0")
    assert p.used() == CTX  # a new primary context has not launched yet
    p.ok(launch)
    assert p.used() == CTX + 50 * MIB


def test_a_first_launch_without_room_fails_and_runs_nothing(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_CTX_GROW_MIB": "1000"})
    p.ok("use 1")
    p.ok("kernel")
    big = p.ok("alloc 1 3000m")["id"]
    t0 = p.ok("fake_now_ns")["value"]
    r = p.do("launch 1")
    assert (r["rc"], r["launches"]) == (2, 0)
    assert p.do("graph 1 1")["rc"] == 2
    p.ok("sync")
    host = p.ok("hostpid")["hostpid"]
    assert p.ok(f"fake_busy_ns 1 {host} {t0}")["value"] == 0  # nothing ran
    assert p.used(1) == CTX + 3000 * MIB
    p.ok(f"free {big}")
    p.ok("launch 1")  # not grown yet: the next launch tries again
    assert p.used(1) == CTX + 1000 * MIB
    # the grown context leaves less room for allocations
    assert p.do(f"alloc 1 {DEV1 - CTX - 1000 * MIB + 1}")["rc"] == 2
