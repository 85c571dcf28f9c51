"""Limits that nothing a workload does can lift (issue 9, items 4-9 and 12), outside
containers. Each test fails on the shim before the fix it names; run the suite with
``VGPUD_TEST_SHIM=<an older libvgpu.so>`` to watch it do so. The Kubernetes-mode parts
(a mounted /etc/vgpud, the plugin's registration, PID 1 restarts) are tested in real
containers in tests/node."""

from __future__ import annotations

import json
import subprocess

from vgpud.node.usage_state import read_usage

from .conftest import Registration, Shim, ask

OOM = 2
MIB = 1 << 20
GIB = 1 << 30
UUID = "GPU-fa4ecda0-0000-4000-8000-{:012x}".format  # the fake driver's GPU n
NO_CTX = {"FAKECUDA_CTX_MIB": "0"}


def rcs(out: list[dict], op: str) -> list[int]:
    return [o["rc"] for o in out if o["op"] == op]


def test_limits_follow_the_gpu_not_the_cuda_ordinal(shim: Shim) -> None:
    """Item 4: the config's UUIDs were ignored, so with the workload's own
    CUDA_VISIBLE_DEVICES order a process on GPU 1 got GPU 0's limit and counter."""
    shim.config(device__0__uuid=UUID(0), device__0__memory_limit=str(GIB),
                device__1__uuid=UUID(1), device__1__memory_limit=str(3 * GIB))
    reordered = {**NO_CTX, "CUDA_VISIBLE_DEVICES": "1,0"}
    holder = shim.spawn(env=reordered)
    try:
        assert ask(holder, "uuid 0")["uuid"] == UUID(1)
        assert ask(holder, "alloc 0 2g")["rc"] == 0  # ordinal 0 is GPU 1: 3 GiB
        assert ask(holder, "info")["total"] == 3 * GIB
        assert ask(holder, "alloc 1 2g")["rc"] == OOM  # ordinal 1 is GPU 0: 1 GiB
        snap = read_usage(shim.state_dir)
        assert [d.used for d in snap.devices] == [0, 2 * GIB]  # counted on GPU 1
        # another process of the container, in the driver's own order, shares GPU 1's count
        out = shim.interp("use 1; alloc 1 1536m; alloc 1 1g; alloc 0 1g", env=NO_CTX)
        assert rcs(out, "alloc") == [OOM, 0, 0]
    finally:
        holder.kill()
        holder.wait()


def test_a_gpu_the_config_does_not_list_gets_no_memory(shim: Shim) -> None:
    shim.config(device__0__uuid=UUID(1), device__0__memory_limit=str(GIB))
    out = shim.interp("alloc 0 1m; alloc 1 1m; info", env=NO_CTX)
    assert rcs(out, "alloc") == [OOM, 0]  # ordinal 0 is GPU 0: nobody granted it


def test_vmm_memory_stays_charged_while_it_is_mapped(shim: Shim) -> None:
    """Item 5: cuMemRelease right after cuMemMap (as NVIDIA's samples do) uncharged
    memory that lives until cuMemUnmap: 6 x 512 MiB were mapped under 2 GiB."""
    shim.config(device__0__memory_limit=str(2 * GIB))
    script = "; ".join(f"vmm 0 512m; memrelease {i}" for i in range(6))
    out = shim.interp(f"use 0; {script}; unmap 0; vmm 0 512m", env=NO_CTX)
    assert rcs(out, "vmm") == [0, 0, 0, 0, OOM, OOM, 0]  # 4 fit; an unmap frees one
    assert rcs(out, "memrelease")[:4] == [0] * 4


def test_a_destroyed_context_gives_back_its_memory(shim: Shim) -> None:
    """Item 6: a context's teardown freed its memory in the driver, not in the shim:
    false OOM after two cycles. Primary context reset, release, and cuCtxDestroy."""
    shim.config(device__0__memory_limit=str(GIB))
    env = {"FAKECUDA_CTX_MIB": "300"}
    cycles = "; ".join(["use 0; alloc 0 500m; reset 0"] * 3)
    out = shim.interp(f"{cycles}; use 0; info", env=env)
    assert rcs(out, "alloc") == [0, 0, 0]
    assert out[-1]["free"] == GIB - 300 * MIB  # only the live context
    # a created context and what was made in it, and the last release of a primary one
    out = shim.interp("use 0; alloc 0 100m; release 0; ctx 0; free 1; ctx 0; free 2; "
                      "use 0; alloc 0 600m; info", env=env)
    assert rcs(out, "alloc") == [0, 0]
    assert out[-1]["free"] == GIB - 300 * MIB - 600 * MIB


def test_memory_a_pool_keeps_stays_charged(shim: Shim) -> None:
    """Item 7: a stream-ordered pool that keeps freed memory (PyTorch sets the release
    threshold to the maximum) was uncharged when the free was enqueued, so another
    process of the container could take the same memory too."""
    shim.config(device__0__memory_limit=str(2 * GIB))
    keeper = shim.spawn(env=NO_CTX)
    try:
        pool = ask(keeper, "defpool 0")["id"]
        assert ask(keeper, f"poolsetattr {pool} threshold {(1 << 64) - 1}")["rc"] == 0
        block = ask(keeper, "async 0 1g")
        assert block["rc"] == 0
        assert ask(keeper, f"freeasync {block['ptr']}")["rc"] == 0
        assert ask(keeper, "sync")["rc"] == 0
        assert ask(keeper, f"poolattr {pool}")["reserved"] == GIB  # the pool kept it
        out = shim.interp("alloc 0 1536m; alloc 0 1g", env=NO_CTX)
        assert rcs(out, "alloc") == [OOM, 0]
        assert ask(keeper, f"trim {pool} 0")["rc"] == 0  # given back: now it fits
        assert shim.interp("alloc 0 1536m", env=NO_CTX)[-1]["rc"] == 0
    finally:
        keeper.kill()
        keeper.wait()


def test_graph_allocations_are_charged(shim: Shim) -> None:
    """Item 7: graph allocation nodes were not charged at all."""
    shim.config(device__0__memory_limit=str(GIB))
    out = shim.interp("use 0; graphalloc 0 2g 1; graphlaunch 0; graphalloc 0 512m 1; "
                      "graphlaunch 1; info; graphtrim 0; info", env=NO_CTX)
    assert rcs(out, "graphalloc") == [0, 0]
    assert rcs(out, "graphlaunch") == [OOM, 0]
    info = [o for o in out if o["op"] == "info"]
    assert info[0]["free"] == GIB - 512 * MIB  # the graph pool keeps its memory ...
    assert info[1]["free"] == GIB  # ... until it is trimmed


def test_an_allocation_from_a_pool_is_charged_to_the_pools_gpu(shim: Shim) -> None:
    """Item 7: cuMemAllocFromPoolAsync was charged to the current device."""
    shim.config(device__0__uuid=UUID(0), device__0__memory_limit=str(GIB),
                device__1__uuid=UUID(1), device__1__memory_limit=str(4 * GIB))
    p = shim.spawn(env=NO_CTX)
    try:
        pool = ask(p, "pool 1")["id"]  # a pool on GPU 1 ...
        assert ask(p, "use 0")["rc"] == 0  # ... used from GPU 0's context
        assert ask(p, "getdev")["dev"] == 0
        assert ask(p, f"poolalloc {pool} 2g")["rc"] == 0
        assert [d.used for d in read_usage(shim.state_dir).devices] == [0, 2 * GIB]
    finally:
        p.kill()
        p.wait()


def test_context_memory_with_drivers_that_list_namespace_pids(
        shim: Shim, registration: Registration) -> None:
    """Item 9: drivers from 560 on list container PIDs in the compute process list
    (utilisation still uses host PIDs); the shim looked for its host PID there, missed,
    and never tried again: the context's memory was never charged. (Outside a real PID
    namespace the old shim passed the first half by accident: it took its own PID for
    the host PID, which is what a >= 560 driver lists. The process list settles it.)"""
    offset = 100000
    registration.offset = offset
    shim.config(device__0__memory_limit=str(GIB), register=str(registration.path))
    for driver in ("550.144.03", "560.35.03"):  # host PIDs listed, then namespace PIDs
        env = {"FAKECUDA_CTX_MIB": "300", "FAKECUDA_HOST_PID_OFFSET": str(offset),
               "FAKECUDA_NVML_DRIVER_VERSION": driver}
        p = subprocess.Popen(shim.cmd("ctx", "alloc", MIB, "info", "nvml"),
                             env=shim.env(env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        out = [json.loads(x) for x in stdout.splitlines()]
        assert out[2]["free"] == GIB - 300 * MIB - MIB, driver
        # the one row is this process, under its own PID (host PID: + offset)
        assert out[3]["procs"] == [[p.pid, 300 * MIB + MIB]], driver


def _container(shim: Shim, name: str, offset: int) -> tuple[Shim, Registration]:
    other = Shim(shim.built, shim.tmp / name, asan=False)
    other.tmp.mkdir()
    reg = Registration(other.tmp / "reg.sock", offset)
    other.config(device__0__memory_limit=str(GIB), register=str(reg.path))
    return other, reg


def test_nvml_lists_only_the_containers_own_processes(shim: Shim) -> None:
    """Item 12: without a PID mapping nothing was filtered, so a container's NVML
    listed other containers' processes (by their host PIDs)."""
    fake = {"FAKECUDA_STATE": str(shim.tmp / "gpu.state"), "FAKECUDA_CTX_MIB": "100"}
    a, ra = _container(shim, "a", 100000)
    b, rb = _container(shim, "b", 200000)
    ea = {**fake, "FAKECUDA_HOST_PID_OFFSET": "100000"}
    eb = {**fake, "FAKECUDA_HOST_PID_OFFSET": "200000"}
    holder = subprocess.Popen(b.cmd("ctx", "alloc", 64 * MIB, "hold"), env=b.env(eb),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        for line in holder.stdout:  # b holds its context and 64 MiB
            if '"hold"' in line:
                break
        out, _ = a.run("ctx", "alloc", 32 * MIB, "nvml", env=ea)
        procs = out[-1]["procs"]
        assert len(procs) == 1 and procs[0][1] == 100 * MIB + 32 * MIB, procs
    finally:
        holder.kill()
        holder.wait()
        ra.close()
        rb.close()


def test_nvml_process_utilization_shows_only_the_containers_own(shim: Shim) -> None:
    """Issue 22, finding 12: nvmlDeviceGetProcessUtilization was not filtered: a
    container saw another container's host PIDs and their SM use."""
    fake = {"FAKECUDA_STATE": str(shim.tmp / "gpu.state"), "FAKECUDA_CTX_MIB": "0"}
    a, ra = _container(shim, "a", 100000)
    b, rb = _container(shim, "b", 200000)
    ea = {**fake, "FAKECUDA_HOST_PID_OFFSET": "100000"}
    eb = {**fake, "FAKECUDA_HOST_PID_OFFSET": "200000"}
    busy = subprocess.Popen(b.cmd("ctx", "launch", 4, 5, "kernel"), env=b.env(eb),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        p = subprocess.run(a.cmd("ctx", "launch", 4, "0.5", "kernel", "procutil"), env=a.env(ea),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        util = [json.loads(x) for x in p.stdout.splitlines()][-1]
        assert util["r1"] == 0, util
        pids = [s[0] for s in util["samples"]]
        assert util["need"] == 1 and len(pids) == 1, util  # b's process is not listed
        assert pids[0] < 100000, pids  # its own PID, not its host PID (+100000)
    finally:
        busy.kill()
        busy.wait()
        ra.close()
        rb.close()


def test_past_256_processes_on_a_gpu_the_list_is_still_the_containers_own(shim: Shim) -> None:
    """Issue 22, finding 13: the shim read NVML's process list into 256 rows; past that it
    handed the caller the driver's own answer, unfiltered (or none at all)."""
    fake = {"FAKECUDA_STATE": str(shim.tmp / "gpu.state"), "FAKECUDA_CTX_MIB": "0"}
    a, ra = _container(shim, "a", 100000)
    neighbours = []
    try:
        for _ in range(300):  # other tenants' processes: a context each, no shim
            neighbours.append(subprocess.Popen(
                a.cmd("ctx", "hold"), env=a.env({**fake, "FAKECUDA_HOST_PID_OFFSET": "300000"},
                                                preload=False),
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for n in neighbours:
            assert n.stdout is not None
            for line in n.stdout:
                if '"hold"' in line:
                    break
        out, _ = a.run("ctx", "alloc", 32 * MIB, "nvml",
                       env={**fake, "FAKECUDA_HOST_PID_OFFSET": "100000"}, timeout=120)
        nvml = out[-1]
        assert nvml["r3"] == 0, nvml
        assert len(nvml["procs"]) == 1 and nvml["procs"][0][1] == 32 * MIB, nvml
    finally:
        for n in neighbours:
            n.kill()
        for n in neighbours:
            n.wait()
        ra.close()


def test_every_nvml_view_of_the_gpus_processes_shows_only_the_containers_own(
        shim: Shim) -> None:
    """Issue 22, finding 12 (the rest of it): the graphics and MPS process lists, the
    detail list, the newer utilisation samples, accounting and the device's utilisation
    went to the driver unfiltered: another container's host PIDs, memory and SM use. Each
    now answers with the container's own processes, under their own PIDs; accounting of
    another container's PID is NOT_FOUND; the device's utilisation is the container's
    own share."""
    fake = {"FAKECUDA_STATE": str(shim.tmp / "gpu.state"), "FAKECUDA_CTX_MIB": "0",
            "FAKECUDA_MPS": "1"}
    a, ra = _container(shim, "a", 100000)
    b, rb = _container(shim, "b", 200000)
    ea = {**fake, "FAKECUDA_HOST_PID_OFFSET": "100000"}
    eb = {**fake, "FAKECUDA_HOST_PID_OFFSET": "200000"}
    busy = subprocess.Popen(b.cmd("ctx", "alloc", 64 * MIB, "launch", 1000, 6, "kernel"),
                            env=b.env(eb), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        ops = ["ctx", "alloc", 32 * MIB, "launch", 4, "0.5", "kernel",
               "mpsprocs", 1, "mpsprocs", 2, "mpsprocs", 3, "gfxprocs", 3,
               "detail", 0, "detail", 2, "detail", 0, 64, 2, "utilinfo", "utilrates",
               "acctpids", "acctstats", busy.pid + 200000, "acctstats", busy.pid]
        p = subprocess.run(a.cmd(*ops), env=a.env(ea), capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        out = [json.loads(x) for x in p.stdout.splitlines()]
        by: dict[str, list[dict]] = {}
        for o in out:
            by.setdefault(o["op"], []).append(o)
        me = _own_pid(out)
        for o in by["mpsprocs"] + by["detail"][:2]:
            assert o["rc"] == 0, o
            assert [r["pid"] for r in o["procs"]] == [me], o
        assert by["gfxprocs"][0]["rc"] == 0 and by["gfxprocs"][0]["procs"] == []
        assert by["detail"][0]["procs"][0]["usedGpuMemory"] == 32 * MIB
        assert by["detail"][2]["rc"] == 25  # a struct version it does not know: refused
        (info,) = by["utilinfo"]
        assert info["rc"] == 0 and {s["pid"] for s in info["samples"]} == {me}
        (rates,) = by["utilrates"]
        assert rates["rc"] == 0 and rates["gpu"] <= 60, rates  # its own, not b's ~100 %
        (pids,) = by["acctpids"]
        assert pids["rc"] == 0 and pids["pids"] == [me], pids
        theirs, unknown = by["acctstats"]
        assert theirs["rc"] == 6 and unknown["rc"] == 6  # b's host PID, b's own PID
    finally:
        busy.kill()
        busy.wait()
        ra.close()
        rb.close()


def _own_pid(out: list[dict]) -> int:
    """The PID of the program that printed ``out`` (its launch op says)."""
    return next(o["pid"] for o in out if o["op"] == "launch")
