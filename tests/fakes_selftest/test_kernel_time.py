"""Kernel device time: blocks run in parallel on the SMs, in waves, plus a fixed launch
cost, with each kernel's own work per block (fake_ns_N).  Not blocks x a constant: that is
the shim's own estimate, and the fake must not share the model of the code under test."""

from __future__ import annotations

import pytest

from .conftest import Fake

LAUNCH = 1500  # FAKECUDA_LAUNCH_NS default
BLOCK = 1000  # FAKECUDA_NS_PER_BLOCK default
WAVE_128 = 108 * 16  # blocks of 128 threads resident at once: 108 SMs x 2048 / 128


def busy(fake: Fake, script: str, env: dict[str, str] | None = None) -> int:
    """Device time the script's kernels took (fake_busy_ns of its pid)."""
    p = fake.start("direct", env=env)
    t0 = p.ok("fake_now_ns")["value"]
    for op in script.split(";"):
        p.ok(op.strip())
    p.ok("sync")
    value: int = p.ok(f"fake_busy_ns 0 {p.pid} {t0}")["value"]
    p.kill()
    return value


@pytest.mark.parametrize(
    ("threads", "blocks", "waves"),
    [
        (128, 1, 1),
        (128, WAVE_128, 1),  # a full wave costs what one block costs
        (128, WAVE_128 + 1, 2),
        (128, 10 * WAVE_128, 10),
        (1024, 216, 1),  # 2 blocks of 1024 threads per SM
        (1024, 217, 2),
        (1000, 216, 1),  # 2048 // 1000 = 2
        (32, 108 * 32, 1),  # at most 32 resident blocks per SM, however small
        (32, 108 * 32 + 1, 2),
        (1, 108 * 32 + 1, 2),
    ],
)
def test_blocks_run_in_waves(fake: Fake, threads: int, blocks: int, waves: int) -> None:
    got = busy(fake, f"threads {threads}; launch {blocks} 3")
    assert got == 3 * (LAUNCH + waves * BLOCK)


def test_time_is_not_proportional_to_blocks(fake: Fake) -> None:
    # the model a block-counting SM limiter assumes is wrong on a real GPU: 1728 blocks
    # take as long as 1 block, and 1000 tiny kernels take 1000 launch costs
    assert busy(fake, "launch 1 100") == busy(fake, f"launch {WAVE_128} 100")
    assert busy(fake, "kernel 0; launch 1 1000") == 1000 * LAUNCH


def test_function_names_choose_the_work_per_block(fake: Fake) -> None:
    assert busy(fake, "kernel 250000; launch 3000 2") == 2 * (LAUNCH + 2 * 250_000)
    assert busy(fake, "kernel 0; launch 100000 1") == LAUNCH
    # any other name: FAKECUDA_NS_PER_BLOCK, per block per wave
    env = {"FAKECUDA_NS_PER_BLOCK": "7000"}
    assert busy(fake, "kernel; launch 3000 1", env) == LAUNCH + 2 * 7000


def test_knobs_launch_ns_and_sms(fake: Fake) -> None:
    env = {"FAKECUDA_LAUNCH_NS": "4000", "FAKECUDA_SMS": "10"}  # 160 blocks of 128 a wave
    assert busy(fake, "launch 160 1; launch 161 1", env) == (4000 + BLOCK) + (4000 + 2 * BLOCK)


def test_every_launch_path_uses_the_model(fake: Fake) -> None:
    one = LAUNCH + 2 * 10_000  # 2000 blocks of 128 threads: 2 waves of 10 us
    got = busy(fake, "kernel 10000; launch 2000 1; launchex 2000 1; graph 2000 3 2")
    assert got == 2 * one + 2 * 3 * one  # a graph's kernel nodes back to back
    # a cooperative grid must be resident at once: at most one wave
    assert busy(fake, f"kernel 10000; coop {WAVE_128} 1") == LAUNCH + 10_000
    p = fake.start("direct")
    assert p.do(f"coop {WAVE_128 + 1} 1")["rc"] == 720  # COOPERATIVE_LAUNCH_TOO_LARGE


def test_tiny_kernels_are_bounded_by_the_launch_cost(fake: Fake) -> None:
    # from before the first launch to after the sync on the fake's clock: the ops' own
    # durations leave out the time between them, which the device spends working
    out = fake.run("direct", "kernel 0; fake_now_ns; launch 1 4000; sync; fake_now_ns")
    t0, launch, sync, t1 = out[1], out[2], out[3], out[4]
    assert launch["rc"] == sync["rc"] == 0
    assert (t1["value"] - t0["value"]) / 1e6 >= 4000 * LAUNCH / 1e6  # 6 ms of device time


def test_loop_takes_ns_per_block(fake: Fake) -> None:
    out = fake.run("loop", "", "1000", "0.2", "0", "0", "--ns", "100000")
    assert [o["op"] for o in out] == ["use", "kernel", "launchfor"]
    assert out[1]["name"] == "fake_ns_100000"
    launches = out[2]["launches"]
    # the device is the bottleneck: 101.5 us a kernel over ~200 ms
    assert 1500 <= launches <= 2300, out
