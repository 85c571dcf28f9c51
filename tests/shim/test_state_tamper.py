"""Issue 22, finding 9: the usage state is the container's to write, so nothing in it may
decide a limit. A process of the container that writes the SM rate, the bucket's credit
and the rate reporter's PID there in a loop keeps its 30 % limit; a link, a directory or
a FIFO in the state file's place refuses the GPU instead of giving each process a limit
of its own. Both tests failed before the fix (the SM share rose to what the launcher
could reach; the link was followed and the directory gave a private state)."""

from __future__ import annotations

import mmap
import os
import statistics
import struct
import threading
import time
from pathlib import Path

import pytest

from vgpud.node.usage_state import STATE_FILE

from .conftest import Shim
from .test_sm import Container

GIB = 1 << 30
OOM = 2
# offsets in the header (csrc/include/vgpu_state_abi.h)
SM_TOKENS, SM_RATE, REPORTER = 488, 744, 808


class Forger:
    """Writes a full rate, a huge credit and its own PID as the reporter into device 0's
    header fields of ``state`` every 200 us until stopped."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.stop = threading.Event()
        self.writes = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        deadline = time.monotonic() + 10
        while not self.state.exists() or self.state.stat().st_size < 4096:
            if time.monotonic() > deadline or self.stop.is_set():
                return
            time.sleep(0.005)
        with self.state.open("r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            while not self.stop.is_set():
                struct.pack_into("<q", m, SM_TOKENS, 1 << 60)
                struct.pack_into("<I", m, SM_RATE, 999)
                struct.pack_into("<I", m, REPORTER, os.getpid())
                self.writes += 1
                time.sleep(0.0002)

    def close(self) -> int:
        self.stop.set()
        self.thread.join(timeout=10)
        return self.writes


def test_a_forged_rate_and_bucket_do_not_lift_the_sm_limit(built, tmp_path: Path) -> None:
    gpu = tmp_path / "fake.state"
    free = Container(built, tmp_path, "free", gpu, device__0__core_limit="0")
    unlimited = statistics.mean(free.share(free.start("10us")))
    a = Container(built, tmp_path, "a", gpu, device__0__core_limit="30")
    forger = Forger(a.shim.state_dir / STATE_FILE)
    try:
        share = a.share(a.start("10us"))
    finally:
        writes = forger.close()
    print(f"10us fixed 30 with its state forged {writes} times: "
          f"{[round(s, 1) for s in share]} (unlimited {unlimited:.1f})")
    assert writes > 100  # the forger wrote throughout the run
    assert unlimited > 45  # without a limit the launcher reaches far past 30 %
    assert statistics.mean(share) <= 33.0, share
    assert statistics.mean(share) >= 0.7 * 30, share


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_a_state_file_replaced_by_the_container_refuses_the_gpu(shim: Shim, tmp_path: Path,
                                                               kind: str) -> None:
    state = shim.state_dir / STATE_FILE
    if kind == "symlink":  # a file of its own, the limit counted there alone
        state.symlink_to(tmp_path / "elsewhere")
    elif kind == "directory":
        state.mkdir()
    else:
        os.mkfifo(state)
    shim.config(device__0__memory_limit=str(GIB))
    out, err = shim.run("ctx", "alloc", 1 << 20, env={"FAKECUDA_CTX_MIB": "0"})
    assert [o["rc"] for o in out if o["op"] == "alloc"] == [OOM], out
    assert "usage state" in err and "refused" in err, err
    assert not (tmp_path / "elsewhere").exists()
