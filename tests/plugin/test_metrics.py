"""The plugin's per-container figures from its own loops: the arbiter's last round (SM
use as NVML measured it, who is held at the floor) and the watchdog's verdicts, under
the labels of the other container metrics, in bytes and ratios; and the containers'
usage files read off the event loop, bounded in threads and time, by the scrape and
the arbiter alike."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.node.test_usage_file import valid_file
from vgpud.core.arbitration import Arbiter
from vgpud.core.model import DeviceGrant
from vgpud.node import usage_state
from vgpud.node.allocations import AllocationOwner, AllocationStore
from vgpud.node.arbiter import Member, Observed, Publisher, run_arbiter
from vgpud.node.devices import NodeDevices
from vgpud.node.fakegpus import parse_fake_devices
from vgpud.node.metrics import NodeCollector, metrics_app
from vgpud.node.registration import Registry
from vgpud.node.tenant import TenantReads
from vgpud.node.watchdog import Usage, Watchdog

pytestmark = pytest.mark.anyio
MIB = 1 << 20
GPU, OTHER = "GPU-0", "GPU-1"


def samples(text: str, name: str) -> dict[tuple[str, str], float]:
    """{(pod, uuid): value} of one family."""
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {(s.labels["pod"], s.labels["uuid"]): s.value for s in fams[name].samples}


async def test_the_last_round_and_the_watchdog_per_container(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path / "state")
    hi = store.configure(["GPU-0::0"], AllocationOwner("ns", "hi", "main", "u1"), "version=1\n",
                         (DeviceGrant(GPU, 1000, 50),), priority=2)
    lo = store.configure(["GPU-0::1", "GPU-1::0"], AllocationOwner("ns", "lo", "main", "u2"),
                         "version=1\n", (DeviceGrant(GPU, 2000, 0), DeviceGrant(OTHER, 10, 30)))
    members = [Member(a.key, a.priority, tuple(d.uuid for d in a.devices), a.state)
               for a in (hi, lo)]
    pids = {101: hi.key, 202: lo.key}
    rounds = 0

    async def utilisation() -> Mapping[str, list[tuple[int, int]]]:
        nonlocal rounds
        rounds += 1
        # both busy on GPU-0 (two processes of hi), lo idle on GPU-1
        return {GPU: [(101, 40), (101, 25), (202, 12)], OTHER: []}

    observed = Observed()
    publisher = Publisher(tmp_path / "arbiter", [GPU, OTHER])
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_arbiter(
                Arbiter(floor_permille=50, hold=1.0), publisher, utilisation,
                lambda: members, pids.get, period=0.01, observed=observed))
            while observed.rounds < 2:  # noqa: ASYNC110 - the arbiter task updates it
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    publisher.close()
    assert observed.sm_percent == {(hi.key, GPU): 65, (lo.key, GPU): 12, (lo.key, OTHER): 0}

    watchdog = Watchdog(Registry(), dict)
    watchdog.last = [Usage(lo.key, GPU, 2100 * MIB, 2000 * MIB, ((202, 2100 * MIB),))]
    watchdog.over = list(watchdog.last)
    watchdog.reports = 1
    found, _ = parse_fake_devices(json.dumps({"devices": [
        {"uuid": u, "index": i, "model": "Fake", "memory": 24576} for i, u in
        enumerate((GPU, OTHER))]}), "test")
    devices = NodeDevices(found, split=10, memory_scaling=1.0, core_scaling=1.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector("n1", devices, store, dict, lambda state, uuids: None,
                                 watchdog=watchdog, arbiter=observed))
    text = generate_latest(reg).decode()

    assert samples(text, "vgpud_container_sm_utilization_ratio") == {
        ("hi", GPU): 0.65, ("lo", GPU): 0.12, ("lo", OTHER): 0.0}
    # hi (priority 2) is busy on GPU-0: lo is held there, not on GPU-1 where no one is busy
    assert samples(text, "vgpud_container_arbitration_held") == {
        ("hi", GPU): 0, ("lo", GPU): 1, ("lo", OTHER): 0}
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # the GPU's own utilisation: every process NVML saw there, summed (idle GPU: 0)
    gpu_sm = {s.labels["uuid"]: s.value for s in fams["vgpud_gpu_sm_utilization_ratio"].samples}
    assert gpu_sm == {GPU: 0.77, OTHER: 0.0}
    top = {s.labels["uuid"]: s.value for s in fams["vgpud_gpu_arbitration_top_priority"].samples}
    active = {s.labels["uuid"]: s.value for s in fams["vgpud_gpu_arbitration_active"].samples}
    assert (top, active) == ({GPU: 2, OTHER: 0}, {GPU: 1, OTHER: 0})
    # the watchdog: every watched container has a series, 1 only where it is over
    assert samples(text, "vgpud_container_over_limit") == {
        ("hi", GPU): 0, ("lo", GPU): 1, ("lo", OTHER): 0}
    assert samples(text, "vgpud_container_memory_device_bytes") == {
        ("hi", GPU): 0, ("lo", GPU): 2100 * MIB, ("lo", OTHER): 0}
    # limits in bytes and ratios, like the GPU's allocation
    assert samples(text, "vgpud_container_memory_limit_bytes")[("lo", OTHER)] == 10 * MIB
    assert samples(text, "vgpud_container_cores_limit_ratio") == {
        ("hi", GPU): 0.5, ("lo", GPU): 0.0, ("lo", OTHER): 0.3}
    gpu = {s.labels["uuid"]: s.value for s in fams["vgpud_gpu_cores_allocated_ratio"].samples}
    assert gpu == {GPU: 0.5, OTHER: 0.3}
    reports = {s.labels["action"]: s.value for s in fams["vgpud_watchdog_actions"].samples}
    assert reports == {"report": 1, "kill": 0}


async def test_a_gpu_found_after_start_gets_its_priority_record(tmp_path: Path) -> None:
    """The publisher was made with the GPUs found at start; a container on a GPU added
    since (hot-plug) still gets that GPU's record, so its shim follows priorities."""
    store = AllocationStore(tmp_path / "state")
    a = store.configure(["GPU-1::0"], AllocationOwner("ns", "late", "main", "u3"), "version=1\n",
                        (DeviceGrant(OTHER, 1000, 50),), priority=1)
    members = [Member(a.key, a.priority, (OTHER,), a.state)]
    publisher = Publisher(tmp_path / "arbiter", [GPU])  # OTHER came later
    observed = Observed()

    async def utilisation() -> Mapping[str, list[tuple[int, int]]]:
        return {GPU: [], OTHER: []}

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_arbiter(
                Arbiter(floor_permille=50, hold=1.0), publisher, utilisation,
                lambda: members, {}.get, period=0.01, observed=observed))
            while observed.rounds < 2:  # noqa: ASYNC110 - the arbiter task updates it
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    publisher.close()
    assert sorted(p.name for p in (tmp_path / "arbiter").iterdir()) == sorted([GPU, OTHER])
    assert (tmp_path / "arbiter" / OTHER).stat().st_size > 0


class _WaitingOs:
    """``os`` as :mod:`vgpud.node.usage_state` sees it, but ``open`` ignores ``O_NONBLOCK``: a
    FIFO in place of a usage file then waits for a writer, as every read does on a file system
    that does not answer (O_NONBLOCK, issue 22's defence, does not help there)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def open(path: Any, flags: int, *args: Any) -> int:
        return os.open(path, flags & ~os.O_NONBLOCK, *args)


@contextmanager
def stalled_fifo(monkeypatch: pytest.MonkeyPatch, state: Path) -> Iterator[threading.Event]:
    """A FIFO in place of ``state``'s usage file whose reads wait; setting the event (or
    leaving the block, or 5 s passing, so that a loop it froze comes back) lets them go
    on. On leaving, reads stop waiting and every reader still in the FIFO is let out."""
    fifo = state / usage_state.STATE_FILE
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    release, leaving = threading.Event(), threading.Event()

    def releaser() -> None:
        release.wait(5)
        idle = 0  # polls in a row that found no reader waiting
        while not (leaving.is_set() and idle >= 20):
            try:  # a writer lets every waiting open through
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                idle = 0
            except OSError:  # ENXIO: no reader waits
                idle += 1
            time.sleep(0.01)

    t = threading.Thread(target=releaser, daemon=True)
    with monkeypatch.context() as m:
        m.setattr(usage_state, "os", _WaitingOs())
        t.start()
        try:
            yield release
        finally:
            release.set()
    leaving.set()
    t.join()


class Ticker:
    """Counts the event loop's turns; ``longest`` is the longest it went without one."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(0.005)
            now = time.monotonic()
            self.longest, last = max(self.longest, now - last), now


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def usage_setup(tmp_path: Path) -> tuple[AllocationStore, NodeDevices, dict[str, Any]]:
    """Three containers: one whose usage file is good (a live process charged 300 MiB),
    one with a 1 GiB file in its place, one that will hold a FIFO."""
    store = AllocationStore(tmp_path / "state")
    allocs = {name: store.configure([f"{GPU}::{i}"], AllocationOwner("ns", name, "main", f"u{i}"),
                                    "version=1\n", (DeviceGrant(GPU, 1000, 0),))
              for i, name in enumerate(("good", "huge", "fifo"))}
    for a in allocs.values():
        a.state.mkdir(parents=True, exist_ok=True)
    valid_file(allocs["good"].state / usage_state.STATE_FILE, host_pid=os.getpid(),
               slot_used=300 * MIB)
    with open(allocs["huge"].state / usage_state.STATE_FILE, "wb") as f:
        f.truncate(1 << 30)
    found, _ = parse_fake_devices(json.dumps({"devices": [
        {"uuid": GPU, "index": 0, "model": "Fake", "memory": 24576}]}), "test")
    return store, NodeDevices(found, split=10, memory_scaling=1.0, core_scaling=1.0), allocs


async def test_a_stalled_usage_file_stalls_neither_the_scrape_nor_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO in place of a container's usage file and one scrape froze the plugin's
    event loop (kubelet's calls, registrations, every other scrape with it). The usage
    files are now read in a worker thread given a timeout: the scrape answers within it
    with the figures it has, the loop keeps turning, and while the read stays stuck the
    next scrape starts no new thread; once the file answers, all is read again."""
    store, devices, allocs = usage_setup(tmp_path)
    reads = TenantReads(threads=1, timeout=0.5)
    collector = NodeCollector("n1", devices, store, dict, reads=reads)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    ticker = Ticker()

    async def used(url: str) -> dict[str, float]:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        return {pod: v for (pod, _), v in samples(
            text, "vgpud_container_memory_used_bytes").items()}

    with stalled_fifo(monkeypatch, allocs["fifo"].state) as release:
        async with serving(metrics_app(reg, collector.refresh)) as url, \
                anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            with anyio.fail_after(3):
                t0 = time.monotonic()
                first = await used(url)  # the good file is read before the FIFO
                assert time.monotonic() - t0 < 1.5 and reads.stuck == 1
                assert await used(url) == {}  # refused at once: one read is stuck
                assert reads.stuck == 1
            release.set()
            with anyio.fail_after(3):
                while reads.stuck:  # noqa: ASYNC110 - the stuck thread ends on its own
                    await anyio.sleep(0.01)
                again = await used(url)
            tg.cancel_scope.cancel()
    assert ticker.longest < 0.5, f"the event loop stood still for {ticker.longest:.2f} s"
    assert first == again == {"good": 300 * MIB}  # the 1 GiB file and the FIFO: refused


async def test_a_stalled_usage_file_does_not_stop_arbitration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The arbiter reads the usage files when NVML shows a process it cannot place; a
    read that waited forever stopped every round (no priorities published again). Now a
    round goes on without the files it could not read in time, and the PIDs a good file
    names count again once the stuck read is over."""
    _, _, allocs = usage_setup(tmp_path)
    members = [Member(a.key, a.priority, (GPU,), a.state) for a in allocs.values()]
    observed = Observed()
    publisher = Publisher(tmp_path / "arbiter", [GPU])
    reads = TenantReads(threads=1, timeout=0.2)
    ticker = Ticker()

    async def utilisation() -> Mapping[str, list[tuple[int, int]]]:
        return {GPU: [(os.getpid(), 40)]}  # only the good usage file names this PID

    with stalled_fifo(monkeypatch, allocs["fifo"].state) as release:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            tg.start_soon(lambda: run_arbiter(
                Arbiter(floor_permille=50, hold=1.0), publisher, utilisation,
                lambda: members, lambda pid: None, period=0.01, observed=observed,
                reads=reads))
            with anyio.fail_after(3):
                while observed.rounds < 20:  # noqa: ASYNC110 - the arbiter task updates it
                    await anyio.sleep(0.01)
            assert reads.stuck == 1  # one thread, however many rounds
            release.set()
            good = (allocs["good"].key, GPU)
            with anyio.fail_after(3):
                while reads.stuck or observed.sm_percent.get(good) != 40:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # the arbiter task updates it
            tg.cancel_scope.cancel()
    publisher.close()
    assert ticker.longest < 0.5, f"the event loop stood still for {ticker.longest:.2f} s"
