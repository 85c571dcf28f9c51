"""An NVML client the selftests drive one command a line on stdin (one JSON line back), so
a query can land in a chosen sampling window and run in a chosen PID namespace.

    util DEV LASTSEEN      nvmlDeviceGetProcessUtilization (pynvml)
    raw DEV LASTSEEN ROOM  the same through ctypes: ROOM entries (-1: NULL buffer)
    rates DEV              nvmlDeviceGetUtilizationRates
    procs DEV              nvmlDeviceGetComputeRunningProcesses (v3, v2 and v1)
    count                  nvmlDeviceGetCount
    list                   every device by index: uuid, index, minor (or the error code)
    hold KEY IDX|UUID|BUS  keep a handle (by index, GPU-/MIG- UUID or PCI bus id) under KEY
    init / shutdown        nvmlInit / nvmlShutdown ({} or the error code)
    reinit                 nvmlShutdown then nvmlInit: a new session when no other init holds
    ask KEY                uuid, index, minor, name, memory of a held handle (or error codes)
    migs IDX               the MIG devices of device IDX (nvmlDeviceGetMigDeviceHandleByIndex)
    driver                 nvmlSystemGetDriverVersion
    now                    CLOCK_MONOTONIC ns and CLOCK_REALTIME us
    pid                    getpid()
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

import pynvml


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def procs(h: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("v3", "v2", "v1"):
        fn = pynvml._nvmlGetFunctionPointer(
            "nvmlDeviceGetComputeRunningProcesses" + ("" if name == "v1" else "_" + name)
        )
        struct: Any = ProcessInfoV1 if name == "v1" else pynvml.c_nvmlProcessInfo_v2_t
        count = ctypes.c_uint(0)
        rc = fn(h, ctypes.byref(count), None)
        rows: dict[str, int] = {}
        if rc == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            arr = (struct * count.value)()
            rc = fn(h, ctypes.byref(count), arr)
            rows = {str(arr[i].pid): arr[i].usedGpuMemory for i in range(count.value)}
        out[name] = {"rc": rc, "procs": rows}
    return out


def raw_util(h: Any, last_seen: int, room: int) -> dict[str, Any]:
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    count = ctypes.c_uint(max(room, 0))
    arr = (pynvml.c_nvmlProcessUtilizationSample_t * max(room, 1))()
    rc = fn(h, None if room < 0 else arr, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
    samples = []
    if rc == 0:
        samples = [
            {"pid": arr[i].pid, "smUtil": arr[i].smUtil, "timeStamp": arr[i].timeStamp}
            for i in range(count.value)
        ]
    return {"rc": rc, "count": count.value, "samples": samples}


HELD: dict[str, Any] = {}


def attempt(fn: Any, *args: Any) -> Any:
    """fn(*args) as JSON: the value, or {"code": NVML error code}."""
    try:
        v = fn(*args)
    except pynvml.NVMLError as e:
        return {"code": e.value}
    return v.decode() if isinstance(v, bytes) else v


def describe(h: Any) -> dict[str, Any]:
    mem = attempt(pynvml.nvmlDeviceGetMemoryInfo, h)
    return {
        "uuid": attempt(pynvml.nvmlDeviceGetUUID, h),
        "index": attempt(pynvml.nvmlDeviceGetIndex, h),
        "minor": attempt(pynvml.nvmlDeviceGetMinorNumber, h),
        "name": attempt(pynvml.nvmlDeviceGetName, h),
        "memory": mem if isinstance(mem, dict) else {"total": mem.total, "used": mem.used},
    }


def migs(idx: int) -> list[dict[str, Any]]:
    parent = pynvml.nvmlDeviceGetHandleByIndex(idx)
    out = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k)
        except pynvml.NVMLError_NotFound:
            break
        d = describe(m)
        d["gi"] = pynvml.nvmlDeviceGetGpuInstanceId(m)
        d["ci"] = pynvml.nvmlDeviceGetComputeInstanceId(m)
        out.append(d)
    return out


def handle(words: list[str]) -> dict[str, Any]:
    cmd = words[0]
    if cmd == "list":
        n = pynvml.nvmlDeviceGetCount()
        return {
            "count": n,
            "devices": [describe(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)],
        }
    if cmd == "hold":
        key, what = words[1], words[2]
        h = (
            attempt(pynvml.nvmlDeviceGetHandleByIndex, int(what))
            if what.isdigit()
            else attempt(pynvml.nvmlDeviceGetHandleByPciBusId, what)
            if what.startswith("0000")
            else attempt(pynvml.nvmlDeviceGetHandleByUUID, what)
        )
        if isinstance(h, dict):
            return h
        HELD[key] = h
        return {}
    if cmd == "ask":
        return describe(HELD[words[1]])
    if cmd in ("init", "shutdown", "reinit"):
        calls = {"init": [pynvml.nvmlInit], "shutdown": [pynvml.nvmlShutdown],
                 "reinit": [pynvml.nvmlShutdown, pynvml.nvmlInit]}[cmd]
        for call in calls:
            r = attempt(call)
            if isinstance(r, dict):
                return r
        return {}
    if cmd == "migs":
        return {"migs": migs(int(words[1]))}
    h = pynvml.nvmlDeviceGetHandleByIndex(int(words[1])) if len(words) > 1 else None
    if cmd == "util":
        try:
            util = pynvml.nvmlDeviceGetProcessUtilization(h, int(words[2]))
        except pynvml.NVMLError_NotFound:
            return {"error": "NotFound"}
        return {
            "samples": {str(s.pid): {"smUtil": s.smUtil, "timeStamp": s.timeStamp} for s in util}
        }
    if cmd == "raw":
        return raw_util(h, int(words[2]), int(words[3]))
    if cmd == "rates":
        r = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {"gpu": r.gpu, "memory": r.memory}
    if cmd == "procs":
        return procs(h)
    if cmd == "count":
        return {"count": pynvml.nvmlDeviceGetCount()}
    if cmd == "driver":
        return {"driver": pynvml.nvmlSystemGetDriverVersion()}
    if cmd == "now":
        return {"mono_ns": time.monotonic_ns(), "real_us": time.time_ns() // 1000}
    if cmd == "pid":
        return {"pid": os.getpid()}
    return {"error": f"unknown command {cmd}"}


def main() -> None:
    pynvml.nvmlInit()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            reply = handle(words)
        except pynvml.NVMLError as e:
            reply = {"error": str(e), "code": e.value}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
