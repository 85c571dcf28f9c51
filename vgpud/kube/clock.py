"""The time source of the Kubernetes layer, injected so tests control time.

``Clock.now()`` is monotonic seconds (budgets, backoff, lease expiry) and
``Clock.sleep()`` waits on that same time line. ``SYSTEM_CLOCK`` is the real one;
tests pass a fake that advances on demand.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock's time line."""
        ...


class SystemClock:
    """``time.monotonic`` and ``anyio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
