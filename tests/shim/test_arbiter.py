"""Priority at run time: the node's arbiter (vgpud/node/arbiter.py, the plugin's code)
reads the fake NVML's per-process utilisation and publishes the GPU's record; two
shimmed containers on one fake GPU follow it.

60 % + 60 % under ``balance``, the high-priority one busy for the first part: it gets
at least its limit, the low one stays at the floor (5 %); once it idles, the low one
uses the GPU. The fake device's busy time per 100 ms window is the measure (the fake
driver's own timeline, not the shim's estimate). Figures print with ``pytest -s``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .conftest import Built
from .test_sm import KERNELS, Container

ROOT = Path(__file__).resolve().parents[2]
HOLD = 0.5  # s a container stays active after its last busy sample
PERIOD = 0.1

ARBITER = r"""
import json, sys, time, anyio
from pathlib import Path
from vgpud.core.arbitration import Arbiter
from vgpud.node.arbiter import Member, Publisher, run_arbiter
from vgpud.node.nvml import NvmlGpus

async def main():
    src = NvmlGpus()
    uuid = (await src.discover())[0].gpu.uuid
    print(json.dumps({"uuid": uuid}), flush=True)
    spec = json.loads(sys.stdin.readline())
    members = [Member(m["key"], m["priority"], (uuid,), Path(m["state"]))
               for m in spec["members"]]
    pub = Publisher(Path(spec["dir"]), [uuid])
    log = open(spec["log"], "w")

    def on_round(records):
        r = records[uuid]
        log.write(json.dumps({"ns": time.monotonic_ns(), "top": r.top_priority if r.active
                              else None, "held": list(r.held)}) + "\n")
        log.flush()

    print(json.dumps({"ready": True}), flush=True)
    await run_arbiter(Arbiter(floor_permille=50, hold=float(spec["hold"])), pub,
                      src.utilisation, lambda: members, lambda pid: None,
                      period=float(spec["period"]), on_round=on_round)

anyio.run(main)
"""


def _windows(c: Container, pid: int, t0: int, t1: int) -> list[float]:
    """Percent of the device ``pid`` held in each 100 ms window of [t0, t1)."""
    env = {"LD_LIBRARY_PATH": str(c.shim.built.fakes),
           "FAKECUDA_STATE": c.env["FAKECUDA_STATE"], "PATH": os.environ.get("PATH", "")}
    got = json.loads(subprocess.run(
        [str(c.shim.built.drv), "--via", "dlsym", "windows", str(pid), str(t0), str(t1)],
        env=env, capture_output=True, text=True, check=True).stdout)
    return [100.0 * b / got["window_ns"] for b in got["busy"]]


def _launch(c: Container, seconds: float) -> subprocess.Popen[str]:
    blocks, ns = KERNELS["10us"]
    return subprocess.Popen(c.shim.cmd("ctx", "launch", blocks, seconds, "kernel", ns,
                                       via="proc"),
                            env=c.shim.env(c.env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _done(p: subprocess.Popen[str]) -> dict[str, int]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return dict(json.loads(out.splitlines()[-1]))


class Node:
    """The arbiter as the plugin runs it (a child process: NVML, through nvidia-ml-py,
    loads the fake library by its soname) and two containers on its one GPU."""

    def __init__(self, built: Built, tmp: Path) -> None:
        gpu = tmp / "fake.state"
        env = {**os.environ, "LD_LIBRARY_PATH": str(built.fakes), "FAKECUDA_STATE": str(gpu),
               "PYTHONPATH": str(ROOT)}
        self.log = tmp / "log"
        self.arb = subprocess.Popen([sys.executable, "-c", ARBITER], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert self.arb.stdout is not None and self.arb.stdin is not None
        uuid = json.loads(self.arb.stdout.readline())["uuid"]
        records = tmp / "arbiter"
        common = {"device__0__uuid": uuid, "device__0__core_limit": "60",
                  "device__0__core_policy": "balance", "arbiter_dir": str(records)}
        self.hi = Container(built, tmp, "hi", gpu, priority="10", **common)
        self.lo = Container(built, tmp, "lo", gpu, priority="0", **common)
        self.arb.stdin.write(json.dumps({
            "dir": str(records), "hold": HOLD, "period": PERIOD, "log": str(self.log),
            "members": [{"key": "hi", "priority": 10, "state": str(self.hi.shim.state_dir)},
                        {"key": "lo", "priority": 0, "state": str(self.lo.shim.state_dir)}],
        }) + "\n")
        self.arb.stdin.flush()
        assert json.loads(self.arb.stdout.readline()) == {"ready": True}

    def rounds(self) -> list[dict[str, object]]:
        return [json.loads(x) for x in self.log.read_text().splitlines()]

    def stop(self) -> None:
        self.arb.kill()
        self.arb.wait(10)


def test_high_priority_first_low_at_its_floor_then_the_gpu_is_the_low_ones(
        built: Built, tmp_path: Path) -> None:
    node = Node(built, tmp_path)
    try:
        hi, lo = node.hi, node.lo
        ph, pl = _launch(hi, 3.0), _launch(lo, 6.0)
        h, low = _done(ph), _done(pl)
    finally:
        node.stop()

    settle = 1_000_000_000  # the first second: calibration and the first records
    both = (max(h["t0"], low["t0"]) + settle, h["t1"])
    after = (h["t1"] + int((HOLD + 0.7) * 1e9), low["t1"])
    hi_busy = _windows(hi, h["pid"], *both)
    lo_held = _windows(lo, low["pid"], *both)
    lo_free = _windows(lo, low["pid"], *after)
    print(f"high 60 % balance, busy: mean {statistics.mean(hi_busy):.1f}, "
          f"min {min(hi_busy):.1f}; low 60 % balance beside it: mean "
          f"{statistics.mean(lo_held):.1f}, max {max(lo_held):.1f}; low alone after: mean "
          f"{statistics.mean(lo_free):.1f}, min {min(lo_free):.1f}")
    rounds = node.rounds()
    assert any(r["top"] == 10 and r["held"] == ["lo"] for r in rounds), rounds[:5]
    assert len(hi_busy) >= 8 and len(lo_free) >= 8
    assert statistics.mean(hi_busy) >= 60 - 3.0, hi_busy
    assert statistics.mean(lo_held) <= 5 + 3.0, lo_held
    assert statistics.mean(lo_free) >= 60 - 3.0, lo_free


def test_a_dead_arbiter_holds_nobody_down(built: Built, tmp_path: Path) -> None:
    """The plugin stops (a restart, a crash) while the high one is busy: the record
    goes stale and the low one is back to its own policy within a second or so."""
    node = Node(built, tmp_path)
    try:
        ph, pl = _launch(node.hi, 5.0), _launch(node.lo, 5.0)
        # the low one is held for a second (ten records) before the arbiter dies
        deadline = time.monotonic() + 20
        while node.log.read_text().count('"held": ["lo"]') < 10:
            assert time.monotonic() < deadline, "the low container was never held"
            time.sleep(0.05)
        died = time.monotonic_ns()
        node.stop()
        _done(ph)
        low = _done(pl)
    finally:
        node.stop()
    before = _windows(node.lo, low["pid"], died - 600_000_000, died)
    after = _windows(node.lo, low["pid"], died + 1_500_000_000, low["t1"])
    print(f"low while held: mean {statistics.mean(before):.1f}; after the arbiter died: "
          f"mean {statistics.mean(after):.1f}, min {min(after):.1f}")
    assert statistics.mean(before) <= 5 + 3.0, before
    # balance 60 beside balance 60, no arbiter: they share the device about evenly
    assert statistics.mean(after) >= 35, after
