"""Verify libvgpu.so on a real NVIDIA GPU with PyTorch (see docs/gpu-verification.md).

    python benchmarks/gpu_verify.py [--device 0] [--limit-mib 4096] [--core 30]

Runs each check in a child process with LD_PRELOAD=csrc/build/libvgpu.so and a
temporary shim config (VGPUD_CONFIG), and prints one JSON line per check plus a
summary. Requires: a GPU, its driver, torch with CUDA, nvidia-ml-py. Exit status 0
when every check passed, 1 otherwise, 77 when no GPU is usable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "csrc/build/libvgpu.so"  # --shim: another build
MIB = 1 << 20

CHILD = r"""
import json, os, sys, time
import torch
check = sys.argv[1]; limit = int(sys.argv[2]); core = int(sys.argv[3])
dev = torch.device("cuda:0")
out = {"check": check}
if check == "meminfo":
    free, total = torch.cuda.mem_get_info(0)
    out.update(total=total, free=free, ok=total == limit)
elif check == "oom":
    blocks, n = [], 0
    try:
        while True:
            blocks.append(torch.empty(64 * 2**20, dtype=torch.uint8, device=dev)); n += 1
    except torch.cuda.OutOfMemoryError:
        pass
    # memory_reserved is 0 under the cudaMallocAsync backend: the blocks held count too
    reserved = torch.cuda.memory_reserved(0)
    out.update(blocks=n, reserved=reserved, ok=0 < n * 64 * 2**20 <= limit and reserved <= limit)
elif check == "nvml":
    import pynvml
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("VERIFY_NVML_INDEX", "0")))
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    free, total = torch.cuda.mem_get_info(0)
    procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    out.update(nvml_total=m.total, nvml_used=m.used, cuda_total=total, cuda_free=free,
               procs=procs, ok=m.total == total == limit and abs(m.used - (total - free)) < 2**20)
elif check == "matmul":
    a = torch.randn(4096, 4096, device=dev); b = torch.randn(4096, 4096, device=dev)
    torch.cuda.synchronize(); n = 0; t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        a @ b; n += 1
        if n % 20 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize()
    out.update(iters_per_s=n / (time.monotonic() - t0), ok=True)
elif check == "graph":
    a = torch.randn(2048, 2048, device=dev); s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        a @ a; torch.cuda.synchronize()
        with torch.cuda.graph(g): c = a @ a
    n = 0; t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        g.replay(); n += 1
        if n % 20 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize()
    out.update(replays_per_s=n / (time.monotonic() - t0), ok=True)
elif check == "sleep":
    # One-block spin kernels of a fixed length (torch.cuda._sleep counts SM clock
    # cycles): the device time each launch takes is known, whatever the shim charged.
    # argv[4:]: cycles per kernel, one entry per length. Reports kernels per second
    # for each length, each measured over 4 s (VERIFY_SLEEP_S); the unlimited run also
    # times one kernel with CUDA events so the lengths are read, not assumed.
    rates, lengths = [], []
    torch.cuda._sleep(1000); torch.cuda.synchronize()
    for cycles in map(int, sys.argv[4:]):
        if core == 0:
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            for _ in range(3):
                torch.cuda._sleep(cycles)
            torch.cuda.synchronize(); e0.record(); torch.cuda._sleep(cycles); e1.record()
            torch.cuda.synchronize(); lengths.append(e0.elapsed_time(e1))
        n = 0; t0 = time.monotonic()
        while time.monotonic() - t0 < float(os.environ.get("VERIFY_SLEEP_S", "4")):
            torch.cuda._sleep(cycles); n += 1
            if n % 4 == 0: torch.cuda.synchronize()
        torch.cuda.synchronize()
        rates.append(n / (time.monotonic() - t0))
    out.update(kernels_per_s=rates, kernel_ms=lengths, ok=True)
elif check == "legacy":
    # 256 MiB blocks taken straight from libcuda until it refuses (or 4x the limit):
    # cuMemAlloc_v2 (hooked) beside cuMemAllocPitch_v2 (a legacy path, issue 22).
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
    d = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(d), 0)
    ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d)
    cu.cuCtxSetCurrent(ctx)
    def take(alloc):
        ptrs = []
        while len(ptrs) * 256 * 2**20 < 4 * limit:
            p = ctypes.c_uint64()
            if alloc(p) != 0: break
            ptrs.append(p)
        for p in ptrs: cu.cuMemFree_v2(p)
        return len(ptrs) * 256 * 2**20
    pitch = ctypes.c_size_t()
    plain = take(lambda p: cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 * 2**20)))
    pitched = take(lambda p: cu.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch),
                   ctypes.c_size_t(2**16), ctypes.c_size_t(4096), ctypes.c_uint(16)))
    out.update(cuMemAlloc_v2=plain, cuMemAllocPitch_v2=pitched,
               ok=0 < plain <= limit and 0 < pitched <= limit)
elif check == "routing":
    # Under the shim: for every hooked family (the hook names without _v2/_ptsz...), what
    # cuGetProcAddress_v2 hands out at CUDA 12.0 and 13.0 with the legacy and the
    # per-thread stream flags: the shim's hook, or a driver export it does not hook (an
    # escape). Real addresses come from the mapping of libcuda and nm, not from dlsym
    # (which the shim routes). Also every driver export of a hooked family, or of a
    # memory-taking family, that no hook covers.
    import ctypes, re, subprocess
    hooks = os.environ["VERIFY_HOOKS"].split(",")
    shim = ctypes.CDLL(os.environ["LD_PRELOAD"])
    cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
    lib, base = None, None
    for line in open("/proc/self/maps"):
        f = line.split()
        if len(f) >= 6 and "libcuda.so" in f[5] and int(f[2], 16) == 0:
            lib, base = f[5], int(f[0].split("-")[0], 16); break
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    exports = {}
    for line in nm.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "Tt" and f[2].startswith("cu"):
            exports[base + int(f[0], 16)] = f[2].split("@")[0]
    hook_addr = {ctypes.cast(getattr(shim, n), ctypes.c_void_p).value: n for n in hooks}
    family = lambda n: re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n)
    families = sorted({family(n) for n in hooks})
    get = shim.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    escapes, routed = {}, 0
    for fam in families:
        for ver in (12000, 13000):
            for flags in (1, 2):
                ptr, st = ctypes.c_void_p(), ctypes.c_int()
                if get(fam.encode(), ctypes.byref(ptr), ver, flags, ctypes.byref(st)) != 0:
                    continue
                if ptr.value in hook_addr:
                    routed += 1
                elif not ptr.value:  # not at this version (symbolStatus says so): no address
                    continue
                else:
                    escapes[f"{fam}@{ver}/{'ptds' if flags == 2 else 'legacy'}"] = \
                        exports.get(ptr.value, hex(ptr.value or 0))
    names = set(exports.values())
    memory = re.compile(r"^cu(Mem|Array|Mipmapped|Ctx(Create|SetLimit)|DevicePrimaryCtx|"
                        r"Module(Load|Get)|Library(Load)|GreenCtx|Ipc|(Import|Destroy)External|"
                        r"Multicast|Graph(Instantiate|Upload|Launch|ExecUpdate|AddMem)|"
                        r"LaunchKernel|LaunchCooperative)")
    unhooked_in_family = sorted(n for n in names if family(n) in families and n not in hooks)
    reads = re.compile(r"^cuMem(cpy|set|GetAllocationGranularity|GetAddressRange|GetInfo|"
                       r"GetAccess|.*Host|Pool(Get|Set)Attribute|PoolGetAccess|AddressFree|"
                       r"SetAccess|RangeGet|GetHandleForAddressRange)|^cuModuleGet(Function|"
                       r"Global|Tex|Surf|LoadingMode)|^cuDevicePrimaryCtxGetState")
    unhooked_memory = sorted(n for n in names if memory.match(n) and not reads.match(n)
                             and family(n) not in families)
    out.update(driver_exports=len(names), hooks=len(hooks), routed=routed,
               escapes=escapes, unhooked_variants=unhooked_in_family,
               unhooked_memory_families=unhooked_memory, ok=not escapes)
elif check == "setlimit":
    # Memory the driver takes for cuCtxSetLimit (stack, malloc heap): what the shim
    # charged (cuMemGetInfo through the shim) against what NVML sees the process use.
    import ctypes, pynvml
    x = torch.ones(1024, device=dev); torch.cuda.synchronize()
    pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
    def seen():
        free, total = torch.cuda.mem_get_info(0)
        used = sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        return total - free, used
    cu = ctypes.CDLL("libcuda.so.1")
    steps = {}
    steps["start"] = seen()
    for what, lim, val in (("malloc_heap_1GiB", 2, 2**30), ("stack_8KiB", 0, 8192)):
        rc = cu.cuCtxSetLimit(ctypes.c_int(lim), ctypes.c_size_t(val))
        y = x * 2; torch.cuda.synchronize()
        time.sleep(0.15)  # the shim measures what no hook saw at most every 100 ms
        steps[what] = seen() + (rc,)
    out.update(charged_vs_nvml={k: list(v) for k, v in steps.items()},
               ok=all(v[0] >= v[1] - 2**21 for v in steps.values()))
elif check == "views":
    # Every NVML view of the GPU's processes the shim filters (issue 22, finding 12):
    # inside the container only its own processes, by its own PIDs.
    import pynvml
    x = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev); torch.cuda.synchronize()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("VERIFY_NVML_INDEX", "0")))
    me, got = os.getpid(), {}
    def ask(name, fn):
        try: got[name] = fn()
        except pynvml.NVMLError as e: got[name] = f"error: {e}"
    ask("compute", lambda: [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
    ask("graphics", lambda: [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)])
    ask("mps", lambda: [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)])
    ask("utilization", lambda: [u.pid for u in pynvml.nvmlDeviceGetProcessUtilization(h, 0)])
    ask("accounting", lambda: list(pynvml.nvmlDeviceGetAccountingPids(h)))
    ask("rates_gpu", lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
    lists = [v for v in got.values() if isinstance(v, list)]
    out.update(views=got, pid=me, ok=bool(lists) and all(set(v) <= {me} for v in lists))
elif check == "calibrate":
    # Cycles per millisecond of torch.cuda._sleep at the clock a busy GPU runs at.
    torch.cuda._sleep(10**6); torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
    for _ in range(20): torch.cuda._sleep(2 * 10**6)
    e0.record(); torch.cuda._sleep(10**7); e1.record(); torch.cuda.synchronize()
    out.update(cycles_per_ms=10**7 / e0.elapsed_time(e1), ok=True)
print(json.dumps(out))
"""


def children(
    n: int, check: str, cfg: Path | None, limit: int, core: int, extra: dict[str, str],
    args: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """``n`` copies of a check at once, under the shim with ``cfg`` (one usage state: the
    processes of one container) or, with None, without it; each one's result."""
    env = dict(os.environ, **extra)
    if cfg is not None:
        env.update(LD_PRELOAD=str(SHIM), VGPUD_CONFIG=str(cfg))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, check, str(limit), str(core), *args],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(n)]
    keep = os.environ.get("VERIFY_STDERR_DIR")  # the shim's log (VGPUD_LOG_LEVEL), kept
    results = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += "\n(killed after 300 s)"
        if keep and cfg is not None:
            Path(keep, f"{check}-{core}-{i}.log").write_text(err)
        if p.returncode != 0 or not out.strip():
            results.append({"check": check, "ok": False, "rc": p.returncode,
                            "error": err[-2000:]})
            continue
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        if err.strip():
            result["stderr"] = err[-600:]
        results.append(result)
    return results


def child(
    check: str, cfg: Path | None, limit: int, core: int, extra: dict[str, str],
    args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One process of a check (see children)."""
    return children(1, check, cfg, limit, core, extra, args)[0]


PROC_NAMES = ("cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuLaunchKernel", "cuCtxCreate",
              "cuMemAllocPitch", "cuMemAllocAsync", "cuMemCreate", "cuGraphInstantiate",
              "cuArrayCreate", "cuMemAllocManaged", "cuCtxGetDevice")


def proc_addresses() -> dict[str, Any]:
    """The shim routes by pointer identity: what the real driver hands out through
    cuGetProcAddress_v2 must be one of the functions it exports. For each name, the
    exported symbol (name, name_v2 ... name_v4, or _ptsz) whose address the driver gave
    at CUDA 12.0 and at the driver's own version."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) != 0:
        return {"check": "proc_address_identity", "ok": False, "error": "cuInit failed"}
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    get = cuda.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    exported: dict[int, str] = {}
    for name in PROC_NAMES:
        for suffix in ("", "_v2", "_v3", "_v4", "_ptsz", "_v2_ptsz"):
            try:
                fn = getattr(cuda, name + suffix)
            except AttributeError:
                continue
            addr = ctypes.cast(fn, ctypes.c_void_p).value
            if addr:
                exported[addr] = name + suffix
    found: dict[str, Any] = {}
    ok = True
    for name in PROC_NAMES:
        for at in (12000, version.value):
            ptr, status = ctypes.c_void_p(), ctypes.c_int()
            rc = get(name.encode(), ctypes.byref(ptr), at, 0, ctypes.byref(status))
            which = exported.get(ptr.value or 0, "NOT EXPORTED" if ptr.value else None)
            found[f"{name}@{at}"] = which if rc == 0 else f"rc={rc}"
            ok = ok and (rc != 0 or which != "NOT EXPORTED")
    return {"check": "proc_address_identity", "driver_cuda": version.value, "ok": ok,
            "resolved": found}


def environment() -> dict[str, Any]:
    """What the figures were measured on: GPU, driver, CUDA and torch versions."""
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                          "clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return {"check": "environment", "ok": True, "gpu": smi.stdout.strip(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}


class Results(list[dict[str, Any]]):
    """The checks' results, each printed (and written to ``out``) as it comes: a run cut
    short by the machine's lease still leaves what it measured."""

    def __init__(self, out: Path | None) -> None:
        super().__init__()
        self.out = out
        if out:
            out.write_text("")

    def append(self, r: dict[str, Any]) -> None:
        super().append(r)
        print(json.dumps(r), flush=True)
        if self.out:
            with self.out.open("a") as f:
                f.write(json.dumps(r) + "\n")


# ---- escapes: issue 22's ways past the memory limit, on the real driver ----
#
# The fake driver's test programs (tests/fakes/progs) speak the official driver ABI and
# dlopen libcuda.so.1: built into a folder without the fake beside them, they reach the
# real driver. Each scenario drives one or two of them under the shim, one op at a time,
# and reads after every op what NVML (in this process, without the shim) says the
# scenario's processes hold on the GPU: the limit holds when that never passes it.

PTX = """.version 8.0
.target sm_{arch}
.address_size 64
.visible .global .align 8 .b8 hoard[{size}];
.visible .entry fake_kernel()
{{
    ret;
}}
"""


class Interp:
    """One test program under the shim, driven op by op (its stdin mode)."""

    def __init__(self, prog: Path, env: dict[str, str]) -> None:
        self.p = subprocess.Popen([str(prog)], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def ask(self, op: str) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(op + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            err = self.p.stderr.read() if self.p.stderr else ""
            return {"op": op.split()[0], "rc": -9, "error": f"no answer: {err[-300:]}"}
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


class Scenario:
    """The processes of one scenario (one container: one shim state), every op logged,
    and the most NVML saw them hold together after any op."""

    def __init__(self, prog: Path, env: dict[str, str], nvml: Any, handle: Any) -> None:
        self.prog, self.env, self.nvml, self.handle = prog, env, nvml, handle
        self.procs: list[Interp] = []
        self.log: list[str] = []
        self.peak = 0

    def spawn(self) -> Interp:
        p = Interp(self.prog, self.env)
        self.procs.append(p)
        return p

    def held(self) -> list[int]:
        """What NVML says each of the scenario's processes holds on the GPU."""
        rows = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        used = {r.pid: r.usedGpuMemory or 0 for r in rows}
        return [used.get(p.pid, 0) for p in self.procs]

    def ask(self, p: Interp, op: str) -> dict[str, Any]:
        got = p.ask(op)
        held = self.held()
        self.peak = max(self.peak, sum(held))
        mib = ",".join(str(h >> 20) for h in held)
        self.log.append(f"{self.procs.index(p)}:{op} -> {got.get('rc')} [{mib} MiB]")
        return got

    def close(self) -> None:
        for p in self.procs:
            p.close()


def esc_legacy(s: Scenario, limit: int) -> bool:
    """Finding 1: the pre-3.2 entry points (32-bit sizes), each asked for 1.5x the limit."""
    a = s.spawn()
    s.ask(a, "use 0")
    rows = limit * 3 // 2 // 65536
    big = [s.ask(a, f"pitch1 0 65536 {rows}"), s.ask(a, f"array1 0 65536 {rows}"),
           s.ask(a, f"array3d1 0 1024 1024 {rows * 64 // 1024}")]
    return all(g["rc"] == OOM for g in big)


def esc_contexts(s: Scenario, limit: int) -> bool:
    """Finding 6: created contexts, each the driver's own few hundred MiB."""
    a = s.spawn()
    got = [s.ask(a, "ctx 0")["rc"] for _ in range(limit // (256 * MIB) + 2)]
    return bool(OOM in got and got[0] == 0)


def esc_pool(s: Scenario, limit: int) -> bool:
    """Finding 5: a pool that keeps its free reserve (as PyTorch's cudaMallocAsync backend
    sets it), fragmented by freeing every other block, then asked for larger blocks."""
    a = s.spawn()
    s.ask(a, "use 0")
    pool = s.ask(a, "curpool 0")["id"]
    s.ask(a, f"poolsetattr {pool} threshold {1 << 40}")
    blocks = [s.ask(a, "async 0 128m") for _ in range(limit // (256 * MIB))]
    for b in blocks[::2]:
        s.ask(a, f"free {b['id']}")
    big = [s.ask(a, "async 0 384m")["rc"] for _ in range(limit // (384 * MIB) + 1)]
    return OOM in big


def esc_graph(s: Scenario, limit: int) -> bool:
    """Findings 1, 2, 19: a graph's allocation node past the limit, instantiated through
    the CUDA 10 name, and an upload (instantiate-with-upload) that then leaves too little."""
    a = s.spawn()
    s.ask(a, "use 0")
    g = s.ask(a, f"graphalloc 0 {limit * 3 // 2} 1 v1")
    launched = s.ask(a, f"graphlaunch {g['id']}")
    up = s.ask(a, f"graphalloc 0 {limit // 2} 1 up")
    after = s.ask(a, f"alloc 0 {limit // 2}")
    return bool(g["rc"] == 0 and launched["rc"] == OOM and up["rc"] == 0 and after["rc"] == OOM)


def esc_vmm(how: str) -> Callable[[Scenario, int], bool]:
    def run(s: Scenario, limit: int) -> bool:
        """Finding 3: VMM memory kept alive after its creator's release and unmap by a
        retained handle, or by an exported descriptor imported again, block after block."""
        a = s.spawn()
        s.ask(a, "use 0")
        refused = False
        for _ in range(limit // (512 * MIB) + 2):
            v = s.ask(a, "vmm 0 512m fd" if how == "import" else "vmm 0 512m")
            if v["rc"] == OOM:
                refused = True
                break
            if how == "retain":
                s.ask(a, f"retain {v['id']}")
            else:
                fd = s.ask(a, f"export {v['id']}")["fd"]
                s.ask(a, f"import {fd}")
                s.ask(a, f"closefd {fd}")
            s.ask(a, f"unmap {v['id']}")
            s.ask(a, f"memrelease {v['id']}")
        return refused
    run.__doc__ = esc_vmm.__doc__
    return run


def esc_ipc(s: Scenario, limit: int) -> bool:
    """Finding 19 (IPC): A allocates, B opens it, A frees it (B keeps the memory) and asks
    for as much again."""
    a, b = s.spawn(), s.spawn()
    s.ask(a, "use 0")
    s.ask(b, "use 0")
    size = limit * 2 // 5
    x = s.ask(a, f"alloc 0 {size}")
    h = s.ask(a, f"ipcget {x['id']}")
    o = s.ask(b, f"ipcopen {h.get('handle', '')}")
    s.ask(a, f"free {x['id']}")
    again = s.ask(a, f"alloc 0 {size}")
    return bool(x["rc"] == 0 and o["rc"] == 0 and again["rc"] == OOM)


def esc_pool_ipc(s: Scenario, limit: int) -> bool:
    """Finding 19 (pool IPC): A's shareable pool, a pointer of it imported by B (a driver
    refuses the pointer's export before the pool's); A frees it and trims the pool, then
    asks the pool for as much again."""
    a, b = s.spawn(), s.spawn()
    s.ask(a, "use 0")
    s.ask(b, "use 0")
    size = limit * 2 // 5
    pool = s.ask(a, "pool 0 ipc")["id"]
    x = s.ask(a, f"poolalloc {pool} {size}")
    early = s.ask(a, f"ptrexport {x.get('ptr')}")  # refused before the pool's own export
    fd = s.ask(a, f"poolexport {pool}").get("fd")
    data = s.ask(a, f"ptrexport {x.get('ptr')}").get("data", "")
    theirs = s.ask(b, f"poolimport {a.pid}:{fd}")
    got = s.ask(b, f"ptrimport {theirs.get('id')} {data}")
    s.ask(a, f"freeasync {x.get('ptr')}")
    s.ask(a, f"trim {pool} 0")
    s.ask(a, f"poolalloc {pool} {size}")  # refused, or the pool's freed block again (an
    # H200 gave it back to the pool and took it again, NVML unchanged): the peak decides
    return bool(early["rc"] == 1 and x["rc"] == 0 and got["rc"] == 0)


def esc_green(s: Scenario, limit: int) -> bool:
    """Finding 19 (green contexts): one green context after another on 8 SMs each, until
    one is refused or as many as would pass the limit at 256 MiB each are made (what one
    takes is the driver's: the peak decides)."""
    a = s.spawn()
    got = [s.ask(a, "green 0 8")["rc"] for _ in range(limit // (256 * MIB) + 2)]
    return bool(got[0] == 0)


def esc_module(s: Scenario, limit: int) -> bool:
    """Finding 19 (module loads): a module whose __device__ array takes a quarter of the
    limit (INTERP_IMAGE: PTX); no hook sees it, NVML does; then its kernel launched, and as
    much allocated as the limit had left before the load."""
    a = s.spawn()
    s.ask(a, "use 0")
    s.ask(a, "sleep 150")
    before = s.ask(a, "info")
    m = s.ask(a, "module 0")
    k = s.ask(a, "launch 1 10")
    s.ask(a, "sleep 150")
    rest = s.ask(a, f"alloc 0 {before.get('free', 0) - 16 * MIB}")
    return bool(m["rc"] == 0 and k["rc"] == 0 and rest["rc"] == OOM)


OOM = 2
ESCAPES: dict[str, Callable[[Scenario, int], bool]] = {
    "legacy": esc_legacy, "contexts": esc_contexts, "pool_growth": esc_pool,
    "graph": esc_graph, "vmm_retain": esc_vmm("retain"), "vmm_import": esc_vmm("import"),
    "ipc": esc_ipc, "pool_ipc": esc_pool_ipc, "green": esc_green, "module": esc_module,
}


def escapes(limit: int, config: Callable[[str], Path], extra: dict[str, str],
            tmp: Path, only: set[str]) -> list[dict[str, Any]]:
    """Each scenario of ESCAPES on the driver the dynamic linker finds (a real one unless
    LD_LIBRARY_PATH names another), under the shim with ``limit``."""
    import pynvml

    progs = tmp / "progs"
    subprocess.run(["make", "-s", "-C", str(ROOT / "tests/fakes"), f"B={progs}",
                    f"{progs}/viaproc"], check=True)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("VERIFY_NVML_INDEX", "0")))
    image = tmp / "hoard.ptx"
    image.write_text(PTX.format(arch=extra.get("VERIFY_ARCH", "90"), size=limit // 4))
    results = []
    for name, run in ESCAPES.items():
        if only and name not in only:
            continue
        env = dict(os.environ, **extra, LD_PRELOAD=str(SHIM),
                   VGPUD_CONFIG=str(config(name)), INTERP_IMAGE=str(image))
        s = Scenario(progs / "viaproc", env, pynvml, handle)
        t0 = time.monotonic()
        try:
            expected = run(s, limit)
        except Exception as e:  # a scenario's failure is its result, not the run's end
            expected = False
            s.log.append(f"error: {e!r}")
        finally:
            s.close()
        results.append({"check": f"escape_{name}", "peak": s.peak, "limit": limit,
                        "as_expected": expected, "ok": expected and 0 < s.peak <= limit,
                        "s": round(time.monotonic() - t0, 1), "ops": s.log})
    pynvml.nvmlShutdown()
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0, help="CUDA ordinal to verify")
    ap.add_argument("--limit-mib", type=int, default=4096)
    ap.add_argument("--core", default="30",
                    help="SM limits in percent, comma-separated (the sm, sleep and sleep2 "
                         "groups run at each)")
    ap.add_argument("--kernel-ms", default="0.1,1,5,20",
                    help="lengths of the spin kernels the SM limit is measured with")
    ap.add_argument("--escape-limit-mib", type=int, default=2048,
                    help="the memory limit the escapes group runs under")
    ap.add_argument("--escapes", default="",
                    help="the escapes group's scenarios to run, comma-separated (default all: "
                         + ", ".join(ESCAPES) + ")")
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    ap.add_argument("--checks", default="memory,views,routing,escapes,sm,sleep,sleep2,smi",
                    help="which groups to run: memory, views (NVML), routing, escapes (issue "
                         "22's paths, through tests/fakes' test programs), sm (matmul, graph), "
                         "sleep, sleep2 (two processes of one container), smi")
    ap.add_argument("--shim", type=Path, help="the libvgpu.so to preload, as it is (default: "
                    "the one csrc's make builds first)")
    args = ap.parse_args()
    if args.shim:
        global SHIM
        SHIM = args.shim.resolve()
    groups = set(args.checks.split(","))
    only = set(filter(None, args.escapes.split(",")))
    known = {"memory", "views", "routing", "escapes", "sm", "sleep", "sleep2", "smi"}
    if groups - known or only - set(ESCAPES):
        ap.error("unknown: " + ", ".join(sorted((groups - known) | (only - set(ESCAPES))))
                 + f" (groups: {', '.join(sorted(known))}; escapes: {', '.join(ESCAPES)})")
    try:
        cores = [int(c) for c in str(args.core).split(",")]
        wanted = [float(x) for x in args.kernel_ms.split(",")]
    except ValueError as e:
        ap.error(f"--core takes whole percents and --kernel-ms milliseconds, comma-separated: {e}")
    if not all(0 < c <= 100 for c in cores) or not all(ms > 0 for ms in wanted):
        ap.error("--core takes percents from 1 to 100, --kernel-ms lengths above 0")
    torch_groups = groups - {"escapes"}
    try:
        import torch
    except ImportError:
        torch = None
    if torch_groups and (torch is None or not torch.cuda.is_available()):
        print("torch with a usable CUDA device is needed for: " + ",".join(sorted(torch_groups)))
        return 77
    if not args.shim:  # a build given is used as it is
        subprocess.run(["make", "-s", "-C", str(ROOT / "csrc")], check=True)
    limit = args.limit_mib * MIB
    base_env = {"CUDA_VISIBLE_DEVICES": str(args.device)}
    results = Results(args.out)
    if torch is not None and torch_groups:
        results.append(environment())
        results.append(proc_addresses())
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state"
        state.mkdir()

        def config(core: int, policy: str = "fixed", memory: int = limit,
                   state: Path = state) -> Path:
            c = Path(d) / f"config-{core}-{policy}-{memory}-{state.name}"
            state.mkdir(exist_ok=True)
            c.write_text(f"version=1\ndevice.0.memory_limit={memory}\n"
                         f"device.0.core_limit={core}\ndevice.0.core_policy={policy}\n"
                         f"state_dir={state}\n")
            return c

        for check in ("meminfo", "oom", "nvml") if "memory" in groups else ():
            results.append(child(check, config(0), limit, 0, base_env))
        if "memory" in groups:
            results.append({**child("oom", config(0), limit, 0, dict(
                base_env, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")),
                "check": "oom_expandable_segments"})
            results.append(child("legacy", config(0), limit, 0, base_env))
            results.append({**child("oom", config(0), limit, 0, dict(
                base_env, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")),
                "check": "oom_cudaMallocAsync"})
            results.append(child("setlimit", config(0), limit, 0, base_env))
        if "views" in groups:
            results.append(child("views", config(0), limit, 0, base_env))
        if "routing" in groups:
            hooks = re.findall(r"^HOOK\(CU, (\w+),", (ROOT / "csrc/src/hooks.def").read_text(),
                               re.M)
            results.append(child("routing", config(0), limit, 0,
                                 dict(base_env, VERIFY_HOOKS=",".join(hooks))))
        if "escapes" in groups:
            arch = "".join(map(str, torch.cuda.get_device_capability(args.device))) \
                if torch is not None and torch.cuda.is_available() else "80"
            esc_limit = args.escape_limit_mib * MIB
            for r in escapes(esc_limit, lambda name: config(
                    0, memory=esc_limit, state=Path(d) / f"state-{name}"),
                    dict(base_env, VERIFY_ARCH=arch), Path(d),
                    only):
                results.append(r)
        for core in cores:
            for check in ("matmul", "graph") if "sm" in groups else ():
                free = child(check, None, limit, 0, base_env)
                capped = child(check, config(core), limit, core, base_env)
                key = "iters_per_s" if check == "matmul" else "replays_per_s"
                ratio = capped.get(key, 0) / free[key] if free.get(key) else 0.0
                results.append({"check": f"{check}_sm_limit", "unlimited": free.get(key),
                                "limited": capped.get(key), "ratio": ratio,
                                "target": core / 100, "ok": abs(ratio - core / 100) <= 0.05})
        cal = child("calibrate", None, limit, 0, base_env) \
            if groups & {"sleep", "sleep2"} else {}
        if cal:
            results.append(cal)
        cycles = tuple(str(int(ms * cal["cycles_per_ms"])) for ms in wanted) \
            if cal.get("ok") else ()
        free_sleep = child("sleep", None, limit, 0, base_env, cycles) if cycles else {}
        for core in cores if cycles else ():
            runs: list[tuple[str, list[dict[str, Any]]]] = []
            if "sleep" in groups:
                runs.append(("sleep", [child("sleep", config(core), limit, core, base_env,
                                             cycles)]))
            if "sleep2" in groups:
                runs.append(("sleep2", children(2, "sleep", config(
                    core, state=Path(d) / f"state-two-{core}"), limit, core, base_env, cycles)))
            for name, procs in runs:
                for i, ms in enumerate(wanted):
                    f = (free_sleep.get("kernels_per_s") or [0] * len(wanted))[i]
                    c = sum((r.get("kernels_per_s") or [0] * len(wanted))[i] for r in procs)
                    ratio = c / f if f else 0.0
                    bad = [r for r in [free_sleep, *procs] if not r.get("ok")]
                    results.append({"check": f"{name}_sm_limit_{ms}ms",
                                    "kernel_ms": (free_sleep.get("kernel_ms")
                                                  or [None] * len(wanted))[i],
                                    "unlimited": f, "limited": c, "ratio": ratio,
                                    "target": core / 100,
                                    "ok": not bad and abs(ratio - core / 100) <= 0.05,
                                    **({"error": bad[0].get("error")} if bad else {})})
        if "smi" in groups:
            smi = subprocess.run(["nvidia-smi"], env=dict(os.environ, LD_PRELOAD=str(SHIM),
                                                 VGPUD_CONFIG=str(config(0))),
                capture_output=True, text=True)
            results.append({"check": "nvidia-smi", "ok": smi.returncode == 0,
                            "output": smi.stdout[-1500:]})
    ok = all(r.get("ok") for r in results)
    print(json.dumps({"summary": "pass" if ok else "fail", "date": time.strftime("%Y-%m-%d")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
