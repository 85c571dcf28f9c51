"""Reading what a container can write: in worker threads, bounded in number and in time.

A container owns its state directory, so the node reads what it finds there as hostile
input. Each reader bounds its own read (:func:`vgpud.node.usage_state.read_usage`: no link followed,
no blocking open, a regular file only, a fixed size copied); :class:`TenantReads` is
where such reads run: never on the event loop that serves kubelet, the registration
sockets and ``/metrics`` (one file that stalls a read there stalls all of them), but in
at most ``threads`` worker threads of their own (a bounded :class:`anyio.CapacityLimiter`,
not the shared default one), each call given ``timeout`` seconds.

A call that overstays its timeout raises :class:`NotRead` to its caller, which goes on
without the figures; its thread cannot be stopped, so it is left to finish and counted
as stuck until it does. While ``threads`` reads are stuck every call is refused at once,
so a filesystem that never answers costs a bounded number of threads, not one more per
round or per scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

THREADS = 2
TIMEOUT = 2.0  # seconds; a scrape's usage files are a few MiB copied at most


class NotRead(Exception):
    """A read of container files that was not done; ``str()`` says why."""


class TenantReads:
    """Runs ``fn(until)`` in a worker thread, ``until`` being the ``time.monotonic()`` by
    which it should return (a reader of many files stops there); at most ``threads`` at a
    time, each waited for at most ``timeout`` seconds."""

    def __init__(self, *, threads: int = THREADS, timeout: float = TIMEOUT) -> None:
        self.threads = threads
        self.timeout = timeout
        self._limiter = anyio.CapacityLimiter(threads)
        self._lock = threading.Lock()
        self._stuck = 0  # threads still running a read whose caller gave up on it

    @property
    def stuck(self) -> int:
        return self._stuck

    async def run(self, fn: Callable[[float], T], what: str) -> T:
        """``fn``'s result, or :class:`NotRead` naming ``what`` was not read."""
        if self._stuck >= self.threads:
            raise NotRead(f"{what}: not read, {self._stuck} earlier reads of container files "
                          "are still stuck (a file system that does not answer?)")
        # per call, under the lock: 'started' by the thread, 'gave_up' by the caller
        state = {"started": False, "finished": False, "gave_up": False}

        def call() -> T:
            with self._lock:
                if state["gave_up"]:  # the caller left before the thread got to it
                    raise NotRead(what)
                state["started"] = True
            try:
                return fn(time.monotonic() + self.timeout)
            finally:
                with self._lock:
                    state["finished"] = True
                    if state["gave_up"]:
                        self._stuck -= 1

        try:
            with anyio.fail_after(self.timeout):
                return await anyio.to_thread.run_sync(call, limiter=self._limiter,
                                                      abandon_on_cancel=True)
        except TimeoutError:
            raise NotRead(f"{what}: not read within {self.timeout:g} s") from None
        finally:
            with self._lock:
                if not state["finished"]:
                    state["gave_up"] = True
                    if state["started"]:
                        self._stuck += 1
