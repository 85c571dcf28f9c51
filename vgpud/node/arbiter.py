"""The node's arbitration records: who may use each GPU first, published for the shims.

Every ``period`` seconds: NVML's per-process SM utilisation since the last look (host
PIDs), each process mapped to its container (the registration's trusted PID, else
the container's cgroup, else the host PIDs the container's own usage file lists —
see :mod:`vgpud.core.arbitration` for why that last one is safe), the decision
(:class:`~vgpud.core.arbitration.Arbiter`), and one record per GPU written in place.
The last round's figures stay in an :class:`Observed` for the plugin's metrics. The usage
files are the containers' to write: they are read through
:class:`~vgpud.node.tenant.TenantReads` (worker threads, bounded in number and time), and a
round whose files were not read in time goes on without the PIDs they name.

The record's layout is ``csrc/include/vgpu_arbiter_abi.h`` (version 1, 64 bytes),
mirrored here; ``tests/shim/test_arbiter.py`` checks the two agree by running the
shim against records this module writes. The directory is mounted read-only into
every GPU container; files are created once and rewritten in place under a
sequence lock, never replaced (the shims keep them mapped).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import structlog

from vgpud.core.arbitration import Arbiter, Contender, Record
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.node.tenant import NotRead, TenantReads
from vgpud.node.usage_state import StateFileError, read_usage

log = structlog.get_logger(__name__)

MAGIC = 0x3162726167707601
VERSION = 1
SIZE = 64
_HEAD = struct.Struct("<QII")  # magic, version, size at 0
_SEQ = struct.Struct("<Q")  # at 16
_BODY = struct.Struct("<QIiII")  # published_ns, period_ms, top_priority, active, floor at 24


class RecordFile:
    """One GPU's record, mapped read-write by the plugin."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            os.fchmod(fd, 0o644)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, version, size = _HEAD.unpack_from(self._map, 0)
        if (magic, version, size) != (MAGIC, VERSION, SIZE):
            self._map[:] = bytes(SIZE)
            _HEAD.pack_into(self._map, 0, MAGIC, VERSION, SIZE)
        (self._seq,) = _SEQ.unpack_from(self._map, 16)
        self._seq += self._seq & 1  # a writer that died mid-write left it odd

    def publish(self, r: Record, period_ms: int, now_ns: int) -> None:
        self._seq += 1
        _SEQ.pack_into(self._map, 16, self._seq)  # odd: readers wait
        _BODY.pack_into(self._map, 24, now_ns, period_ms, r.top_priority, int(r.active),
                        r.floor_permille)
        self._seq += 1
        _SEQ.pack_into(self._map, 16, self._seq)

    def read(self) -> tuple[int, int, int, int, int]:
        """(published_ns, period_ms, top_priority, active, floor_permille)."""
        published, period, top, active, floor = _BODY.unpack_from(self._map, 24)
        return published, period, top, active, floor

    def close(self) -> None:
        self._map.close()


@dataclass(frozen=True, slots=True)
class Member:
    """A configured container, as the arbiter sees it."""

    key: str
    priority: int
    uuids: tuple[str, ...]
    state_dir: Path  # its usage file lists its processes' host PIDs


class Publisher:
    """The records of every GPU of the node in one directory."""

    def __init__(self, directory: Path, uuids: Sequence[str]) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        directory.chmod(0o755)
        self.directory = directory
        self.files = {u: RecordFile(directory / u) for u in uuids}

    def publish(self, records: Mapping[str, Record], period_ms: int, now_ns: int) -> None:
        for uuid, r in records.items():
            f = self.files.get(uuid)
            if f is None:  # a GPU found after start (hot-plug): its record from now on
                f = self.files[uuid] = RecordFile(self.directory / uuid)
            f.publish(r, period_ms, now_ns)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


@dataclass
class Observed:
    """The last round's measurements and decisions, kept for the plugin's ``/metrics``.

    ``sm_percent``: per (container key, GPU uuid) of every member, the SM percent NVML
    saw its processes use since the round before, summed (0 when it saw none: what the
    arbiter took as idle). ``records``: what was published per GPU.
    """

    sm_percent: dict[tuple[str, str], int] = field(default_factory=dict)
    records: dict[str, Record] = field(default_factory=dict)
    rounds: int = 0
    # per GPU uuid, the SM percent NVML saw every process use there (a container's or
    # not), summed and capped at 100: the GPU's own utilisation
    gpu_percent: dict[str, int] = field(default_factory=dict)

    def update(self, members: Sequence[Member], samples: Sequence[Contender],
               records: Mapping[str, Record],
               used: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> None:
        sm = {(m.key, u): 0 for m in members for u in m.uuids}
        for c in samples:
            sm[(c.key, c.uuid)] = c.sm_percent
        self.sm_percent, self.records = sm, dict(records)
        if used is not None:
            self.gpu_percent = {u: min(100, sum(pct for _, pct in rows))
                                for u, rows in used.items()}
        self.rounds += 1


def declared_pids(members: Sequence[Member], out: dict[int, str] | None = None,
                  until: float = math.inf) -> dict[int, str]:
    """Host PIDs the containers' usage files name (see the module docstring), into
    ``out`` as it goes (a caller that stops waiting keeps what was read), reading until
    ``until`` (monotonic): blocking file I/O, for a worker thread."""
    out = {} if out is None else out
    for m in members:
        if time.monotonic() >= until:
            break
        try:
            snap = read_usage(m.state_dir)
        except StateFileError:
            continue
        for slot in snap.processes:
            if slot.host_pid > 0:
                out.setdefault(slot.host_pid, m.key)
    return out


async def run_arbiter(
    arbiter: Arbiter,
    publisher: Publisher,
    utilisation: Callable[[], Awaitable[Mapping[str, list[tuple[int, int]]]]],
    members: Callable[[], Sequence[Member]],
    owner_of: Callable[[int], str | None],
    *,
    period: float = 0.2,
    clock: Clock = SYSTEM_CLOCK,
    wall_ns: Callable[[], int] = time.time_ns,
    on_round: Callable[[Mapping[str, Record]], None] | None = None,
    observed: Observed | None = None,
    on_sm: Callable[[float, Mapping[tuple[str, str], int],
                     Mapping[tuple[str, str], tuple[int, ...]]], None] | None = None,
    reads: TenantReads | None = None,
) -> None:
    """Measure, decide, publish, every ``period`` seconds, until cancelled; ``observed``
    (if given) keeps each round's figures for metrics; ``on_sm`` (if given) gets each
    round's SM percent and PIDs per (container, GPU) counting only the processes
    ``owner_of`` names (registration, cgroup): what a container wrote in its own usage
    file may help arbitrate, never decide what is held against it. ``reads`` runs the
    reads of those files (its own, bounded, if not given)."""
    period_ms = max(1, round(period * 1000))
    reads = reads if reads is not None else TenantReads()
    warned = -math.inf  # when unread usage files were last logged (once a minute at most)
    while True:
        try:
            ms = members()
            per_gpu: dict[str, list[tuple[str, int]]] = {}
            for m in ms:
                for u in m.uuids:
                    per_gpu.setdefault(u, []).append((m.key, m.priority))
            prio = {m.key: m.priority for m in ms}
            used = await utilisation()
            unknown = {pid for rows in used.values() for pid, _ in rows if owner_of(pid) is None}
            declared: dict[int, str] = {}
            if unknown:
                try:
                    await reads.run(partial(declared_pids, ms, declared), "usage files")
                except NotRead as e:
                    if clock.now() - warned >= 60:
                        warned = clock.now()
                        log.warning("arbiter_usage_files_not_read", why=str(e))
                declared = dict(declared)  # a copy: a read left behind may still add to it
            samples: list[Contender] = []
            trusted: dict[tuple[str, str], int] = {}
            pids: dict[tuple[str, str], list[int]] = {}
            for uuid, rows in used.items():
                totals: dict[str, int] = {}
                for pid, pct in rows:
                    owner = owner_of(pid)
                    key = owner or declared.get(pid)
                    if key is not None and key in prio:
                        totals[key] = totals.get(key, 0) + pct
                    if owner is not None:
                        trusted[(owner, uuid)] = trusted.get((owner, uuid), 0) + pct
                        pids.setdefault((owner, uuid), []).append(pid)
                samples += [Contender(k, uuid, prio[k], v) for k, v in totals.items()]
            gpus = [*publisher.files, *(u for u in per_gpu if u not in publisher.files)]
            records = arbiter.decide(clock.now(), gpus, per_gpu, samples)
            publisher.publish(records, period_ms, wall_ns())
            if observed is not None:
                observed.update(ms, samples, records, used)
            if on_round is not None:
                on_round(records)
            if on_sm is not None:
                on_sm(clock.now(), trusted, {k: tuple(v) for k, v in pids.items()})
        except Exception as e:  # one bad round must not end arbitration
            log.error("arbiter_round_failed", error=str(e) or type(e).__name__)
        await clock.sleep(period)
