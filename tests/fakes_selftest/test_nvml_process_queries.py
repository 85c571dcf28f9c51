"""The fake NVML's other process queries: graphics and MPS process lists (v1, v2, v3),
nvmlDeviceGetRunningProcessDetailList, nvmlDeviceGetProcessesUtilizationInfo,
nvmlDeviceGetUtilizationRates and accounting (mode, buffer size, pids, stats).

They are driven by the shim tests' `drv` program (tests/shim/progs/drv.c) run WITHOUT the
shim: every row must come from the fake's own state (the processes and figures
nvmlDeviceGetComputeRunningProcesses_v3 and nvmlDeviceGetProcessUtilization report, with the
same PID choice), and the errors must be the real NVML's: too small a buffer →
INSUFFICIENT_SIZE with the count needed, a wrong struct version → ARGUMENT_VERSION_MISMATCH,
an unknown pid → NOT_FOUND, accounting disabled → NOT_SUPPORTED."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import MIB, Fake

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRV_C = ROOT / "tests" / "shim" / "progs" / "drv.c"

OFFSET = 100_000
CTX = 300 * MIB  # FAKECUDA_CTX_MIB's default: what a context takes
NA = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE_UINT: not on a MIG device
SUCCESS, NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, INSUFFICIENT_SIZE = 0, 3, 2, 6, 7
VERSION_MISMATCH = 25
# nvml.h's NVML_STRUCT_VERSION(data, ver) = sizeof(struct) | ver << 24 (x86-64 sizes)
DETAIL_LIST_V1 = 24 | 1 << 24
UTIL_INFO_V1 = 24 | 1 << 24


@pytest.fixture(scope="session")
def drv(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """drv built from the tree's drv.c (as tests/shim/progs/Makefile builds it)."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is required"
    exe = tmp_path_factory.mktemp("drv") / "drv"
    subprocess.run(
        [gcc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
         f"-I{ROOT / 'csrc' / 'include'}", "-o", str(exe), str(DRV_C), "-ldl"],
        check=True,
    )  # fmt: skip
    return exe


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    pid: int
    lines: list[dict[str, Any]]


class Drv:
    """drv against the fake, never with the shim (no LD_PRELOAD)."""

    def __init__(self, fake: Fake, exe: pathlib.Path) -> None:
        self.fake = fake
        self.exe = exe

    def env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {**self.fake.env, **(extra or {})}
        assert "LD_PRELOAD" not in env
        return env

    def run(self, *ops: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
        out = subprocess.run(
            [str(self.exe), *ops],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    def one(self, *ops: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        lines = self.run(*ops, env=env)
        assert len(lines) == 1, lines
        return lines[0]

    def worker(self, *ops: str, env: dict[str, str] | None = None) -> Worker:
        """A CUDA process that runs ops, then holds everything until killed."""
        p = subprocess.Popen(
            [str(self.exe), *ops, "hold"], env=self.env(env), stdout=subprocess.PIPE, text=True
        )
        self.fake.procs.append(p)
        assert p.stdout
        lines: list[dict[str, Any]] = []
        while True:
            line = p.stdout.readline()
            assert line, f"worker died: {lines}"
            lines.append(json.loads(line))
            assert lines[-1]["rc"] == 0, lines
            if lines[-1]["op"] == "hold":
                return Worker(p, p.pid, lines)


@pytest.fixture
def d(fake: Fake, drv: pathlib.Path) -> Iterator[Drv]:
    fake.env["FAKECUDA_HOST_PID_OFFSET"] = str(OFFSET)
    yield Drv(fake, drv)


def compute_list(d: Drv, env: dict[str, str] | None = None) -> dict[int, int]:
    """nvmlDeviceGetComputeRunningProcesses_v3: pid → usedGpuMemory (the reference)."""
    line = d.one("nvml", env=env)
    assert line["rc"] == 0 and line["r3"] == 0, line
    return dict(line["procs"])


def two_workers(d: Drv) -> tuple[Worker, Worker]:
    """a: an MPS client (FAKECUDA_MPS=1) holding 64 MiB; b: a plain one holding 32 MiB."""
    a = d.worker("ctx", "alloc", str(64 * MIB), env={"FAKECUDA_MPS": "1"})
    b = d.worker("ctx", "alloc", str(32 * MIB))
    return a, b


def test_graphics_and_mps_lists(d: Drv) -> None:
    a, b = two_workers(d)
    ref = compute_list(d)
    ha, hb = a.pid + OFFSET, b.pid + OFFSET  # host pids: a driver before 560
    assert ref == {ha: CTX + 64 * MIB, hb: CTX + 32 * MIB}
    got = d.run(
        "gfxprocs", "1", "gfxprocs", "2", "gfxprocs", "3",
        "mpsprocs", "1", "mpsprocs", "2", "mpsprocs", "3", "mpsprocs", "3", "0",
    )  # fmt: skip
    # the fake is compute-only: no graphics process, and sizing with (0, NULL) succeeds
    for version, line in zip((1, 2, 3), got[:3], strict=True):
        assert line == {
            "op": "gfxprocs", "rc": SUCCESS, "version": version, "r0": SUCCESS, "need": 0,
            "count": 0, "procs": [],
        }  # fmt: skip
    # MPS clients: a only, with the compute list's figures
    for version, line in zip((1, 2, 3), got[3:6], strict=True):
        row: dict[str, int] = {"pid": ha, "usedGpuMemory": ref[ha]}
        if version > 1:
            row |= {"gpuInstanceId": NA, "computeInstanceId": NA}
        assert line["rc"] == SUCCESS and line["count"] == 1 and line["procs"] == [row], line
        assert (line["r0"], line["need"]) == (INSUFFICIENT_SIZE, 1)
    # no room: INSUFFICIENT_SIZE with the count needed
    assert (got[6]["rc"], got[6]["count"]) == (INSUFFICIENT_SIZE, 1)


def test_running_process_detail_list(d: Drv) -> None:
    a, b = two_workers(d)
    ref = compute_list(d)
    ha, hb = a.pid + OFFSET, b.pid + OFFSET

    def rows(*pids: int) -> list[dict[str, int]]:
        return [
            {"pid": p, "usedGpuMemory": ref[p], "gpuInstanceId": NA, "computeInstanceId": NA,
             "usedGpuCcProtectedMemory": 0}
            for p in pids
        ]  # fmt: skip

    compute, graphics, mps, every, bad_mode, small, v0, v2, size = d.run(
        "detail", "0", "detail", "1", "detail", "2", "detail", "3", "detail", "4",
        "detail", "0", "1",
        "detail", "0", "64", "0",
        "detail", "0", "64", str(24 | 2 << 24),  # version 2 of the right size
        "detail", "0", "64", str(16 | 1 << 24),  # version 1 of another size
    )  # fmt: skip
    assert compute["rc"] == SUCCESS and compute["count"] == 2
    assert sorted(compute["procs"], key=lambda r: r["pid"]) == rows(*sorted((ha, hb)))
    assert (compute["r0"], compute["need"]) == (INSUFFICIENT_SIZE, 2)
    assert graphics == {
        "op": "detail", "rc": SUCCESS, "mode": 1, "r0": SUCCESS, "need": 0, "count": 0,
        "procs": [],
    }  # fmt: skip
    assert mps["rc"] == SUCCESS and mps["procs"] == rows(ha)
    assert (mps["r0"], mps["need"]) == (INSUFFICIENT_SIZE, 1)
    assert every["rc"] == SUCCESS
    assert sorted(every["procs"], key=lambda r: r["pid"]) == rows(*sorted((ha, hb)))
    assert bad_mode["rc"] == INVALID_ARGUMENT and bad_mode["r0"] == INVALID_ARGUMENT
    assert (small["rc"], small["count"], small["procs"]) == (INSUFFICIENT_SIZE, 2, [])
    for line in (v0, v2, size):
        assert line["rc"] == VERSION_MISMATCH and line["r0"] == VERSION_MISMATCH, line


def test_lists_report_namespace_pids_from_560(d: Drv) -> None:
    """As nvmlDeviceGetComputeRunningProcesses_v3: a >= 560 driver reports each process by
    its pid in the caller's PID namespace (here the workers' own)."""
    a, b = two_workers(d)
    new = {"FAKECUDA_NVML_DRIVER_VERSION": "560.35.03"}
    ref = compute_list(d, env=new)
    assert set(ref) == {a.pid, b.pid}
    detail, mps, pids = d.run("detail", "3", "mpsprocs", "3", "acctpids", env=new)
    assert {r["pid"] for r in detail["procs"]} == {a.pid, b.pid}
    assert [r["pid"] for r in mps["procs"]] == [a.pid]
    assert set(pids["pids"]) == {a.pid, b.pid}


def test_processes_utilization_info(d: Drv) -> None:
    t0_us = time.time_ns() // 1000
    w = d.worker("ctx", "launch", "1", "0.35", "kernel", "20000000")  # 20 ms kernels
    time.sleep(0.25)  # the windows of its last kernels are complete
    info, ref, small, v0, v2, rates = d.run(
        "utilinfo", "procutil", "utilinfo", "0", "0", "utilinfo", "0", "64", "0",
        "utilinfo", "0", "64", str(24 | 2 << 24), "utilrates",
    )  # fmt: skip
    host = w.pid + OFFSET  # host pids whatever the driver, as nvmlDeviceGetProcessUtilization
    assert info["rc"] == SUCCESS and info["count"] == 1, info
    (s,) = info["samples"]
    assert s["pid"] == host
    assert 0 < s["smUtil"] <= 100
    assert s["memUtil"] == s["encUtil"] == s["decUtil"] == s["jpgUtil"] == s["ofaUtil"] == 0
    assert t0_us < s["timeStamp"] <= time.time_ns() // 1000
    # sizing: a NULL array → INSUFFICIENT_SIZE with the count needed; so does no room
    assert (info["r0"], info["need"]) == (INSUFFICIENT_SIZE, 1)
    assert (small["rc"], small["count"]) == (INSUFFICIENT_SIZE, 1)
    # the same samples as nvmlDeviceGetProcessUtilization (one window may end in between)
    assert ref["r1"] == SUCCESS and [p for p, _ in ref["samples"]] == [host]
    assert abs(ref["samples"][0][1] - s["smUtil"]) <= 3
    for line in (v0, v2):
        assert line["rc"] == VERSION_MISMATCH and line["r0"] == VERSION_MISMATCH, line
    assert rates["rc"] == SUCCESS and 0 <= rates["gpu"] <= 100 and rates["memory"] == 0
    # nothing newer than the newest sample: NOT_FOUND (the worker is idle now)
    later = d.one("utilinfo", str(s["timeStamp"]))
    assert (later["rc"], later["r0"], later["samples"]) == (NOT_FOUND, NOT_FOUND, [])


def test_accounting(d: Drv) -> None:
    d.fake.env["FAKECUDA_MIG"] = "1"  # device 1 in MIG mode: accounting disabled there
    t0_us = time.time_ns() // 1000
    start = time.monotonic()
    # 300 MiB context + 128 MiB, freed, then 16 MiB: at most 428 MiB, 316 MiB now
    w = d.worker(
        "ctx", "alloc", str(128 * MIB), "free", "0", "alloc", str(16 * MIB),
        "launch", "1", "0.2", "kernel", "20000000",
    )  # fmt: skip
    # a process that used the device and exited normally
    done = d.run("ctx", "alloc", str(8 * MIB))
    assert [x["rc"] for x in done] == [0, 0]
    host = w.pid + OFFSET
    assert compute_list(d)[host] == CTX + 16 * MIB

    mode, pids, small, stats, unknown = d.run(
        "acctmode", "acctpids", "acctpids", "0", "acctstats", str(host), "acctstats", "1"
    )
    assert mode == {"op": "acctmode", "rc": SUCCESS, "mode": 1, "rbuf": SUCCESS, "bufferSize": 4000}
    assert pids["rc"] == SUCCESS and host in pids["pids"] and pids["count"] == 2, pids
    assert len(set(pids["pids"])) == 2  # the exited process is still listed
    assert (pids["r0"], pids["need"]) == (INSUFFICIENT_SIZE, 2)
    assert (small["rc"], small["count"]) == (INSUFFICIENT_SIZE, 2)
    assert stats["rc"] == SUCCESS and stats["isRunning"] == 1 and stats["time"] == 0, stats
    assert stats["maxMemoryUsage"] == CTX + 128 * MIB
    assert 0 < stats["gpuUtilization"] <= 100 and stats["memoryUtilization"] == 0
    assert t0_us <= stats["startTime"] <= time.time_ns() // 1000
    assert unknown["rc"] == NOT_FOUND

    # it dies: its record stays, ended, with how long it used the device
    w.proc.kill()
    w.proc.wait()
    lived_ms = (time.monotonic() - start) * 1000
    pids, stats = d.run("acctpids", "acctstats", str(host))
    assert host not in compute_list(d)
    assert host in pids["pids"]
    assert stats["rc"] == SUCCESS and stats["isRunning"] == 0, stats
    assert 200 <= stats["time"] <= lived_ms + 1000
    assert stats["maxMemoryUsage"] == CTX + 128 * MIB

    # accounting disabled (FAKECUDA_ACCOUNTING=0, or a GPU in MIG mode): NOT_SUPPORTED
    off = {"FAKECUDA_ACCOUNTING": "0"}
    mode, pids, stats = d.run("acctmode", "acctpids", "acctstats", str(host), env=off)
    assert (mode["rc"], mode["mode"], mode["rbuf"]) == (SUCCESS, 0, NOT_SUPPORTED)
    assert pids["rc"] == NOT_SUPPORTED and stats["rc"] == NOT_SUPPORTED
    mode, pids, util = d.run("--dev", "1", "acctmode", "acctpids", "utilinfo")
    assert (mode["rc"], mode["mode"]) == (SUCCESS, 0)
    assert pids["rc"] == NOT_SUPPORTED
    assert util["rc"] == NOT_SUPPORTED  # processes' utilisation is not supported in MIG mode


def test_missing_symbols_answer_minus_one(d: Drv, tmp_path: pathlib.Path) -> None:
    """drv prints rc -1 when the NVML library lacks a function (an older driver): here an
    NVML that has none at all."""
    ldconfig = shutil.which("ldconfig")
    cache = subprocess.run([ldconfig or "true", "-p"], capture_output=True, text=True).stdout
    if "libnvidia-ml.so.1" in cache:
        pytest.skip("a system libnvidia-ml.so.1 would be found")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcuda.so.1").symlink_to(d.fake.build / "libcuda.so.1")
    lines = d.run("gfxprocs", "mpsprocs", "detail", "0", "utilinfo", "acctpids", "acctstats", "1",
                  env={"LD_LIBRARY_PATH": str(lib)})  # fmt: skip
    assert [x["rc"] for x in lines] == [-1] * 6


def test_memory_a_graphics_api_takes_is_listed_where_nvml_lists_it(fake: Fake, d: Drv) -> None:
    """fake_graphics_alloc (interp's gfxalloc: what vkAllocateMemory does, no CUDA call):
    a process that only does that is in the graphics list alone ("G"); one with a CUDA
    context too is in both, with all of its memory in each ("C+G"); the device's memory
    counts both, and a process's goes when it exits. Not the fake driver: the op says so."""
    gfx = fake.start("viaproc")
    assert gfx.ok("gfxalloc 0 128m")["size"] == 128 * MIB
    both = fake.start("viaproc")
    both.ok("use 0")
    both.ok("gfxalloc 0 64m")
    hg, hb = gfx.pid + OFFSET, both.pid + OFFSET
    assert gfx.used() == 128 * MIB + CTX + 64 * MIB
    assert compute_list(d) == {hb: CTX + 64 * MIB}
    graphics, every, compute = d.run("gfxprocs", "3", "detail", "3", "detail", "0")
    assert graphics["rc"] == SUCCESS
    assert sorted((r["pid"], r["usedGpuMemory"]) for r in graphics["procs"]) == sorted(
        [(hg, 128 * MIB), (hb, CTX + 64 * MIB)])
    assert sorted(r["pid"] for r in every["procs"]) == sorted([hg, hb])
    assert [r["pid"] for r in compute["procs"]] == [hb]
    # more than the device has: refused, nothing taken
    assert gfx.do("gfxalloc 0 9g")["rc"] == 2
    assert gfx.used() == 128 * MIB + CTX + 64 * MIB
    gfx.kill()
    assert both.used() == CTX + 64 * MIB
    assert d.one("gfxprocs", "3")["procs"] == [{"pid": hb, "usedGpuMemory": CTX + 64 * MIB,
                                                "gpuInstanceId": NA, "computeInstanceId": NA}]
