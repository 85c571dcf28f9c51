"""The plugin's per-container figures from its own loops: the arbiter's last round (SM
use as NVML measured it, who is held at the floor) and the watchdog's verdicts, under
the labels of the other container metrics, in bytes and ratios."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vgpud.core.arbitration import Arbiter
from vgpud.core.model import DeviceGrant
from vgpud.node.allocations import AllocationStore, Owner
from vgpud.node.arbiter import Member, Observed, Publisher, run_arbiter
from vgpud.node.devices import NodeDevices
from vgpud.node.fakegpus import parse_fake_devices
from vgpud.node.registration import Registry
from vgpud.node.watchdog import Usage, Watchdog
from vgpud.plugin.metrics import PluginCollector

pytestmark = pytest.mark.anyio
MIB = 1 << 20
GPU, OTHER = "GPU-0", "GPU-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def samples(text: str, name: str) -> dict[tuple[str, str], float]:
    """{(pod, uuid): value} of one family."""
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {(s.labels["pod"], s.labels["uuid"]): s.value for s in fams[name].samples}


async def test_the_last_round_and_the_watchdog_per_container(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path / "state")
    hi = store.configure(["GPU-0::0"], Owner("ns", "hi", "main", "u1"), "version=1\n",
                         (DeviceGrant(GPU, 1000, 50),), priority=2)
    lo = store.configure(["GPU-0::1", "GPU-1::0"], Owner("ns", "lo", "main", "u2"),
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
    reg.register(PluginCollector("n1", devices, store, dict, lambda state, uuids: None,
                                 watchdog=watchdog, arbiter=observed))
    text = generate_latest(reg).decode()

    assert samples(text, "vgpud_container_sm_utilization_ratio") == {
        ("hi", GPU): 0.65, ("lo", GPU): 0.12, ("lo", OTHER): 0.0}
    # hi (priority 2) is busy on GPU-0: lo is held there, not on GPU-1 where no one is busy
    assert samples(text, "vgpud_container_arbitration_held") == {
        ("hi", GPU): 0, ("lo", GPU): 1, ("lo", OTHER): 0}
    fams = {f.name: f for f in text_string_to_metric_families(text)}
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
    a = store.configure(["GPU-1::0"], Owner("ns", "late", "main", "u3"), "version=1\n",
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
