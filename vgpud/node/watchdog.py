"""The node's last line of defence: each container's true device memory against its limit.

The shim counts what a container allocates in a file the container can write — it
must, the shim runs inside the container — so the shim alone cannot be the last word.
A workload that zeroes that file, or takes memory by a path the shim does not hook, is
caught here. NVML on the host reports every process's real device memory; each process
is mapped to its allocation (its registration, else its container's cgroup,
:class:`~vgpud.node.registration.Registry`); per container and GPU the sum is compared
with the limit plus a tolerance (the driver rounds allocations to pages the shim does
not see). A container over its limit for longer than the grace period gets an event on
its pod and shows in the metrics, once per incident, and (``overLimitAction: kill``, the
default) its processes on that GPU are killed, largest first, until it is back under its
limit; ``warn`` only reports.

:func:`over_limits` and :meth:`Watchdog.decide` are pure; :meth:`Watchdog.run` does the
I/O (NVML through the GPU source, ``/proc``, events, signals).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import anyio
import structlog

from vgpud.node import procfs
from vgpud.node.registration import Owner, Registry

log = structlog.get_logger(__name__)
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Watched:
    """A container the watchdog looks after: its limits in bytes per GPU uuid."""

    owner: Owner
    limits: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    uuid: str
    pid: int  # host PID, as NVML reports it
    bytes: int


@dataclass(frozen=True, slots=True)
class Usage:
    """One container's true usage of one GPU."""

    key: str
    uuid: str
    used: int
    limit: int
    pids: tuple[tuple[int, int], ...]  # (pid, bytes), largest first

    @property
    def over(self) -> int:
        return self.used - self.limit


def usage(watched: Mapping[str, Watched], procs: Iterable[GpuProcess],
          owner_of: Callable[[int], str | None]) -> list[Usage]:
    """Every watched container's true usage per GPU it holds a limit on."""
    per: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for p in procs:
        key = owner_of(p.pid)
        if key is None or key not in watched or p.uuid not in watched[key].limits:
            continue
        per.setdefault((key, p.uuid), []).append((p.pid, p.bytes))
    out = []
    for (key, uuid), pids in sorted(per.items()):
        ordered = tuple(sorted(pids, key=lambda x: (-x[1], x[0])))
        out.append(Usage(key, uuid, sum(b for _, b in pids), watched[key].limits[uuid], ordered))
    return out


def over_limits(found: Iterable[Usage], tolerance: int) -> list[Usage]:
    """The usages above their limit by more than ``tolerance`` bytes (a limit of 0 is
    no limit)."""
    return [u for u in found if u.limit and u.over > tolerance]


def victims(u: Usage) -> list[int]:
    """The processes to kill to bring ``u`` under its limit: largest first."""
    out, left = [], u.used
    for pid, b in u.pids:
        if left <= u.limit:
            break
        out.append(pid)
        left -= b
    return out


@dataclass(frozen=True, slots=True)
class Report:
    """Tell people: an event on the pod and the metric (once per incident)."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Kill:
    usage: Usage
    pids: tuple[int, ...]


Action = Report | Kill


class GpuProcesses(Protocol):
    async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
        """Per GPU uuid, (host pid, device bytes) of every process NVML lists."""
        ...


@dataclass
class Watchdog:
    registry: Registry
    watched: Callable[[], Mapping[str, Watched]]
    action: Literal["warn", "kill"] = "kill"
    grace: float = 10.0
    tolerance: int = 32 * MIB
    interval: float = 2.0
    proc: Path = procfs.PROC
    since: dict[tuple[str, str], float] = field(default_factory=dict)  # over since
    reported: set[tuple[str, str]] = field(default_factory=set)
    last: list[Usage] = field(default_factory=list)  # every watched usage, last round
    over: list[Usage] = field(default_factory=list)  # over past the grace, last round
    reports: int = 0
    kills: int = 0

    def decide(self, now: float, found: list[Usage]) -> list[Action]:
        """What to do about this round's usages; remembers incidents across rounds."""
        self.last = found
        over = {(u.key, u.uuid): u for u in over_limits(found, self.tolerance)}
        for k in list(self.since):
            if k not in over:  # back under: the incident is over
                del self.since[k]
                self.reported.discard(k)
        actions: list[Action] = []
        self.over = []
        for k, u in over.items():
            first = self.since.setdefault(k, now)
            if now - first < self.grace:
                continue
            self.over.append(u)
            if k not in self.reported:
                self.reported.add(k)
                actions.append(Report(u))
            if self.action == "kill":
                actions.append(Kill(u, tuple(victims(u))))
        return actions

    async def step(self, source: GpuProcesses, now: float,
                   report: Callable[[Usage, Owner], Awaitable[None]]) -> list[Action]:
        procs = [GpuProcess(uuid, pid, b) for uuid, rows in (await source.processes()).items()
                 for pid, b in rows]
        facts = {}
        for pid in {p.pid for p in procs}:
            facts[pid] = await anyio.to_thread.run_sync(procfs.read, pid, self.proc)
        watched = self.watched()
        actions = self.decide(now, usage(
            watched, procs, lambda pid: self.registry.allocation_of(pid, facts.get(pid))))
        for a in actions:
            owner = watched[a.usage.key].owner
            where = f"{owner.namespace}/{owner.pod} container {owner.container!r}"
            if isinstance(a, Report):
                self.reports += 1
                log.warning("over_limit", container=where, gpu=a.usage.uuid,
                            used=a.usage.used, limit=a.usage.limit, action=self.action)
                await report(a.usage, owner)
            else:
                for pid in a.pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.kills += 1
                        log.warning("over_limit_killed", container=where, pid=pid,
                                    gpu=a.usage.uuid)
                    except ProcessLookupError:
                        pass
                    except PermissionError as e:
                        log.error("over_limit_kill_refused", container=where, pid=pid,
                                  error=str(e))
        return actions

    async def run(self, source: GpuProcesses, clock: Callable[[], float],
                  report: Callable[[Usage, Owner], Awaitable[None]]) -> None:
        while True:
            try:
                await self.step(source, clock(), report)
            except Exception as e:  # one bad round must not end the watchdog
                log.error("watchdog_round_failed", error=str(e) or type(e).__name__)
            await anyio.sleep(self.interval)
