"""Graph memory nodes: addresses at add time, physical memory at launch (the device's graph
pool grows in 2 MiB steps and keeps it), frees in the graph leave it reserved, allocations
not freed in the graph stay used until cuMemFree/cuMemFreeAsync, cuDeviceGraphMemTrim
releases the unused reserve."""

from __future__ import annotations

import pytest

from .conftest import MIB, Fake, Interactive

CTX = 300 * MIB


def graphmem(p: Interactive, dev: int = 0) -> tuple[int, int, int, int]:
    g = p.ok(f"graphmem {dev}")
    return g["used"], g["reserved"], g["usedhigh"], g["reservedhigh"]


def test_alloc_and_free_in_one_graph(fake: Fake) -> None:
    p = fake.start("viaproc")
    g = p.ok("graphalloc 0 3m 1")
    assert (g["nodes"], g["types"]) == (2, [10, 11])  # MEM_ALLOC, MEM_FREE
    assert int(g["ptr"], 16) % (2 * MIB) == 0
    assert p.used() == CTX  # an address only, until a launch
    assert graphmem(p) == (0, 0, 0, 0)
    p.ok(f"graphlaunch {g['id']} 3")
    assert graphmem(p) == (0, 4 * MIB, 3 * MIB, 4 * MIB)  # freed in the graph: reserved
    assert p.used() == CTX + 4 * MIB
    nv = fake.nvml()
    assert nv.do("procs 0")["v3"]["procs"] == {str(p.pid): CTX + 4 * MIB}
    p.ok("sync")  # not a pool: syncs do not release graph memory
    assert p.used() == CTX + 4 * MIB
    p.ok("graphtrim 0")
    assert graphmem(p) == (0, 0, 3 * MIB, 4 * MIB)
    assert p.used() == CTX
    p.ok("graphmemreset 0")
    assert graphmem(p) == (0, 0, 0, 0)


@pytest.mark.parametrize("free", ["freeptr", "freeasync"])
def test_allocation_not_freed_in_the_graph(fake: Fake, free: str) -> None:
    p = fake.start("viaproc")
    g = p.ok("graphalloc 0 5m")
    assert (g["nodes"], g["types"]) == (1, [10, -1])
    p.ok(f"graphlaunch {g['id']}")
    assert graphmem(p)[:2] == (5 * MIB, 6 * MIB)
    assert p.do(f"graphlaunch {g['id']}")["rc"] == 1  # still allocated: no relaunch
    p.ok("graphtrim 0")  # in use: nothing to trim
    assert p.used() == CTX + 6 * MIB
    p.ok(f"{free} {g['ptr']}")
    assert graphmem(p)[:2] == (0, 6 * MIB)
    assert p.do(f"{free} {g['ptr']}")["rc"] == 1  # freed already
    p.ok(f"graphlaunch {g['id']}")  # the reserve covers it: no growth
    assert graphmem(p)[:2] == (5 * MIB, 6 * MIB)
    assert p.used() == CTX + 6 * MIB
    p.ok(f"free {g['id']}")  # graph and exec destroyed: the allocation stays until freed
    assert graphmem(p)[:2] == (5 * MIB, 6 * MIB)
    p.ok(f"freeptr {g['ptr']}")
    p.ok("graphtrim 0")
    assert p.used() == CTX


def test_graphs_share_the_device_reserve(fake: Fake) -> None:
    p = fake.start("viaproc")
    a = p.ok("graphalloc 0 3m 1")["id"]
    b = p.ok("graphalloc 0 4m 1")["id"]
    p.ok(f"graphlaunch {a}")
    p.ok(f"graphlaunch {b}")  # 4 MiB reserved from a's launch: enough
    assert graphmem(p)[:2] == (0, 4 * MIB)
    c = p.ok("graphalloc 0 4m")
    p.ok(f"graphlaunch {c['id']}")
    d = p.ok("graphalloc 0 1m 1")["id"]
    p.ok(f"graphlaunch {d}")  # 4 used of 4 reserved: grows by 2 MiB
    assert graphmem(p)[:2] == (4 * MIB, 6 * MIB)


def test_out_of_memory_at_launch(fake: Fake) -> None:
    p = fake.start("viaproc")
    g = p.ok("graphalloc 0 7900m 1")  # the address is free to get
    assert p.do(f"graphlaunch {g['id']}")["rc"] == 2  # the memory is not
    assert graphmem(p) == (0, 0, 0, 0)
    assert p.used() == CTX
    assert p.do("graphalloc 1 1m")["rc"] == 0
    assert p.do("graphalloc 2 1m")["rc"] != 0  # no device 2


def test_context_teardown_and_exit_give_graph_memory_back(fake: Fake) -> None:
    p = fake.start("viaproc")
    ctx = p.ok("ctx 0")["id"]
    g = p.ok("graphalloc 0 5m")
    p.ok(f"graphlaunch {g['id']}")
    h = p.ok("graphalloc 0 3m 1")
    p.ok(f"graphlaunch {h['id']}")
    assert p.used() == CTX + 8 * MIB
    p.ok(f"free {ctx}")  # the only context of the process on device 0
    assert p.used() == 0
    p.ok("use 0")
    assert graphmem(p)[:2] == (0, 0)
    p.ok(f"graphlaunch {g['id']}")  # the graph still works in another context
    assert p.used() == CTX + 6 * MIB
    p.kill()
    assert fake.one("direct", "fake_device_used_bytes 0")["value"] == 0


def test_memory_nodes_take_no_device_time(fake: Fake) -> None:
    p = fake.start("direct")
    t0 = p.ok("fake_now_ns")["value"]
    g = p.ok("graphalloc 0 2m 1")["id"]
    p.ok(f"graphlaunch {g} 5")
    p.ok("sync")
    assert p.ok(f"fake_busy_ns 0 {p.pid} {t0}")["value"] == 0


def test_get_nodes_counts_every_node(fake: Fake) -> None:
    g = fake.one("direct", "graph 1 5 1")
    assert (g["nodes"], g["filled"], g["padded"]) == (5, 5, 1)
    assert fake.run("direct", "graphalloc 0 1m 1")[-1]["nodes"] == 2
