"""The one clock of vgpud, injected so tests control time.

``Clock.now()`` is monotonic seconds (budgets, backoff, lease expiry, the arbiter's
rounds), ``Clock.sleep()`` waits on that same time line, and ``Clock.wall()`` is the
calendar time (UTC) that goes into what others read: events, a Lease's ``renewTime``,
placements, certificates, how long a pod has waited. ``SYSTEM_CLOCK`` is the real one;
tests pass a fake that advances on demand (``tests/kube/clocks.py``).

The pure core takes readings, never a clock: a ``now`` argument, or a
``Callable[[], float]`` that the shell passes as a clock's ``now``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> datetime:
        """The calendar time, in UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock's time line."""
        ...


class SystemClock:
    """``time.monotonic``, ``datetime.now(UTC)`` and ``anyio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
