"""Many processes of one container allocating and freeing at random against one
limit, some SIGKILLed mid-way: never above the limit, no hang, and the accounting
returns to zero once they are gone."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time

from vgpud.node.usage_state import read_usage

from .conftest import Shim

LIMIT = 4_000_000


def test_sixteen_processes_random_alloc_free_with_kills(shim: Shim) -> None:
    shim.config(device__0__memory_limit=str(LIMIT))
    rng = random.Random(7)
    procs = [
        subprocess.Popen(
            shim.cmd("ctx", "random", seed, 1500, 400_000, "info"),
            env=shim.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(16)
    ]
    peak = 0
    violations: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                used = read_usage(shim.state_dir).used(0)
            except Exception:  # the first process may not have created the file yet
                continue
            peak = max(peak, used)
            if used > LIMIT:
                violations.append(used)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        victims = rng.sample(procs, 5)
        time.sleep(0.05)
        for p in victims:
            time.sleep(rng.uniform(0.0, 0.05))
            p.send_signal(signal.SIGKILL)
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)  # no process hangs
            results.append((p, out, err))
    finally:
        stop.set()
        watcher.join()
    assert violations == []
    assert peak > LIMIT // 2  # they really competed for the slice
    survivors = [(p, out) for p, out, _ in results if p not in victims]
    assert len(survivors) == 11
    ooms = 0
    for p, out in survivors:
        assert p.returncode == 0, out
        assert '"op":"random"' in out
        summary = next(line for line in out.splitlines() if '"random"' in line)
        assert '"other":0' in summary  # only successes and clean OOMs
        ooms += int(summary.split('"oom":')[1].split(",")[0])
    assert ooms > 0  # the limit was hit and answered with CUDA_ERROR_OUT_OF_MEMORY
    killed = sum(p.returncode == -signal.SIGKILL for p in victims)
    assert killed >= 3, [p.returncode for p in victims]  # really killed mid-way
    # killed processes' usage is reclaimed by the next process that attaches
    out, _ = shim.run("ctx", "info")
    assert out[1]["free"] == LIMIT
    snap = read_usage(shim.state_dir)
    assert snap.used(0) == 0
    assert snap.processes == ()
