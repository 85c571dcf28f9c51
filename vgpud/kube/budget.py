"""A client-side request budget: a token bucket shared by every API call.

HAMi's scheduler kept client-go's default of 5 QPS / burst 10 and stalled under
load (HAMi#745); ours defaults to 500 QPS with a burst of 1000, enough for hundreds
of pods per second (a bind is one write: the Binding, which carries the assignment),
while still keeping a runaway loop from hammering the API server.

``acquire()`` reserves a token and sleeps until it is due (reservations are first
come, first served, so waiting callers are not starved); a cancelled wait gives its
token back. Time comes from an injected ``Clock``.
"""

from __future__ import annotations

import math

from vgpud.kube.clock import SYSTEM_CLOCK, Clock


class RequestBudget:
    """Token bucket: ``qps`` tokens per second, at most ``burst`` saved up."""

    def __init__(self, qps: float = 500.0, burst: int = 1000, *, clock: Clock = SYSTEM_CLOCK):
        if not qps > 0 or math.isinf(qps):
            raise ValueError(f"qps must be a positive number, got {qps}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock.now()
        self.waited = 0.0  # total seconds callers were delayed, for metrics

    def _refill(self) -> None:
        now = self._clock.now()
        if now > self._stamp:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
            self._stamp = now

    @property
    def available(self) -> float:
        """Tokens available now (negative while callers are queued)."""
        self._refill()
        return self._tokens

    def try_acquire(self) -> bool:
        """Take a token if one is available now, without waiting."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    async def acquire(self) -> None:
        """Take a token, waiting on the clock until it is due."""
        self._refill()
        self._tokens -= 1.0
        if self._tokens >= 0.0:
            return
        delay = -self._tokens / self.qps
        self.waited += delay
        try:
            await self._clock.sleep(delay)
        except BaseException:
            self._tokens += 1.0
            raise
