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

from vgpud.node import procfs

log = structlog.get_logger(__name__)

MAX_LINE = 512
READ_TIMEOUT = 2.0
SOCKET_NAME = "register.sock"


@dataclass(frozen=True, slots=True)
class Claim:
    """What a process says about itself (informative only)."""

    pid: int
    start: int
    slot: int
    ignored: tuple[str, ...]


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
    ignored = () if raw in ("", "-") else tuple(
        n for n in raw.split(",") if n.startswith("VGPUD_") and len(n) < 64)
    return Claim(pid, start, slot, ignored)


@dataclass(frozen=True, slots=True)
class Owner:
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


def judge(owner: Owner | None, facts: procfs.ProcessFacts | None, claim: Claim,
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
    """Registered processes by host PID, and each allocation's container cgroup."""

    by_pid: dict[int, Registered] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)  # allocation key -> cgroup path
    accepted: int = 0
    refused: int = 0
    ignored_env: dict[str, int] = field(default_factory=dict)  # VGPUD_* name -> times

    def add(self, r: Registered) -> None:
        self.by_pid[r.host_pid] = r
        self.cgroups[r.key] = r.cgroup  # the container's latest incarnation
        self.accepted += 1
        for name in r.claim.ignored:
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
        for pid in [p for p, r in self.by_pid.items() if r.key == key]:
            del self.by_pid[pid]


def peer_pid(stream: SocketStream) -> int:
    raw = stream.extra(SocketAttribute.raw_socket)
    pid, _uid, _gid = struct.unpack("3i", raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return int(pid)


async def _read_line(stream: SocketStream) -> str:
    buf = b""
    with anyio.fail_after(READ_TIMEOUT):
        while b"\n" not in buf and len(buf) < MAX_LINE:
            try:
                buf += await stream.receive(MAX_LINE - len(buf))
            except anyio.EndOfStream:
                break
    return buf.split(b"\n", 1)[0].decode("ascii", errors="replace")


Notify = Callable[[Owner, Registered], Awaitable[None]]


class Registrar:
    """Serves one registration socket per allocation, in its own task group."""

    def __init__(self, registry: Registry, *, proc: Path = procfs.PROC,
                 on_ignored_env: Notify | None = None) -> None:
        self.registry = registry
        self.proc = proc
        self.on_ignored_env = on_ignored_env
        self._owners: dict[str, Owner | None] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._dirs: dict[str, Path] = {}  # allocation key -> the directory of its socket
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep(math.inf)

    def set_owner(self, key: str, owner: Owner | None) -> None:
        self._owners[key] = owner

    async def open(self, key: str, directory: Path, owner: Owner | None) -> None:
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
                    await listener.serve(lambda s: self._handle(key, s))

        self._tg.start_soon(serve)

    def close(self, key: str) -> None:
        scope = self._scopes.pop(key, None)
        if scope is not None:
            scope.cancel()
        self._owners.pop(key, None)
        self._dirs.pop(key, None)
        self.registry.forget(key)

    async def _handle(self, key: str, stream: SocketStream) -> None:
        async with stream:
            try:
                pid = peer_pid(stream)
                line = await _read_line(stream)
            except (OSError, TimeoutError, anyio.BrokenResourceError) as e:
                log.warning("registration_unreadable", key=key, error=str(e) or type(e).__name__)
                return
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
                log.warning("registration_refused", key=key, pid=pid, why=verdict)
                answer = f"refused {verdict}\n"
            else:
                self.registry.add(verdict)
                log.info("registered", key=key, host_pid=pid, cgroup=verdict.cgroup,
                         ignored=list(verdict.claim.ignored))
                answer = f"ok {pid}\n"
            try:
                await stream.send(answer.encode())
            except (OSError, anyio.BrokenResourceError):
                pass
            if (isinstance(verdict, Registered) and verdict.claim.ignored and owner is not None
                    and self.on_ignored_env is not None):
                await self.on_ignored_env(owner, verdict)

    def owners(self) -> Mapping[str, Owner | None]:
        return dict(self._owners)
