"""Green contexts (CUDA 12.4+), as cuda.h describes them: cuGreenCtxCreate retains the
device's primary context (activating it, with its memory, when it was not) and provisions
memory of its own (FAKECUDA_GREEN_CTX_MIB); kernels launched in it run on its SMs only;
what is allocated in it is the primary context's memory (it outlives the green context
and goes with the primary one); cuGreenCtxDestroy gives back what it provisioned and
releases the primary context. Run without the shim."""

from __future__ import annotations

from .conftest import MIB, Fake

CTX = 300 * MIB
GREEN = 100 * MIB
LAUNCH, BLOCK = 1500, 1000  # FAKECUDA_LAUNCH_NS and FAKECUDA_NS_PER_BLOCK defaults
INVALID_CONTEXT, INVALID_RESOURCE_CONFIGURATION = 201, 915


def test_a_green_context_brings_up_the_primary_context_and_provisions_memory(
        fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_GREEN_CTX_MIB": "100"})
    assert p.used() == 0
    g = p.ok("green 0 8")
    assert g["sms"] == 8
    assert p.used() == CTX + GREEN  # the primary context came up with it
    p.ok(f"greenuse {g['id']}")
    a = p.ok("alloc 0 64m")["id"]
    assert p.used() == CTX + GREEN + 64 * MIB
    p.ok(f"free {g['id']}")  # cuGreenCtxDestroy: its own memory, and the primary's last ref
    assert p.used() == 0  # the primary context went, and what was allocated in it
    assert p.do(f"free {a}")["rc"] != 0  # that address is gone with it
    assert p.do("getdev")["rc"] == INVALID_CONTEXT  # the green one was current: destroyed


def test_what_is_allocated_in_a_green_context_is_the_primary_contexts(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_GREEN_CTX_MIB": "100"})
    p.ok("use 0")  # the primary context, retained by the program
    g = p.ok("green 0 4")["id"]
    p.ok(f"greenuse {g}")
    a = p.ok("alloc 0 64m")["id"]
    p.ok(f"free {g}")
    assert p.used() == CTX + 64 * MIB  # the allocation stays with the primary context
    p.ok("use 0")
    p.ok(f"free {a}")
    assert p.used() == CTX


def test_a_green_context_that_does_not_fit_is_refused(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_GREEN_CTX_MIB": "8000"})
    p.ok("use 0")
    assert p.do("green 0 8")["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert p.used() == CTX


def test_kernels_in_a_green_context_run_on_its_sms(fake: Fake) -> None:
    """1,728 blocks of 128 threads are one wave on the device's 108 SMs and 14 on 8."""
    p = fake.start("direct")
    p.ok("use 0")
    g = p.ok("green 0 8")["id"]
    t0 = p.ok("fake_now_ns")["value"]
    p.ok("launch 1728 1")
    p.ok("sync")
    whole = p.ok(f"fake_busy_ns 0 {p.pid} {t0}")["value"]
    p.ok(f"greenuse {g}")
    t1 = p.ok("fake_now_ns")["value"]
    p.ok("launch 1728 1")
    p.ok("sync")
    green = p.ok(f"fake_busy_ns 0 {p.pid} {t1}")["value"]
    assert (whole, green) == (LAUNCH + BLOCK, LAUNCH + 14 * BLOCK)


def test_an_sm_group_larger_than_the_device_is_refused(fake: Fake) -> None:
    p = fake.start("viaproc", env={"FAKECUDA_SMS": "40"})
    assert p.do("green 0 41")["rc"] == INVALID_RESOURCE_CONFIGURATION
    assert p.ok("green 0 3")["sms"] == 4  # rounded up to the co-scheduling alignment
