"""VMM physical memory lives until the handle is released AND every mapping is unmapped;
context teardown frees the context's memory and every allocation made in it; without
FAKECUDA_STATE every process has a machine of its own."""

from __future__ import annotations

import pytest

from .conftest import MIB, Fake

CTX = 300 * MIB


def test_release_right_after_map_keeps_the_memory_until_unmap(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 0")
    v = p.ok("vmm 0 4m")["id"]  # create, reserve, map, set access
    assert p.used() == CTX + 4 * MIB
    p.ok(f"memrelease {v}")  # as NVIDIA's samples do: the mapping keeps the memory
    assert p.used() == CTX + 4 * MIB
    assert p.do(f"memrelease {v}")["rc"] == 1  # released already
    p.ok(f"unmap {v}")
    assert p.used() == CTX


def test_unmap_then_release(fake: Fake) -> None:
    p = fake.start("viaproc")
    p.ok("use 0")
    v = p.ok("vmm 0 6m")["id"]
    p.ok(f"unmap {v}")
    assert p.used() == CTX + 6 * MIB  # the handle still holds it
    p.ok(f"memrelease {v}")
    assert p.used() == CTX


def test_vmm_memory_outlives_contexts(fake: Fake) -> None:
    p = fake.start("viaproc")
    ctx = p.ok("ctx 0")["id"]
    p.ok("vmm 0 2m")
    p.ok(f"free {ctx}")
    assert p.used() == 2 * MIB  # cuMemCreate memory is not a context's


@pytest.mark.parametrize("how", ["destroy", "release", "reset"])
def test_context_teardown_frees_its_allocations(fake: Fake, how: str) -> None:
    p = fake.start("viaproc")
    if how == "destroy":
        ctx = p.ok("ctx 0")["id"]
        teardown = f"free {ctx}"
    else:
        p.ok("use 0")
        teardown = f"{how} 0"
    p.ok("alloc 0 1g")
    p.ok("pitch 0 1000 100")
    p.ok("array 0 1000 10")
    p.ok("async 0 8m")
    p.ok("managed 0 8m")
    assert p.used() > CTX + 1024 * MIB
    p.ok(teardown)
    assert p.used() == 0
    assert p.ok(f"fake_managed_bytes {p.pid}")["value"] == 0
    assert fake.nvml().do("procs 0")["v3"]["procs"] == {}


def test_process_local_state(fake: Fake) -> None:
    del fake.env["FAKECUDA_STATE"]
    a = fake.start("viaproc")
    a.ok("alloc 0 7g")
    b = fake.one("direct", "info")
    assert b["free"] == 8192 * MIB - CTX  # a's memory is not on b's machine
    assert a.used() == CTX + 7168 * MIB
