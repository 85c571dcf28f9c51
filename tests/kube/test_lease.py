"""LeaderElector on a Lease in the stand-in, with a manual clock."""

from __future__ import annotations

import anyio
import pytest

from tests.kube.clocks import ManualClock
from tests.kube.waiting import eventually
from tests.standin import ApiServer
from vgpud.kube.client import KubeClient
from vgpud.kube.lease import LeaderElector

pytestmark = pytest.mark.anyio


def _elector(kube: KubeClient, clock: ManualClock, identity: str, **kw: object) -> LeaderElector:
    return LeaderElector(
        kube,
        name="vgpu-scheduler",
        namespace="kube-system",
        identity=identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


async def _tick(clock: ManualClock, seconds: float, *, sleepers: int = 2) -> None:
    """Advance virtual time by 1 s steps, letting the electors do their I/O in between."""
    for _ in range(round(seconds)):
        clock.advance(1.0)
        await eventually(lambda: clock.sleepers >= sleepers, what="electors to sleep again")


async def test_exactly_one_leader_then_failover(api: ApiServer, kube: KubeClient) -> None:
    clock = ManualClock()
    changes: list[tuple[str, bool]] = []
    a = _elector(
        kube, clock, "a", release_on_exit=False, on_change=lambda v: changes.append(("a", v))
    )
    b = _elector(kube, clock, "b", on_change=lambda v: changes.append(("b", v)))
    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as a_group:
            a_group.start_soon(lambda: a.run())
            await eventually(lambda: a.is_leader, what="a to lead")
            tg.start_soon(lambda: b.run())
            for _ in range(20):  # 40 virtual seconds of renewals: a keeps it, b waits
                await _tick(clock, 2)
                assert a.is_leader and not b.is_leader
            lease = api.get("leases", "vgpu-scheduler", "kube-system")
            assert lease["spec"]["holderIdentity"] == "a"
            a_group.cancel_scope.cancel()  # a "crashes": no more renewals, no release
        assert lease == api.get("leases", "vgpu-scheduler", "kube-system")
        stopped_at = clock.now()
        # b takes over once the record it observed is lease_duration old (b polls
        # every 2 s, so it may notice the last renewal and the expiry up to 2 s late).
        while not b.is_leader:
            await _tick(clock, 1, sleepers=1)
            assert clock.now() - stopped_at <= 15 + 2 + 2, "failover took too long"
        assert clock.now() - stopped_at >= 15 - 2
        lease = api.get("leases", "vgpu-scheduler", "kube-system")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        tg.cancel_scope.cancel()
    assert changes == [("a", True), ("a", False), ("b", True), ("b", False)]


async def test_release_on_exit_hands_over_at_once(api: ApiServer, kube: KubeClient) -> None:
    clock = ManualClock()
    a = _elector(kube, clock, "a")
    b = _elector(kube, clock, "b")
    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as a_group:
            a_group.start_soon(lambda: a.run())
            await a.wait_leading()
            tg.start_soon(lambda: b.run())
            await _tick(clock, 4)
            a_group.cancel_scope.cancel()  # a shuts down cleanly and releases
        lease = api.get("leases", "vgpu-scheduler", "kube-system")
        assert lease["spec"]["holderIdentity"] == ""
        await _tick(clock, 2, sleepers=1)  # b's next poll, far before lease_duration
        with anyio.fail_after(5):
            await b.wait_leading()
        tg.cancel_scope.cancel()
    assert not a.is_leader


async def test_leadership_is_lost_when_renewals_fail(api: ApiServer, kube: KubeClient) -> None:
    clock = ManualClock()
    lost = anyio.Event()
    a = _elector(kube, clock, "a", on_change=lambda leading: None if leading else lost.set())
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: a.run())
        await a.wait_leading()
        api.fail("update", "leases", 500)
        await _tick(clock, 8, sleepers=1)  # < renew_deadline: still leader
        assert a.is_leader
        clock.advance(2)
        with anyio.fail_after(5):
            await lost.wait()
        assert not a.is_leader
        api.clear_faults()  # renewals work again: a campaigns and wins back its own lease
        await _tick(clock, 2, sleepers=1)
        with anyio.fail_after(5):
            await a.wait_leading()
        assert a.transitions == 2
        tg.cancel_scope.cancel()
