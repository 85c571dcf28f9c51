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
    reserved = torch.cuda.memory_reserved(0)
    out.update(blocks=n, reserved=reserved, ok=0 < reserved <= limit)
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
print(json.dumps(out))
"""


def child(
    check: str, cfg: Path | None, limit: int, core: int, extra: dict[str, str]
) -> dict[str, Any]:
    env = dict(os.environ, **extra)
    if cfg is not None:
        env["LD_PRELOAD"] = str(ROOT / "csrc/build/libvgpu.so")
        env["VGPUD_CONFIG"] = str(cfg)
    p = subprocess.run([sys.executable, "-c", CHILD, check, str(limit), str(core)], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"check": check, "ok": False, "error": p.stderr[-2000:]}
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0, help="CUDA ordinal to verify")
    ap.add_argument("--limit-mib", type=int, default=4096)
    ap.add_argument("--core", type=int, default=30, help="SM limit in percent")
    args = ap.parse_args()
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
    results = []
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state"
        state.mkdir()

        def config(core: int, policy: str = "fixed") -> Path:
            c = Path(d) / f"config-{core}-{policy}"
            c.write_text(f"version=1\ndevice.0.memory_limit={limit}\ndevice.0.core_limit={core}\n"
                         f"device.0.core_policy={policy}\nstate_dir={state}\n")
            return c

        for check in ("meminfo", "oom", "nvml"):
            results.append(child(check, config(0), limit, 0, base_env))
        results.append(child("oom", config(0), limit, 0,
                             dict(base_env, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")))
        results[-1]["check"] = "oom_expandable_segments"
        for check in ("matmul", "graph"):
            free = child(check, None, limit, 0, base_env)
            capped = child(check, config(args.core), limit, args.core, base_env)
            key = "iters_per_s" if check == "matmul" else "replays_per_s"
            ratio = capped.get(key, 0) / free[key] if free.get(key) else 0.0
            results.append({"check": f"{check}_sm_limit", "unlimited": free.get(key),
                            "limited": capped.get(key), "ratio": ratio, "target": args.core / 100,
                            "ok": abs(ratio - args.core / 100) <= 0.05})
        smi = subprocess.run(["nvidia-smi"], env=dict(os.environ, LD_PRELOAD=str(
            ROOT / "csrc/build/libvgpu.so"), VGPUD_CONFIG=str(config(0))),
            capture_output=True, text=True)
        results.append({"check": "nvidia-smi", "ok": smi.returncode == 0,
                        "output": smi.stdout[-1500:]})
    for r in results:
        print(json.dumps(r))
    ok = all(r.get("ok") for r in results)
    print(json.dumps({"summary": "pass" if ok else "fail", "date": time.strftime("%Y-%m-%d")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
