"""Fake clocks for the ``vgpud.kube.clock.Clock`` protocol.

- ``ManualClock``: time moves only when the test calls ``advance``; sleepers wake
  when their deadline passes. For leases and other state machines.
- ``JumpClock``: every ``sleep`` returns at once after moving time forward to the
  sleeper's deadline (never backwards). For measuring how long something *would*
  have waited, e.g. the request budget; ``sleeps`` records every request.

Both tell calendar time too (``wall``, UTC): ``wall`` at ``start``, moving with the
monotonic time; ``set_wall`` jumps it (a certificate's expiry, say) without moving ``now``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel

WALL = datetime(2026, 1, 1, tzinfo=UTC)


class _Wall:
    start: float
    _now: float
    _wall: datetime

    def wall(self) -> datetime:
        return self._wall + timedelta(seconds=self._now - self.start)

    def set_wall(self, when: datetime) -> None:
        self._wall = when - timedelta(seconds=self._now - self.start)


class ManualClock(_Wall):
    def __init__(self, start: float = 1000.0, wall: datetime = WALL) -> None:
        self.start = start
        self._now = start
        self._wall = wall
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self._now

    @property
    def sleepers(self) -> int:
        return len(self._sleepers)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        entry = (self._now + seconds, anyio.Event())
        self._sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self._now += seconds
        for deadline, event in list(self._sleepers):
            if deadline <= self._now:
                self._sleepers.remove((deadline, event))
                event.set()


class JumpClock(_Wall):
    def __init__(self, start: float = 1000.0, wall: datetime = WALL) -> None:
        self.start = start
        self._now = start
        self._wall = wall
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._now

    @property
    def elapsed(self) -> float:
        return self._now - self.start

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._now = max(self._now, self._now + seconds)
        await anyio.lowlevel.checkpoint()
