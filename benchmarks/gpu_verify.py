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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
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
    # for each length, each measured over 4 s; the unlimited run also times one kernel
    # with CUDA events so the lengths are read, not assumed.
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
        while time.monotonic() - t0 < 4:
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


def child(
    check: str, cfg: Path | None, limit: int, core: int, extra: dict[str, str],
    args: tuple[str, ...] = (),
) -> dict[str, Any]:
    env = dict(os.environ, **extra)
    if cfg is not None:
        env["LD_PRELOAD"] = str(ROOT / "csrc/build/libvgpu.so")
        env["VGPUD_CONFIG"] = str(cfg)
    p = subprocess.run([sys.executable, "-c", CHILD, check, str(limit), str(core), *args],
                       env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0 or not p.stdout.strip():
        return {"check": check, "ok": False, "rc": p.returncode, "error": p.stderr[-2000:]}
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    if p.stderr.strip():
        result["stderr"] = p.stderr[-600:]
    return result


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0, help="CUDA ordinal to verify")
    ap.add_argument("--limit-mib", type=int, default=4096)
    ap.add_argument("--core", type=int, default=30, help="SM limit in percent")
    ap.add_argument("--kernel-ms", default="0.1,1,5,20",
                    help="lengths of the spin kernels the SM limit is measured with")
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    ap.add_argument("--checks", default="memory,views,routing,sm,sleep,smi",
                    help="which groups to run: memory, views (NVML), routing, sm (matmul, "
                         "graph), sleep, smi")
    args = ap.parse_args()
    groups = set(args.checks.split(","))
    try:
        import torch
    except ImportError:
        print("torch not installed")
        return 77
    if not torch.cuda.is_available():
        print("no usable CUDA device")
        return 77
    subprocess.run(["make", "-s", "-C", str(ROOT / "csrc")], check=True)
    limit = args.limit_mib * MIB
    base_env = {"CUDA_VISIBLE_DEVICES": str(args.device)}
    results = Results(args.out)
    results.append(environment())
    results.append(proc_addresses())
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state"
        state.mkdir()

        def config(core: int, policy: str = "fixed") -> Path:
            c = Path(d) / f"config-{core}-{policy}"
            c.write_text(f"version=1\ndevice.0.memory_limit={limit}\ndevice.0.core_limit={core}\n"
                         f"device.0.core_policy={policy}\nstate_dir={state}\n")
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
        for check in ("matmul", "graph") if "sm" in groups else ():
            free = child(check, None, limit, 0, base_env)
            capped = child(check, config(args.core), limit, args.core, base_env)
            key = "iters_per_s" if check == "matmul" else "replays_per_s"
            ratio = capped.get(key, 0) / free[key] if free.get(key) else 0.0
            results.append({"check": f"{check}_sm_limit", "unlimited": free.get(key),
                            "limited": capped.get(key), "ratio": ratio, "target": args.core / 100,
                            "ok": abs(ratio - args.core / 100) <= 0.05})
        cal = child("calibrate", None, limit, 0, base_env) if "sleep" in groups else {}
        if cal:
            results.append(cal)
        if cal.get("ok"):
            wanted = [float(x) for x in args.kernel_ms.split(",")]
            cycles = tuple(str(int(ms * cal["cycles_per_ms"])) for ms in wanted)
            free = child("sleep", None, limit, 0, base_env, cycles)
            capped = child("sleep", config(args.core), limit, args.core, base_env, cycles)
            for i, ms in enumerate(wanted):
                f = (free.get("kernels_per_s") or [0] * len(wanted))[i]
                c = (capped.get("kernels_per_s") or [0] * len(wanted))[i]
                ratio = c / f if f else 0.0
                results.append({"check": f"sleep_sm_limit_{ms}ms",
                                "kernel_ms": (free.get("kernel_ms") or [None] * len(wanted))[i],
                                "unlimited": f, "limited": c, "ratio": ratio,
                                "target": args.core / 100,
                                "ok": abs(ratio - args.core / 100) <= 0.05,
                                **({"error": capped.get("error") or free.get("error")}
                                   if not (free.get("ok") and capped.get("ok")) else {})})
        if "smi" in groups:
            smi = subprocess.run(["nvidia-smi"], env=dict(os.environ, LD_PRELOAD=str(
                ROOT / "csrc/build/libvgpu.so"), VGPUD_CONFIG=str(config(0))),
                capture_output=True, text=True)
            results.append({"check": "nvidia-smi", "ok": smi.returncode == 0,
                            "output": smi.stdout[-1500:]})
    ok = all(r.get("ok") for r in results)
    print(json.dumps({"summary": "pass" if ok else "fail", "date": time.strftime("%Y-%m-%d")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
