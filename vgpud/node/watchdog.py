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

The SM limit is watched the same way. The shim paces a container's launches from inside
it, where a hostile workload can undo it (forge its usage state, launch through a path
the shim does not see, run one persistent kernel). The arbiter's rounds measure every
container's SM use from NVML on the host, its processes named by registration or
cgroup only (never by the container's own file); :meth:`Watchdog.record_sm` keeps each
round, and a container under a ``fixed`` SM limit whose mean over ``sm_window`` seconds
passes its limit by :func:`sm_margin` (20 points, or half the limit if more: an honest
shim overshoots by a few points, a lifted limit by tens) is an incident like memory's:
reported once, and its processes on that GPU killed under ``kill``. ``balance`` may use
idle capacity by design and is not watched.

:func:`over_limits`, :meth:`Watchdog.decide` and :meth:`Watchdog.decide_sm` are pure;
:meth:`Watchdog.run` does the I/O (NVML through the GPU source, ``/proc``, events,
signals).
"""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import anyio
import structlog

from vgpud.kube.clock import Clock
from vgpud.node import procfs
from vgpud.node.registration import Registry, SocketOwner

log = structlog.get_logger(__name__)
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Watched:
    """A container the watchdog looks after: its limits in bytes per GPU uuid."""

    owner: SocketOwner
    limits: Mapping[str, int]
    sm: Mapping[str, int] = field(default_factory=dict)  # fixed SM limits, percent per uuid


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


@dataclass(frozen=True, slots=True)
class SmUsage:
    """One container's SM use of one GPU, its mean over the watchdog's window."""

    key: str
    uuid: str
    percent: float
    limit: int
    pids: tuple[int, ...]  # its processes NVML saw on that GPU in the window

    @property
    def over(self) -> float:
        return self.percent - self.limit


def sm_margin(limit: int) -> float:
    """How far past its SM limit a container's mean may go before it is an incident."""
    return max(20.0, 0.5 * limit)


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


@dataclass(frozen=True, slots=True)
class SmReport:
    usage: SmUsage


@dataclass(frozen=True, slots=True)
class SmKill:
    usage: SmUsage
    pids: tuple[int, ...]


Action = Report | Kill | SmReport | SmKill


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
    sm_window: float = 20.0
    # per (key, uuid): the arbiter's rounds in the window, (time, percent, pids)
    sm_rounds: dict[tuple[str, str], deque[tuple[float, int, tuple[int, ...]]]] = field(
        default_factory=dict)
    sm_since: dict[tuple[str, str], float] = field(default_factory=dict)
    sm_reported: set[tuple[str, str]] = field(default_factory=set)
    sm_over: list[SmUsage] = field(default_factory=list)  # past the grace, last round

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

    def record_sm(self, now: float, percent: Mapping[tuple[str, str], int],
                  pids: Mapping[tuple[str, str], tuple[int, ...]]) -> None:
        """One arbiter round: per (container key, GPU uuid), the SM percent NVML saw its
        processes (named by registration or cgroup) use, and which they were. A pair
        missing from a round used nothing in it."""
        watched = self.watched()
        for key, w in watched.items():
            for uuid in w.sm:
                rounds = self.sm_rounds.setdefault((key, uuid), deque())
                rounds.append((now, percent.get((key, uuid), 0), pids.get((key, uuid), ())))
                while rounds and rounds[0][0] < now - self.sm_window:
                    rounds.popleft()
        for k in [k for k in self.sm_rounds if k[0] not in watched
                  or k[1] not in watched[k[0]].sm]:
            del self.sm_rounds[k]

    def sm_usage(self, now: float) -> list[SmUsage]:
        """Every watched SM limit's mean over a full window (pairs seen for less than
        nine tenths of the window are not judged yet)."""
        watched = self.watched()
        out = []
        for (key, uuid), rounds in sorted(self.sm_rounds.items()):
            w = watched.get(key)
            if w is None or uuid not in w.sm or not rounds:
                continue
            if now - rounds[0][0] < 0.9 * self.sm_window:
                continue
            mean = sum(p for _, p, _ in rounds) / len(rounds)
            pids = tuple(sorted({pid for _, _, ps in rounds for pid in ps}))
            out.append(SmUsage(key, uuid, mean, w.sm[uuid], pids))
        return out

    def decide_sm(self, now: float, found: list[SmUsage]) -> list[Action]:
        """What to do about this round's SM means; remembers incidents across rounds."""
        over = {(u.key, u.uuid): u for u in found if u.over > sm_margin(u.limit)}
        for k in list(self.sm_since):
            if k not in over:
                del self.sm_since[k]
                self.sm_reported.discard(k)
        actions: list[Action] = []
        self.sm_over = []
        for k, u in over.items():
            first = self.sm_since.setdefault(k, now)
            if now - first < self.grace:
                continue
            self.sm_over.append(u)
            if k not in self.sm_reported:
                self.sm_reported.add(k)
                actions.append(SmReport(u))
            if self.action == "kill" and u.pids:
                actions.append(SmKill(u, u.pids))
        return actions

    async def step(self, source: GpuProcesses, now: float,
                   report: Callable[[Usage | SmUsage, SocketOwner], Awaitable[None]]
                  ) -> list[Action]:
        procs = [GpuProcess(uuid, pid, b) for uuid, rows in (await source.processes()).items()
                 for pid, b in rows]
        facts = {}
        for pid in {p.pid for p in procs}:
            facts[pid] = await anyio.to_thread.run_sync(procfs.read, pid, self.proc)
        watched = self.watched()
        actions = self.decide(now, usage(
            watched, procs, lambda pid: self.registry.allocation_of(pid, facts.get(pid))))
        actions += self.decide_sm(now, self.sm_usage(now))
        for a in actions:
            owner = watched[a.usage.key].owner
            where = f"{owner.namespace}/{owner.pod} container {owner.container!r}"
            if isinstance(a, Report):
                self.reports += 1
                log.warning("over_limit", container=where, gpu=a.usage.uuid,
                            used=a.usage.used, limit=a.usage.limit, action=self.action)
                await report(a.usage, owner)
            elif isinstance(a, SmReport):
                self.reports += 1
                log.warning("over_sm_limit", container=where, gpu=a.usage.uuid,
                            percent=round(a.usage.percent, 1), limit=a.usage.limit,
                            window=self.sm_window, action=self.action)
                await report(a.usage, owner)
            else:
                for pid in a.pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.kills += 1
                        log.warning("over_limit_killed", container=where, pid=pid,
                                    gpu=a.usage.uuid,
                                    limit="sm" if isinstance(a, SmKill) else "memory")
                    except ProcessLookupError:
                        pass
                    except PermissionError as e:
                        log.error("over_limit_kill_refused", container=where, pid=pid,
                                  error=str(e))
        return actions

    async def run(self, source: GpuProcesses, clock: Clock,
                  report: Callable[[Usage | SmUsage, SocketOwner], Awaitable[None]]) -> None:
        while True:
            try:
                await self.step(source, clock.now(), report)
            except Exception as e:  # one bad round must not end the watchdog
                log.error("watchdog_round_failed", error=str(e) or type(e).__name__)
            await clock.sleep(self.interval)
