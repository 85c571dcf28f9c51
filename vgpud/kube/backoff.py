"""Capped exponential backoff with jitter, on an injected clock.

``Backoff(initial=0.2, cap=30)`` waits 0.2, 0.4, 0.8 … 30 s (each ±``jitter``
fraction, drawn from an injected ``random``) until ``reset()``. The one backoff of
vgpud: the API writes and informers sleep it, the reschedule controller reads its delays
per pod, the device plugin's kubelet registration sleeps it without jitter.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

from vgpud.kube.clock import SYSTEM_CLOCK, Clock


class Backoff:
    def __init__(
        self,
        initial: float = 0.2,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.2,
        *,
        clock: Clock = SYSTEM_CLOCK,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if initial <= 0 or cap < initial or factor < 1 or not 0 <= jitter < 1:
            raise ValueError("backoff needs 0 < initial <= cap, factor >= 1, 0 <= jitter < 1")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self.clock = clock
        self._random = random
        self.attempt = 0

    def next_delay(self) -> float:
        """The next delay (and count the attempt)."""
        try:
            base = min(self.cap, self.initial * self.factor**self.attempt)
        except OverflowError:  # a long outage: the power left the floats long after the cap
            base = self.cap
        self.attempt += 1
        if self.jitter:
            base *= 1.0 + self.jitter * (2.0 * self._random() - 1.0)
        return min(base, self.cap)

    def reset(self) -> None:
        self.attempt = 0

    async def sleep(self, at_least: float = 0.0) -> float:
        """Sleep the next delay (or ``at_least``, if longer); returns the delay."""
        delay = max(self.next_delay(), at_least)
        await self.clock.sleep(delay)
        return delay
