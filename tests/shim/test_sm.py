"""SM limit: the controller's share of the device against its target, on the fake
driver's honest model (kernels run in waves over the SMs, NVML samples per window in
integer percent, lagging), measured exactly per sampling window (fake_window_busy_ns).

Kernels of 100 ns, 10 us and 1 ms of device time per launch (FAKECUDA_LAUNCH_NS=100
plus work per block per wave). A container is held to its target within 3 points
wherever it can launch more than that; two processes launching 100 ns kernels flat out
on a 2-core machine cannot each reach 30 % of a device, shim or not, and there the
test asks for never more than the target, each process near what it can launch at all
(measured in the same setting with limits that never bind; see ``_judge``), and the
pair together at least 0.8 of that. Each case prints its figures (``pytest -s``)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
from pathlib import Path

import pytest

from .conftest import Built, Registration, Shim

WARMUP_NS = 1_000_000_000
RUN_S = 3.0
# name -> (blocks, work ns per block per wave): with 128 threads a block, 1728 blocks a
# wave on the fake's 108 SMs; 100 + 6 x 166650 ns ~ 1 ms
KERNELS = {"100ns": (1, 0), "10us": (100, 9900), "1ms": (10000, 166650)}
# 7 waves of 14.3 us: 100 us, the kernel of the campaign's scenario that ran away
MID_KERNELS = {"100us": (12096, 14271)}
# kernels longer than a sampling window (finding 10 of issue 22): 6 waves of 8.3 / 16.7 ms
LONG_KERNELS = {"50ms": (10000, 8333317), "100ms": (10000, 16666650)}


class Container:
    """One container: its own config and state dir, sharing the fake device."""

    def __init__(self, built: Built, root: Path, name: str, fake_state: Path, *,
                 offset: int = 0, registration: Registration | None = None, **cfg: str):
        self.shim = Shim(built, root / name, asan=False)
        self.shim.tmp.mkdir()
        if registration is not None:
            cfg["register"] = str(registration.path)
        self.shim.config(device__0__memory_limit="0", **cfg)
        self.env = {"FAKECUDA_STATE": str(fake_state), "FAKECUDA_HOST_PID_OFFSET": str(offset),
                    "FAKECUDA_LAUNCH_NS": "100", "FAKECUDA_CTX_MIB": "0"}
        self.offset = offset

    def start(self, kernel: str = "10us", kind: str = "kernel",
              seconds: float = RUN_S) -> subprocess.Popen[str]:
        blocks, ns = (KERNELS | MID_KERNELS | LONG_KERNELS)[kernel]
        return subprocess.Popen(
            self.shim.cmd("ctx", "launch", blocks, seconds, kind, ns, via="proc"),
            env=self.shim.env(self.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def share(self, p: subprocess.Popen[str]) -> list[float]:
        """Percent of the device this container's process held, per 200 ms window."""
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        launch = json.loads(out.splitlines()[-1])
        env = {"LD_LIBRARY_PATH": str(self.shim.built.fakes),
               "FAKECUDA_STATE": self.env["FAKECUDA_STATE"], "PATH": os.environ.get("PATH", "")}
        got = json.loads(subprocess.run(
            [str(self.shim.built.drv), "--via", "dlsym", "windows",
             str(launch["pid"] + self.offset), str(launch["t0"] + WARMUP_NS), str(launch["t1"])],
            env=env, capture_output=True, text=True, check=True).stdout)
        busy, w = got["busy"], got["window_ns"]
        pairs = [100.0 * (busy[i] + busy[i + 1]) / (2 * w) for i in range(0, len(busy) - 1, 2)]
        assert len(pairs) >= 5
        return pairs


def _judge(label: str, share: list[float], target: float,
           capacity: list[float] | None = None) -> None:
    """Within 3 points of the target, and never below 0.8 of it in any window but one, wherever
    the process could launch clearly more than that in every window: 15 % above the
    target and 3 points more, since the CPU's pace moves by up to 14 % between two runs
    on a 2-core machine (the mean ratio ranged 0.86 to 1.07 over 16 runs), limited or
    not. (Judged by the mean alone, a run whose unlimited windows ranged from 27.6 to
    over 40 was held to 3 points at 30 % and failed with 3.47.) Where it could not (CPU-
    bound: ``capacity`` is what it reached per window with limits that never bind),
    never above the target, on average at least half what it reached unlimited (or of
    the target, if lower: under load from other work a run read 7.2 where the windows
    around it averaged 12.1), and in every window but two at least 0.3 of the lower of the
    target and its slowest unlimited window (a stall, not the pace). The unlimited
    windows are measured just before the limited ones and again just after
    (``_bracket``), and a CPU-bound launcher's pace follows the host's: two such
    processes side by side move together window by window (8.7, 8.0, 7.7, 7.3, 7.1
    beside 8.7, 8.4, 8.2, 8.0, 7.4), and one CI run fell from 11.9 to 4.0 over six
    windows with limits that did not bind (its capacity windows 7.5 to 11).
    One window may lose its CPU to the host (steal time on a shared machine); a stalling
    controller (0.1 % before the rewrite) is far below in every window."""
    can = statistics.mean(capacity) if capacity else 100.0
    mean = statistics.mean(share)
    mae = statistics.mean(abs(s - target) for s in share)
    low = sorted(share)[1] if len(share) >= 5 else min(share)  # all windows but one
    print(f"{label}: target {target:.0f}, can launch {can:.1f}, mean {mean:.1f}, "
          f"MAE {mae:.2f}, min {min(share):.1f}, next {low:.1f}"
          + (f", its lowest window unlimited {min(capacity):.1f}" if capacity else ""))
    slowest = min(capacity) if capacity else 100.0
    if slowest >= 1.15 * target + 3:
        assert mae <= 3.0, (label, share)
        assert low >= 0.8 * target, (label, share)
    else:
        assert capacity is not None
        assert mean <= target + 3.0, (label, share)
        assert mean >= 0.5 * min(can, target), (label, share, capacity)
        # per window, a stall (0.1 %) and not the host's pace: under load from other
        # work a window fell to 3.2 where the slowest unlimited one read 6.6
        low2 = sorted(share)[2] if len(share) >= 8 else low
        assert low2 >= 0.3 * min(target, *capacity), (label, share, capacity)


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    return tmp_path / "fake.state"


def _loose(built: Built, root: Path, gpu: Path, kernel: str, n: int,
           limit: str = "99") -> list[list[float]]:
    """What n processes launching ``kernel`` together reach, per window, under ``limit``."""
    tag = f"cap{limit}-{len(list(root.glob(f'cap{limit}-*')))}"
    cs = [Container(built, root, f"{tag}-{i}", gpu, device__0__core_limit=limit)
          for i in range(n)]
    ps = [c.start(kernel) for c in cs]
    return [c.share(p) for c, p in zip(cs, ps, strict=True)]


def _capacity(built: Built, root: Path, gpu: Path, kernel: str, n: int) -> list[list[float]]:
    """What n processes launching ``kernel`` together reach, per window, with limits that
    never bind (99 %: each launch pays for its accounting, as a limited one does)."""
    loose, free = _loose(built, root, gpu, kernel, n), _loose(built, root, gpu, kernel, n, "0")
    # a limit that never binds must not bind: a stalling controller (0.1 % before the
    # rewrite) would otherwise lower the bar it is judged by. Not a judge of the shim's
    # cost, which benchmarks/shim_overhead.py measures: a CPU-bound 100 ns launcher pays
    # 15-30 % of its rate for the accounting alone, and the two runs, seconds apart on a
    # busy 2-core host, moved it further (medians 0.45 to 0.85 of the unlimited pace
    # here; one CI run 22 against 48 by the mean, its first windows 15.6 and 19.7)
    for w, wo in zip(loose, free, strict=True):
        assert statistics.median(w) >= 0.3 * statistics.median(wo), (kernel, loose, free)
    return loose


def _bracket(built: Built, root: Path, gpu: Path, kernel: str,
             before: list[list[float]]) -> list[list[float]]:
    """The capacity windows measured before the limited run and again after it: a
    CPU-bound launcher's pace follows the host's, which drifts over seconds, so the
    limited run is judged against the pace on both sides of it."""
    after = _loose(built, root, gpu, kernel, len(before))
    return [b + a for b, a in zip(before, after, strict=True)]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_fixed_30_alone(built: Built, tmp_path: Path, gpu: Path, kernel: str) -> None:
    before = _capacity(built, tmp_path, gpu, kernel, 1)
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    share = a.share(a.start(kernel))
    (capacity,) = _bracket(built, tmp_path, gpu, kernel, before)
    _judge(f"{kernel} fixed 30 alone", share, 30.0, capacity)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_fixed_30_beside_a_50_neighbour(built: Built, tmp_path: Path, gpu: Path,
                                        kernel: str) -> None:
    before = _capacity(built, tmp_path, gpu, kernel, 2)
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    b = Container(built, tmp_path, "b", gpu, device__0__core_limit="50")
    pa, pb = a.start(kernel), b.start(kernel)
    share_a, share_b = a.share(pa), b.share(pb)
    cap_a, cap_b = _bracket(built, tmp_path, gpu, kernel, before)
    _judge(f"{kernel} fixed 30 beside 50", share_a, 30.0, cap_a)
    _judge(f"{kernel} its 50 neighbour", share_b, 50.0, cap_b)
    # together: at least 0.8 of the 80 % they ask for where the pair could clearly launch
    # more (by the margin ``_judge`` uses); where it could not (CPU-bound), at least the
    # half of what it launched unlimited that ``_judge`` asks of each (one CI run: 12.8
    # of 16.4 measured before the limited run, with the host's pace falling)
    together = statistics.mean(share_a) + statistics.mean(share_b)
    could = statistics.mean(cap_a) + statistics.mean(cap_b)
    bound = 0.8 * 80.0 if could >= 1.15 * 80.0 + 3 else 0.5 * min(80.0, could)
    print(f"{kernel} together: {together:.1f}, could {could:.1f}, at least {bound:.1f}")
    assert together >= bound, (share_a, share_b, cap_a, cap_b)


@pytest.mark.parametrize("kind", ["coop", "graph", "ex", "nested3"])
def test_every_launch_kind_is_charged(built: Built, tmp_path: Path, gpu: Path,
                                      kind: str) -> None:
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    _judge(f"{kind} fixed 30", a.share(a.start("10us", kind)), 30.0)


def test_the_host_pid_through_registration(built: Built, tmp_path: Path, gpu: Path) -> None:
    """In a container (simulated: NVML reports PID + offset) the host PID comes from the
    plugin's registration; with it, calibration works."""
    reg = Registration(tmp_path / "reg.sock", 100000)
    try:
        a = Container(built, tmp_path, "a", gpu, offset=100000, registration=reg,
                      device__0__core_limit="30")
        _judge("10us fixed 30, registered", a.share(a.start("10us")), 30.0)
    finally:
        reg.close()


def test_without_the_host_pid_the_target_is_missed(built: Built, tmp_path: Path,
                                                   gpu: Path) -> None:
    """NVML speaks of host PIDs: a shim that takes its own PID for one learns nothing
    (so the test above is not passing by luck)."""
    a = Container(built, tmp_path, "a", gpu, offset=100000, device__0__core_limit="30")
    share = a.share(a.start("10us"))
    print("10us fixed 30, unregistered:", round(statistics.mean(share), 1))
    assert statistics.mean(abs(s - 30) for s in share) > 3.0


def test_balance_uses_idle_capacity(built: Built, tmp_path: Path, gpu: Path) -> None:
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30",
                  device__0__core_policy="balance")
    share = a.share(a.start("10us"))
    print("balance 30 alone:", [round(u, 1) for u in share])
    assert min(share[2:]) > 45


def test_balance_never_below_limit_under_contention(built: Built, tmp_path: Path,
                                                    gpu: Path) -> None:
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="40",
                  device__0__core_policy="balance")
    b = Container(built, tmp_path, "b", gpu, device__0__core_limit="0")  # unlimited
    pa, pb = a.start("10us", seconds=3.5), b.start("10us", seconds=3.5)
    share = a.share(pa)
    b.share(pb)
    print("balance 40 vs greedy:", [round(u, 1) for u in share])
    assert statistics.mean(share) >= 40 - 3.0


@pytest.mark.parametrize(("kernel", "limit"), [("50ms", 30), ("50ms", 5), ("100ms", 30)])
def test_kernels_longer_than_a_window_are_held_to_the_limit(built: Built, tmp_path: Path,
                                                            gpu: Path, kernel: str,
                                                            limit: int) -> None:
    """Finding 10: at the starting estimate (1 us a wave) a 100 ms kernel charged 6 us,
    calibration waited for 0.1 ms charged in one NVML interval, and the debt floor forgave
    all but four bucket depths of a launch: 50 ms kernels ran at 25 % under a 5 % limit,
    100 ms ones at 50-100 % under 30 %. Calibration now weighs spans of several launches
    and a launch's own cost is never forgiven. A window holds a few kernels at most, so
    the mean over the run is judged: above the limit (the escape) within 3 points and one
    kernel's share of the run; below it within one kernel more. A calibration span holds
    about four 100 ms launches and its edge can misplace one of them, so a half step may
    leave the estimate an eighth high for a span or two (a CI run held 100 ms kernels at
    one in 400 ms for 2.4 s, 24.1 % under 30 %)."""
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit=str(limit))
    share = a.share(a.start(kernel, seconds=5.0))
    mean = statistics.mean(share)
    one_kernel = 100.0 * int(kernel.removesuffix("ms")) / (len(share) * 200)
    print(f"{kernel} fixed {limit}: mean {mean:.1f} (one kernel {one_kernel:.1f}), "
          f"{[round(s, 1) for s in share]}")
    assert mean <= limit + 3.0 + one_kernel, (kernel, limit, share)
    assert mean >= limit - 3.0 - 2 * one_kernel, (kernel, limit, share)


def _together(a: Container, kernel: str, n: int, seconds: float) -> list[float]:
    """What n processes of container a launching ``kernel`` at once reach together, per
    window."""
    ps = [a.start(kernel, seconds=seconds) for _ in range(n)]
    shares = [a.share(p) for p in ps]
    return [sum(w) for w in zip(*shares, strict=False)]


def test_processes_sharing_a_limit_with_long_kernels_are_held_together(
        built: Built, tmp_path: Path, gpu: Path) -> None:
    """Four processes of one container launching 50 ms kernels under 21 %: the shared
    bucket forgave any debt past four depths (about 42 ms here), so each process's launch
    wiped out what the others owed, and the container ran at 84 % (100 % before the
    calibration spans). The shared bucket now owes up to 4 s of waiting. Judged on the
    second half of the run (the estimate starts at 1 us a wave), in the mean: above the
    limit (the escape) within 3 points and one kernel's share, below it within one kernel
    more (each process calibrates over spans of a few launches whose edges can misplace
    one; a fresh-clone run read 15.7, its windows holding the four at one kernel a 200 ms
    window for 2 s)."""
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="21")
    total = _together(a, "50ms", 4, 5.0)
    late = total[len(total) // 2:]
    one_kernel = 100.0 * 50 / (len(late) * 200)
    print(f"4 x 50ms fixed 21: {[round(t, 1) for t in total]}, late mean "
          f"{statistics.mean(late):.1f}")
    assert statistics.mean(late) <= 21 + 3.0 + one_kernel, total
    assert statistics.mean(late) >= 21 - 3.0 - 2 * one_kernel, total


def test_samples_slower_than_the_tick_are_not_taken_for_an_idle_gpu(
        built: Built, tmp_path: Path, gpu: Path) -> None:
    """NVML samples every 300 ms, the controller looks every 50 ms: between two samples
    NOT_FOUND only means "not sampled yet". The controller took three such answers, while
    the process had been charged, for a GPU that saw nothing of it and cut its estimate
    four-fold each time, so four processes of a 40 % container ran at 100 % (with 200 ms
    samples it happened whenever the ticks drifted to a fourth miss: the SM campaign's
    scenario, 100 us kernels, got 70-91 % in four runs of six). Now a charge counts as
    unseen only once two sample periods have passed it. Judged on the second half of the
    run: the mean within 3 points, no 400 ms window over 10 points above."""
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="40")
    a.env["FAKECUDA_NVML_SAMPLE_MS"] = "300"
    total = _together(a, "100us", 4, 6.0)
    late = total[len(total) // 2:]
    print(f"4 x 100us fixed 40, 300 ms samples: {[round(t, 1) for t in total]}")
    assert abs(statistics.mean(late) - 40) <= 3.0, total
    assert max(late) <= 50, total


def test_processes_of_a_container_are_held_where_nvml_gives_each_window_to_one(
        built: Built, tmp_path: Path, gpu: Path) -> None:
    """The real NVML (an H200, driver 580) gave each sampling window of two processes
    sharing the GPU wholly to one of them: each saw 0 % and twice its share in turn, and
    calibrating on single windows swung each estimate three-fold back and forth: two
    processes of a 30 % container ran 1 ms kernels at 40-44 % (GPU verification, sixth
    run). The fake gives windows so (FAKECUDA_NVML_WINDOW_TO_ONE). Judged on the second
    half of the run: the mean at most 3 points over the limit (the escape read 40-44), and
    not starved: at least 8 under it (a clean CI run of the whole suite read 25.75 once,
    the launchers short of CPU on two busy cores; alone, 28-31)."""
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    a.env["FAKECUDA_NVML_WINDOW_TO_ONE"] = "1"
    a.env["FAKECUDA_NVML_SAMPLE_MS"] = "200"  # as the H200 sampled
    total = _together(a, "1ms", 2, 16.0)
    late = total[len(total) // 2:]
    print(f"2 x 1ms fixed 30, a window to one: {[round(t, 1) for t in total]}")
    assert 30 - 8.0 <= statistics.mean(late) <= 30 + 3.0, total


@pytest.mark.parametrize("kind", ["graph", "nested", "nested3"])
def test_a_graph_costs_every_kernel_of_its_child_graphs(built: Built, tmp_path: Path,
                                                        gpu: Path, kind: str) -> None:
    """Finding 11: a graph's kernels were counted at its top level only, so a graph whose
    four kernels sit in a child graph (or three levels of them) cost one kernel per
    launch, and only calibration, after the fact, caught up. The shim now counts them
    through every level (its debug log says what it counted at instantiation)."""
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    a.env["VGPUD_LOG_LEVEL"] = "debug"
    p = a.start("10us", kind, seconds=0.3)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    counted = {int(n) for n in re.findall(r"graph exec \S+: (\d+) kernel nodes", err)}
    assert counted == {4}, err[-2000:]
