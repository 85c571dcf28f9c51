"""Process registration: the kernel tells the node who a GPU process is.

Inside its container a process cannot learn its host PID, and NVML names processes by
host PID. So each allocation's read-only directory (``/etc/vgpud`` in the container)
holds a unix socket the node serves; the shim (``csrc/src/register.c``) connects once
per process and says who it believes it is. None of that is believed:

1. the kernel gives the peer's PID in the node's PID namespace (``SO_PEERCRED``; the
   plugin runs with ``hostPID: true``);
2. that PID's cgroup (the host's ``/proc``) must be in the allocation's pod (a restarted
   container comes back in a new cgroup of the same pod, with the same allocation);
3. and the process must be in the allocation's container: its mount namespace has the
   allocation's directory mounted (``/proc/<pid>/mountinfo``). The socket is mounted
   into that container only, but another container of the same pod reaches it through
   ``/proc/<pid>/root`` when the pod shares its process namespace, and a process there
   must not register as this container (a container cannot add a bind mount of a host
   directory to its own namespace);
4. only then is the PID recorded and answered: ``ok <host pid>``. Anything else is
   ``refused <why>``, with the reason logged.

The socket of an allocation is reachable only from the container it is mounted into,
so the allocation is known from the socket, not from anything the process says. What
the process does say is kept for people: the ``VGPUD_*`` variables its shim ignored
(an attempt to lift limits through the environment) become a metric and an event.

A container can open its socket as often as it likes and say anything, so all of that is
bounded: only the names the shim reads are counted under their own name (any other
``VGPUD_*`` name counts as ``other``: a metric label per name a container makes up would
be a series per name, forever); at most :data:`MAX_CONNECTIONS` connections are served
at once per socket (more are answered ``refused busy`` and closed at once), each must
say its line within ``read_timeout`` (else ``refused`` and closed); at most
:data:`MAX_PROCESSES` registered processes are remembered per allocation (the oldest
forgotten: the container's cgroup still names its processes); and events and warnings
about one allocation are paced by a token bucket on the injected clock (a burst, then
one every so often), the rest counted in the next one.

:class:`Registry` is the record (host PID → allocation), read by the watchdog and the
metrics; :class:`Registrar` serves the sockets. Wire format, one line each way::

    vgpud-register 1 pid=<pid> start=<ticks> slot=<n> ignored=<NAME,NAME|->
    ok <host pid>          |  refused <why>
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketStream, TaskGroup, TaskStatus

from vgpud.kube.budget import RequestBudget
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.node import procfs
from vgpud.node.usage_state import MAX_DEVICES

log = structlog.get_logger(__name__)

MAX_LINE = 512
READ_TIMEOUT = 2.0  # the shim says its line at once; its own timeouts are 2 s
SOCKET_NAME = "register.sock"
MAX_CONNECTIONS = 16  # served at once per socket; a shim registers once per process
MAX_PROCESSES = 1024  # registered processes remembered per allocation
REPORT_BURST = 3  # events (and warnings) about one allocation before pacing starts ...
REPORT_EVERY = 600.0  # ... then one per this many seconds

# The VGPUD_* names the shim reads (csrc/src/config.c), the only ones counted by name.
KNOWN_ENV = frozenset({"VGPUD_CONFIG", "VGPUD_MEMORY_LIMIT", "VGPUD_CORE_LIMIT",
                       "VGPUD_CORE_POLICY", "VGPUD_STATE_DIR"}
                      | {f"VGPUD_{what}_LIMIT_{i}" for what in ("MEMORY", "CORE")
                         for i in range(MAX_DEVICES)})
OTHER_ENV = "other"  # the label of every other VGPUD_* name


@dataclass(frozen=True, slots=True)
class Claim:
    """What a process says about itself (informative only): the variables its shim
    ignored, the known names (:data:`KNOWN_ENV`) each once, and how many other
    ``VGPUD_*`` names it gave."""

    pid: int
    start: int
    slot: int
    ignored: tuple[str, ...]
    unknown: int = 0


def parse_claim(line: str) -> Claim | str:
    """The claim in a request line, or why it is malformed."""
    words = line.strip().split()
    if len(words) < 2 or words[0] != "vgpud-register" or words[1] != "1":
        return "not a vgpud-register 1 request"
    kv = dict(w.split("=", 1) for w in words[2:] if "=" in w)
    try:
        pid, start, slot = int(kv.get("pid", "0")), int(kv.get("start", "0")), \
            int(kv.get("slot", "-1"))
    except ValueError:
        return "pid, start and slot must be integers"
    raw = kv.get("ignored", "-")
    names = set() if raw in ("", "-") else {n for n in raw.split(",") if n.startswith("VGPUD_")}
    return Claim(pid, start, slot, tuple(sorted(names & KNOWN_ENV)), len(names - KNOWN_ENV))


@dataclass(frozen=True, slots=True)
class SocketOwner:
    """Whose allocation a socket belongs to (from the plugin's records)."""

    key: str
    namespace: str
    pod: str
    container: str
    uid: str


@dataclass(frozen=True, slots=True)
class Registered:
    key: str  # the allocation
    host_pid: int
    start_time: int
    cgroup: str
    claim: Claim


def judge(owner: SocketOwner | None, facts: procfs.ProcessFacts | None, claim: Claim,
          mounts: tuple[str, ...] | None, directory: Path) -> Registered | str:
    """Accept a peer, or say why not. Pure: the facts come from the kernel and /proc
    (``mounts``: :func:`procfs.mount_roots` of the peer; ``directory``: the allocation's
    directory that holds the socket)."""
    if owner is None:
        return "this allocation has no container yet (PreStartContainer has not run)"
    if facts is None or mounts is None:
        return "the process is gone"
    where = f"pod {owner.namespace}/{owner.pod}"
    if not procfs.in_pod(facts.cgroup_text, owner.uid):
        return f"process {facts.pid} is not in {where}'s cgroup ({facts.cgroup})"
    if not procfs.mounts_dir(mounts, directory):
        return (f"process {facts.pid} is not in container {owner.container!r} of {where} "
                f"(the allocation's directory is not mounted in its namespace)")
    return Registered(owner.key, facts.pid, facts.start_time, facts.cgroup, claim)


@dataclass
class Registry:
    """Registered processes by host PID (at most :data:`MAX_PROCESSES` per allocation, the
    latest), and each allocation's container cgroup."""

    by_pid: dict[int, Registered] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)  # allocation key -> cgroup path
    accepted: int = 0
    refused: int = 0
    # a name of KNOWN_ENV, or OTHER_ENV -> processes that gave it
    ignored_env: dict[str, int] = field(default_factory=dict)
    max_processes: int = MAX_PROCESSES
    # allocation key -> its registered PIDs, oldest first
    _pids: dict[str, dict[int, None]] = field(default_factory=dict, repr=False)

    def add(self, r: Registered) -> None:
        old = self.by_pid.pop(r.host_pid, None)
        if old is not None:
            self._pids.get(old.key, {}).pop(r.host_pid, None)
        self.by_pid[r.host_pid] = r
        pids = self._pids.setdefault(r.key, {})
        pids[r.host_pid] = None
        while len(pids) > self.max_processes:
            oldest = next(iter(pids))
            del pids[oldest], self.by_pid[oldest]
        self.cgroups[r.key] = r.cgroup  # the container's latest incarnation
        self.accepted += 1
        for name in r.claim.ignored + ((OTHER_ENV,) if r.claim.unknown else ()):
            self.ignored_env[name] = self.ignored_env.get(name, 0) + 1

    def allocation_of(self, pid: int, facts: procfs.ProcessFacts | None) -> str | None:
        """The allocation a GPU process belongs to: registered (same start time, so not a
        reused PID), else by its container's cgroup."""
        r = self.by_pid.get(pid)
        if r is not None and facts is not None and r.start_time == facts.start_time:
            return r.key
        if facts is None:
            return None
        for key, cg in self.cgroups.items():
            if cg and cg == facts.cgroup:
                return key
        return None

    def forget(self, key: str) -> None:
        self.cgroups.pop(key, None)
        for pid in self._pids.pop(key, {}):
            del self.by_pid[pid]


def peer_pid(stream: SocketStream) -> int:
    raw = stream.extra(SocketAttribute.raw_socket)
    pid, _uid, _gid = struct.unpack("3i", raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return int(pid)


async def _read_line(stream: SocketStream) -> str:
    buf = b""
    while b"\n" not in buf and len(buf) < MAX_LINE:
        try:
            buf += await stream.receive(MAX_LINE - len(buf))
        except anyio.EndOfStream:
            break
    return buf.split(b"\n", 1)[0].decode("ascii", errors="replace")


Notify = Callable[[SocketOwner, Registered, int], Awaitable[None]]
"""Report a registration's ignored variables: the owner, the registration, and how many
earlier reports about the allocation the pacing held back since the last one."""


class Registrar:
    """Serves one registration socket per allocation, in its own task group.

    ``max_connections`` per socket are served at once, each given ``read_timeout`` seconds
    to say its line; ``on_ignored_env`` and the warnings about an allocation are paced
    by a token bucket of ``report_burst`` reports refilled at one per ``report_every``
    seconds of ``clock``.
    """

    def __init__(self, registry: Registry, *, proc: Path = procfs.PROC,
                 on_ignored_env: Notify | None = None,
                 max_connections: int = MAX_CONNECTIONS, read_timeout: float = READ_TIMEOUT,
                 report_burst: int = REPORT_BURST, report_every: float = REPORT_EVERY,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.registry = registry
        self.proc = proc
        self.on_ignored_env = on_ignored_env
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.clock = clock
        self._report_burst, self._report_every = report_burst, report_every
        self._owners: dict[str, SocketOwner | None] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._dirs: dict[str, Path] = {}  # allocation key -> the directory of its socket
        self._serving: dict[str, int] = {}  # allocation key -> connections being served
        # ("event" or "log", allocation key) -> (its bucket, reports held back since the
        # last one let through): events and warnings are paced apart
        self._paced: dict[tuple[str, str], tuple[RequestBudget, int]] = {}
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep(math.inf)

    def set_owner(self, key: str, owner: SocketOwner | None) -> None:
        self._owners[key] = owner

    async def open(self, key: str, directory: Path, owner: SocketOwner | None) -> None:
        """Serve ``directory/register.sock`` for allocation ``key`` (again after a restart)."""
        self._owners[key] = owner
        self._dirs[key] = directory
        if key in self._scopes or self._tg is None:
            return
        path = directory / SOCKET_NAME
        path.unlink(missing_ok=True)
        listener = await anyio.create_unix_listener(path)
        path.chmod(0o666)  # any user in the container may connect
        scope = anyio.CancelScope()
        self._scopes[key] = scope

        async def serve() -> None:
            with scope:
                async with listener:
                    await listener.serve(lambda s: self._accept(key, s))

        self._tg.start_soon(serve)

    def close(self, key: str) -> None:
        scope = self._scopes.pop(key, None)
        if scope is not None:
            scope.cancel()
        self._owners.pop(key, None)
        self._dirs.pop(key, None)
        self._serving.pop(key, None)
        self._paced.pop(("event", key), None)
        self._paced.pop(("log", key), None)
        self.registry.forget(key)

    def _report(self, kind: str, key: str) -> int | None:
        """Whether a report of ``kind`` about allocation ``key`` may go out now: None if
        not (it is counted), else how many were held back since the last one."""
        bucket, held = self._paced.get((kind, key)) or (RequestBudget(
            1 / self._report_every, self._report_burst, clock=self.clock), 0)
        if bucket.try_acquire():
            self._paced[(kind, key)] = (bucket, 0)
            return held
        self._paced[(kind, key)] = (bucket, held + 1)
        return None

    def _warn(self, event: str, key: str, **kw: object) -> None:
        held = self._report("log", key)
        if held is not None:
            log.warning(event, key=key, **kw, **({"held_back": held} if held else {}))

    async def _accept(self, key: str, stream: SocketStream) -> None:
        serving = self._serving.get(key, 0)
        if serving >= self.max_connections:
            async with stream:
                self.registry.refused += 1
                self._warn("registration_busy", key, connections=serving)
                with anyio.move_on_after(self.read_timeout):
                    try:
                        await stream.send(f"refused busy: {serving} registrations of this "
                                          "container in progress; try again later\n".encode())
                    except (OSError, anyio.BrokenResourceError):
                        pass
            return
        self._serving[key] = serving + 1
        try:
            report = await self._handle(key, stream)
        finally:
            if key in self._serving:
                self._serving[key] -= 1
        if report is not None and self.on_ignored_env is not None:
            held = self._report("event", key)
            if held is not None:
                await self.on_ignored_env(*report, held)

    async def _handle(self, key: str, stream: SocketStream,
                      ) -> tuple[SocketOwner, Registered] | None:
        """Serve one connection; what to report about its ignored variables, if anything."""
        async with stream:
            try:
                pid = peer_pid(stream)
                with anyio.fail_after(self.read_timeout):
                    line = await _read_line(stream)
            except TimeoutError:
                self.registry.refused += 1
                self._warn("registration_timed_out", key, seconds=self.read_timeout)
                await self._send(stream, f"refused no request line within "
                                         f"{self.read_timeout:g} s\n")
                return None
            except (OSError, anyio.BrokenResourceError) as e:
                self._warn("registration_unreadable", key, error=str(e) or type(e).__name__)
                return None
            claim = parse_claim(line)
            owner = self._owners.get(key)
            if isinstance(claim, str):
                verdict: Registered | str = claim
            else:
                facts = await anyio.to_thread.run_sync(procfs.read, pid, self.proc)
                mounts = await anyio.to_thread.run_sync(procfs.mount_roots, pid, self.proc)
                verdict = judge(owner, facts, claim, mounts, self._dirs[key])
            if isinstance(verdict, str):
                self.registry.refused += 1
                self._warn("registration_refused", key, pid=pid, why=verdict)
                await self._send(stream, f"refused {verdict}\n")
                return None
            self.registry.add(verdict)
            log.debug("registered", key=key, host_pid=pid, cgroup=verdict.cgroup,
                      ignored=list(verdict.claim.ignored), unknown=verdict.claim.unknown)
            await self._send(stream, f"ok {pid}\n")
        if (verdict.claim.ignored or verdict.claim.unknown) and owner is not None:
            return owner, verdict
        return None

    async def _send(self, stream: SocketStream, answer: str) -> None:
        with anyio.move_on_after(self.read_timeout):
            try:
                await stream.send(answer.encode())
            except (OSError, anyio.BrokenResourceError):
                pass

    def owners(self) -> Mapping[str, SocketOwner | None]:
        return dict(self._owners)
