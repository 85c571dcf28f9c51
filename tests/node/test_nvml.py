"""The NVML backend's NVLink discovery and health paths, on the fake NVML (loaded by
nvidia-ml-py by its soname, so in a child process): NVLink peers from the remote PCI
bus ids, a double-bit ECC error, the quiet timer that makes a GPU healthy again after a
passing probe, and a pending page retirement that keeps it unhealthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fakes.build import build_fakes

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, anyio
from vgpud.node.nvml import NvmlGpus
from vgpud.node.devices import HealthEvent

async def main():
    src = NvmlGpus(wait_ms=20, quiet=0.3, recheck=0.05)
    found = await src.discover()
    print(json.dumps({"links": {d.gpu.uuid: list(d.gpu.links) for d in found},
                      "uuids": [d.gpu.uuid for d in found]}), flush=True)
    send, recv = anyio.create_memory_object_stream[HealthEvent](16)
    got = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(src.watch_health, send)
        # GPU 3 (a page retirement pending) first, so a recovery of it would be sent
        # before GPU 0's in the same probing round
        with open(sys.argv[1], "a") as f:
            f.write("xid 3 48\necc 0\nxid 2 79\n")
        with anyio.fail_after(20):
            async for e in recv:
                got.append([e.uuid, e.healthy, e.reason])
                if sum(1 for u, ok, _ in got if ok) >= 2:
                    break
        tg.cancel_scope.cancel()
    print(json.dumps({"events": got}), flush=True)
    await src.aclose()

anyio.run(main)
"""


def test_nvlink_ecc_quiet_timer_and_pending_retirement(tmp_path: Path) -> None:
    lib = build_fakes() / "libnvidia-ml.so.1"
    events = tmp_path / "events"
    events.write_text("")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "PYTHONPATH": str(ROOT),
           "FAKECUDA_DEVICES": "8192,8192,8192,8192", "FAKECUDA_EVENTS": str(events),
           "FAKECUDA_NVLINK": "0-1,2-3,1-2", "FAKECUDA_RETIRE_PENDING": "3"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(events)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = {k: v for line in done.stdout.splitlines() for k, v in json.loads(line).items()}
    u = out["uuids"]
    assert out["links"] == {u[0]: [u[1]], u[1]: sorted([u[0], u[2]]),
                            u[2]: sorted([u[1], u[3]]), u[3]: [u[2]]}
    ev = out["events"]
    assert ev[:3] == [[u[3], False, "Xid 48"], [u[0], False, "double-bit ECC error"],
                      [u[2], False, "Xid 79 (fell off the bus)"]]
    recovered = [(uuid, why) for uuid, ok, why in ev[3:] if ok]
    assert [x[0] for x in recovered] == [u[0], u[2]], ev
    assert all("no error for" in why and "probe passed" in why for _, why in recovered)
    # GPU 3 was probed in the same round, before GPU 0, and failed: still unhealthy
    assert [uuid for uuid, ok, _ in ev if ok and uuid == u[3]] == []


REINIT = r"""
import json, sys, anyio, pynvml
from vgpud.node.nvml import NvmlGpus
from vgpud.node.devices import HealthEvent

def line(text):
    with open(sys.argv[1], "a") as f:
        f.write(text + "\n")

async def count(src):
    def inside():
        with src.session.shared() as generation:
            return [generation, pynvml.nvmlDeviceGetCount()]
    return await anyio.to_thread.run_sync(inside)

async def main():
    src = NvmlGpus(wait_ms=20)
    out = {"start": [d.gpu.uuid for d in await src.discover()]}
    send, recv = anyio.create_memory_object_stream[HealthEvent](16)
    async with anyio.create_task_group() as tg:
        tg.start_soon(src.watch_health, send)
        line("xid 1 48")  # the watcher is registered in the first session
        with anyio.fail_after(20):
            e = await recv.receive()
        out["first"] = [e.uuid, e.reason]
        line("add 2")
        out["before"] = await count(src)  # the session's list is fixed at nvmlInit
        out["found"] = [d.gpu.uuid for d in await src.discover()]  # a new session
        out["after"] = await count(src)
        line("xid 2 48")  # the new GPU, registered in the new session
        line("xid 0 48")  # an old GPU, registered again
        got = []
        with anyio.fail_after(20):
            while len(got) < 2:
                e = await recv.receive()
                got.append([e.uuid, e.reason])
        out["events"] = got  # the session's end took no old event along
        out["used"] = sorted(await src.memory_used())
        line("lost 0")
        line("remove 0")
        out["gone"] = [d.gpu.uuid for d in await src.discover()]
        tg.cancel_scope.cancel()
    await src.aclose()
    out["closed"] = src.session.generation
    print(json.dumps(out))

anyio.run(main)
"""


def test_rediscovery_starts_a_new_nvml_session_and_health_events_follow(tmp_path: Path) -> None:
    lib = build_fakes()
    events = tmp_path / "events"
    events.write_text("")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "PYTHONPATH": str(ROOT),
           "FAKECUDA_DEVICES": "8192,8192,8192", "FAKECUDA_ABSENT": "2",
           "FAKECUDA_EVENTS": str(events)}
    done = subprocess.run([sys.executable, "-c", REINIT, str(events)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # the result is the one JSON line (the plugin's log lines share stdout)
    (out,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    u = [f"GPU-fa4ecda0-0000-4000-8000-{d:012x}" for d in range(3)]
    assert out["start"] == u[:2]
    assert out["first"] == [u[1], "Xid 48"]
    assert out["before"] == [1, 2]  # the fake NVML fixes its count at init, as NVML does
    assert out["found"] == u and out["after"] == [2, 3]
    assert sorted(out["events"]) == sorted([[u[2], "Xid 48"], [u[0], "Xid 48"]])
    assert out["used"] == u
    assert out["gone"] == u[1:]
    assert out["closed"] == 0
