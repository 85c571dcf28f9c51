"""Stream-ordered pools keep memory, as the real ones do: a reserve (physical, charged to
the device and the process) grows in 2 MiB steps, frees return bytes to the pool, and only
synchronisation points (down to the release threshold), cuMemPoolTrimTo, pool destruction,
context teardown and process exit give memory back."""

from __future__ import annotations

import pytest

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB


def attrs(p: Interactive, pool: int) -> tuple[int, int]:
    a = p.ok(f"poolattr {pool}")
    return a["used"], a["reserved"]


def test_reserve_is_reused_and_grows_in_2mib_steps(fake: Fake) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    x = p.ok(f"poolalloc {pool} 6m")["id"]
    assert attrs(p, pool) == (6 * MIB, 6 * MIB)
    p.ok(f"free {x}")
    assert attrs(p, pool) == (0, 6 * MIB)
    y = p.ok(f"poolalloc {pool} 4m")["id"]  # taken from the reserve
    assert attrs(p, pool) == (4 * MIB, 6 * MIB)
    z = p.ok(f"poolalloc {pool} 3m")["id"]  # 2 MiB free, 1 missing: grows by 2 MiB
    assert attrs(p, pool) == (7 * MIB, 8 * MIB)
    assert p.used() == CTX + 8 * MIB
    p.ok(f"free {y}")
    p.ok(f"free {z}")
    a = p.ok(f"poolattr {pool}")
    assert (a["usedhigh"], a["reservedhigh"]) == (7 * MIB, 8 * MIB)
    assert p.used() == CTX + 8 * MIB  # nothing released without a sync point


def test_mem_free_of_a_pool_pointer_returns_it_to_the_pool(fake: Fake) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    ptr = p.ok(f"poolalloc {pool} 5m")["ptr"]
    p.ok(f"freeptr {ptr}")  # cuMemFree_v2
    assert attrs(p, pool) == (0, 6 * MIB)
    assert p.do(f"freeasync {ptr}")["rc"] == 1  # gone


@pytest.mark.parametrize("sync", ["sync", "streamsync 1", "eventsync"])
def test_sync_points_release_down_to_the_threshold(fake: Fake, sync: str) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    assert p.ok("stream")["id"] == 1
    p.ok(f"poolsetattr {pool} threshold 5m")
    keep = p.ok(f"poolalloc {pool} 1m")["id"]
    big = p.ok(f"poolalloc {pool} 20m")["id"]
    assert attrs(p, pool) == (21 * MIB, 22 * MIB)
    p.ok(f"free {big}")
    p.ok(sync)
    assert attrs(p, pool) == (MIB, 6 * MIB)  # round_up(max(5 MiB, 1 MiB), 2 MiB)
    assert p.used() == CTX + 6 * MIB
    p.ok(f"poolsetattr {pool} threshold 0")
    p.ok(sync)
    assert attrs(p, pool) == (MIB, 2 * MIB)  # used memory stays
    p.ok(f"free {keep}")
    p.ok(sync)
    assert attrs(p, pool) == (0, 0)
    assert p.used() == CTX


def test_trim_and_attributes(fake: Fake) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    p.ok(f"poolsetattr {pool} threshold 1g")  # syncs release nothing now
    x = p.ok(f"poolalloc {pool} 10m")["id"]
    p.ok(f"poolalloc {pool} 3m")
    p.ok(f"free {x}")
    p.ok("sync")
    assert attrs(p, pool) == (3 * MIB, 14 * MIB)
    p.ok(f"trim {pool} 7m")
    assert attrs(p, pool) == (3 * MIB, 8 * MIB)  # round_up(max(7 MiB, 3 MiB), 2 MiB)
    p.ok(f"trim {pool} 0")
    assert attrs(p, pool) == (3 * MIB, 4 * MIB)
    assert p.used() == CTX + 4 * MIB
    a = p.ok(f"poolattr {pool}")
    assert (a["usedhigh"], a["reservedhigh"], a["threshold"]) == (13 * MIB, 14 * MIB, 1 << 30)
    p.ok(f"poolsetattr {pool} usedhigh 0")
    p.ok(f"poolsetattr {pool} reservedhigh 0")
    a = p.ok(f"poolattr {pool}")
    assert (a["usedhigh"], a["reservedhigh"]) == (3 * MIB, 4 * MIB)
    assert p.do(f"poolsetattr {pool} usedhigh 5")["rc"] == 1  # only 0 resets
    assert p.do(f"poolsetattr {pool} used 0")["rc"] == 1  # read-only
    assert p.do(f"poolsetattr {pool} reserved 0")["rc"] == 1
    p.ok(f"poolsetattr {pool} opportunistic 0")  # accepted, ignored
    assert p.ok(f"poolattr {pool}")["opportunistic"] == 0


def test_reserve_is_physical_memory_of_the_process(fake: Fake) -> None:
    p = fake.start("viaproc")
    q = fake.start("direct")
    pool = p.ok("pool 0")["id"]
    x = p.ok(f"poolalloc {pool} 7000m")["id"]
    p.ok(f"free {x}")  # reserved, unused
    nv = fake.nvml()
    assert nv.do("procs 0")["v3"]["procs"] == {str(p.pid): CTX + 7000 * MIB}
    assert q.do("alloc 0 1000m")["rc"] == 2  # the reserve is not free for others
    p.ok("sync")
    q.ok("alloc 0 1000m")


def test_out_of_memory(fake: Fake) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    assert p.do(f"poolalloc {pool} 8000m")["rc"] == 2
    assert attrs(p, pool) == (0, 0)
    assert p.do("async 0 8000m")["rc"] == 2


def test_pool_device_not_the_current_one(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 0")
    pool = p.ok("pool 1")["id"]
    p.ok("use 0")
    p.ok(f"poolalloc {pool} 10m")
    assert p.used(1) == CTX + 10 * MIB  # device 1's context (from "pool 1") + the reserve
    assert p.used(0) == CTX


def test_default_and_current_pools(fake: Fake) -> None:
    p = fake.start("viaproc")
    default = p.ok("defpool 0")["id"]
    mine = p.ok("pool 0")["id"]
    p.ok("async 0 2m")
    assert attrs(p, default) == (2 * MIB, 2 * MIB)
    p.ok(f"setpool 0 {mine}")
    current = p.ok("curpool 0")["pool"]
    assert current != p.ok("defpool 0")["pool"]
    p.ok("async 0 4m")  # cuMemAllocAsync: from the device's current pool
    assert attrs(p, mine) == (4 * MIB, 4 * MIB)
    assert attrs(p, default) == (2 * MIB, 2 * MIB)
    assert p.do(f"free {default}")["rc"] == 1  # the default pool cannot be destroyed


def test_destroy_releases_the_unused_reserve(fake: Fake) -> None:
    p = fake.start("viaproc")
    pool = p.ok("pool 0")["id"]
    p.ok(f"poolsetattr {pool} threshold 1g")
    x = p.ok(f"poolalloc {pool} 4m")["id"]
    y = p.ok(f"poolalloc {pool} 2m")["id"]
    p.ok(f"free {x}")
    assert p.used() == CTX + 6 * MIB
    p.ok(f"free {pool}")  # cuMemPoolDestroy: y still allocated
    assert p.used() == CTX + 2 * MIB
    p.ok(f"free {y}")  # the last allocation of a destroyed pool gives the rest back
    assert p.used() == CTX


@pytest.mark.parametrize("how", ["destroy", "exit"])
def test_context_teardown_and_exit_give_everything_back(fake: Fake, how: str) -> None:
    p = fake.start("viaproc")
    ctx = p.ok("ctx 0")["id"]
    pool = p.ok("pool 0")["id"]
    p.ok(f"poolsetattr {pool} threshold 1g")
    p.ok(f"poolalloc {pool} 10m")
    x = p.ok("async 0 6m")["id"]
    p.ok(f"free {x}")
    p.ok("sync")  # the default pool (threshold 0) releases; the other keeps
    assert p.used() == CTX + 10 * MIB
    if how == "destroy":
        p.ok(f"free {ctx}")  # the only context on device 0
        assert p.used() == 0
        assert attrs(p, pool) == (0, 0)
    else:
        p.kill()
        assert fake.one("direct", "fake_device_used_bytes 0")["value"] == 0
