"""Issue 22, finding 16 (the part the memory watchdog left): the node sees SM abuse. The
shim's pacing lives inside the container and can be undone there; the arbiter's rounds
measure each container's SM use from NVML on the host, naming processes only by
registration or cgroup, and the watchdog holds a fixed SM limit to it: a mean past the
limit by the margin over its window, past the grace period, is reported once and (under
``kill``) its processes on that GPU are killed. What a container writes in its own usage
file (a neighbour's host PID, say) is never held against anyone."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest

from vgpud.core.arbitration import Arbiter
from vgpud.kube.clock import SYSTEM_CLOCK
from vgpud.node import usage_state
from vgpud.node.arbiter import Member, Publisher, run_arbiter
from vgpud.node.registration import Registry, SocketOwner
from vgpud.node.watchdog import SmKill, SmReport, SmUsage, Watchdog, Watched, sm_margin

from .test_usage_file import valid_file

GIB = 1 << 30
GPU = "GPU-0"
A = SocketOwner("ka", "ns", "a", "main", "uid-a")
B = SocketOwner("kb", "ns", "b", "main", "uid-b")


def test_the_margin_tolerates_an_honest_shim() -> None:
    assert (sm_margin(10), sm_margin(30), sm_margin(60)) == (20.0, 20.0, 30.0)


def test_a_mean_past_the_margin_is_an_incident_after_the_grace() -> None:
    watched = {"ka": Watched(A, {GPU: GIB}, {GPU: 30}),
               "kb": Watched(B, {GPU: GIB}, {})}  # balance, or no SM limit: not watched
    w = Watchdog(Registry(), lambda: watched, action="kill", grace=2.0, sm_window=10.0)
    for t in range(9):  # lifted: 95 % (and kb at 100 %, which it may use)
        w.record_sm(float(t), {("ka", GPU): 95, ("kb", GPU): 100}, {("ka", GPU): (11,)})
    assert w.sm_usage(8.0) == []  # the window is not full yet
    w.record_sm(9.0, {("ka", GPU): 95}, {("ka", GPU): (11, 12)})
    (u,) = w.sm_usage(9.0)
    assert (u.key, u.percent, u.limit, u.pids) == ("ka", 95.0, 30, (11, 12))
    assert w.decide_sm(9.0, [u]) == []  # over, within the grace
    assert w.decide_sm(11.0, [u]) == [SmReport(u), SmKill(u, (11, 12))]
    assert w.decide_sm(12.0, [u]) == [SmKill(u, (11, 12))]  # reported once
    assert w.sm_over == [u]
    assert w.decide_sm(13.0, []) == [] and w.sm_over == []  # back under: over


def test_an_honest_overshoot_is_no_incident() -> None:
    watched = {"ka": Watched(A, {GPU: GIB}, {GPU: 30})}
    w = Watchdog(Registry(), lambda: watched, action="kill", grace=0.0, sm_window=10.0)
    for t in range(30):  # an honest shim: a few points over, some windows far over
        w.record_sm(float(t), {("ka", GPU): 70 if t % 5 == 0 else 35}, {("ka", GPU): (11,)})
    (u,) = w.sm_usage(29.0)
    assert 30 < u.percent < 50
    assert w.decide_sm(29.0, [u]) == []


@pytest.mark.anyio
async def test_the_arbiters_rounds_feed_the_watchdog_which_kills_the_abuser(
        tmp_path: Path) -> None:
    """Two containers share a GPU, each under a fixed 30 % limit. ``a`` runs at 95 % (its
    process ``abuser``, known by registration); ``b``'s usage file names ``bystander`` (a
    process NVML shows at 90 %, that no registration or cgroup gives to ``b``) as its
    own. The watchdog kills the abuser, and nothing of the bystander."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    abuser, bystander = await anyio.open_process(sleeper), await anyio.open_process(sleeper)
    try:
        (tmp_path / "b").mkdir()
        valid_file(tmp_path / "b" / usage_state.STATE_FILE, host_pid=bystander.pid)
        watched = {"ka": Watched(A, {GPU: GIB}, {GPU: 30}),
                   "kb": Watched(B, {GPU: GIB}, {GPU: 30})}
        members = [Member("ka", 0, (GPU,), tmp_path / "a"), Member("kb", 0, (GPU,), tmp_path / "b")]
        owners = {abuser.pid: "ka"}

        async def utilisation() -> Mapping[str, list[tuple[int, int]]]:
            return {GPU: [(abuser.pid, 95), (bystander.pid, 90)]}

        class NoMemory:
            async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
                return {}

        reported: list[tuple[SmUsage, SocketOwner]] = []

        async def report(u: object, owner: SocketOwner) -> None:
            assert isinstance(u, SmUsage)
            reported.append((u, owner))

        w = Watchdog(Registry(), lambda: watched, action="kill", grace=0.2, sm_window=0.5,
                     interval=0.05)
        publisher = Publisher(tmp_path / "arbiter", [GPU])
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_arbiter(
                    Arbiter(floor_permille=50, hold=1.0), publisher, utilisation,
                    lambda: members, owners.get, period=0.02, on_sm=w.record_sm))
                tg.start_soon(w.run, NoMemory(), SYSTEM_CLOCK, report)
                while abuser.returncode is None:  # noqa: ASYNC110 - the watchdog kills it
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
        publisher.close()
        assert abuser.returncode == -9
        assert bystander.returncode is None  # b's own file named it: never held against it
        assert [(u.key, u.limit, u.pids, o.pod) for u, o in reported] == [
            ("ka", 30, (abuser.pid,), "a")]
        assert reported[0][0].percent == pytest.approx(95.0)
        assert w.kills == 1
    finally:
        for p in (abuser, bystander):
            if p.returncode is None:
                p.kill()
            await p.wait()
