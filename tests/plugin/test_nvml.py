"""The NVML backend against the fake libnvidia-ml.so.1 (nvidia-ml-py loads it).

Runs in a child process: NVML is loaded once per process, by its soname, from
``LD_LIBRARY_PATH``. Health: an Xid makes a GPU unhealthy, an application Xid does
not, and the driver's "no recovery action needed" makes it healthy again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, anyio
from vgpud.node.nvml import NvmlGpus
from vgpud.node.devices import HealthEvent

async def main():
    src = NvmlGpus(wait_ms=50)
    found = await src.discover()
    print(json.dumps({"found": [[d.gpu.uuid, d.gpu.index, d.gpu.memory, d.gpu.numa, d.gpu.mig,
                                 d.minor] for d in found]}), flush=True)
    events_file = sys.argv[1]
    send, recv = anyio.create_memory_object_stream[HealthEvent](8)
    async with anyio.create_task_group() as tg:
        tg.start_soon(src.watch_health, send)
        with open(events_file, "a") as f:
            f.write("xid 1 13\nxid 1 79\nhealthy 1\n")
        got = []
        with anyio.fail_after(20):
            async for e in recv:
                got.append([e.uuid, e.healthy])
                if len(got) == 2:
                    break
        print(json.dumps({"events": got}), flush=True)
        print(json.dumps({"used": dict(await src.memory_used())}), flush=True)
        tg.cancel_scope.cancel()
    await src.aclose()

anyio.run(main)
"""


def test_nvml_backend_on_the_fake_nvml(tmp_path: Path) -> None:
    lib = ROOT / "tests" / "fakes" / "build" / "libnvidia-ml.so.1"
    if not lib.exists():
        done = subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "fakes")],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not lib.exists():
            pytest.skip("the fake NVML is not built here")
    events = tmp_path / "events"
    events.write_text("")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "FAKECUDA_DEVICES": "8192,16384",
           "FAKECUDA_EVENTS": str(events), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(events)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = {k: v for line in done.stdout.splitlines() for k, v in json.loads(line).items()}
    u0, u1 = "GPU-fa4ecda0-0000-4000-8000-000000000000", "GPU-fa4ecda0-0000-4000-8000-000000000001"
    assert out["found"] == [[u0, 0, 8192, 0, False, 0], [u1, 1, 16384, 1, False, 1]]
    assert out["events"] == [[u1, False], [u1, True]]
    assert set(out["used"]) == {u0, u1}
