"""What the host's ``/proc`` says of a process: its cgroup, start time and PID namespace
view. The node components run in the host PID namespace (the plugin's DaemonSet sets
``hostPID: true``), so a PID from ``SO_PEERCRED`` or NVML is a PID here.

Blocking file reads: call through ``anyio.to_thread``. A process that is gone reads as
``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    pid: int  # in the host PID namespace
    start_time: int  # /proc/<pid>/stat field 22 (clock ticks since boot): tells a reused PID
    cgroup: str  # the process's cgroup path (the unified hierarchy's, else the first)
    cgroup_text: str  # the whole /proc/<pid>/cgroup
    nspid: tuple[int, ...]  # NSpid: the PID in each namespace, outermost first


def read(pid: int, proc: Path = PROC) -> ProcessFacts | None:
    base = proc / str(pid)
    try:
        stat = (base / "stat").read_text()
        cgroup_text = (base / "cgroup").read_text()
        status = (base / "status").read_text()
    except OSError:
        return None
    try:
        fields = stat[stat.rindex(")") + 2:].split()
        start = int(fields[19])  # field 22 counts from 1 and starts after the name
    except (ValueError, IndexError):
        return None
    nspid: tuple[int, ...] = ()
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            nspid = tuple(int(x) for x in line.split()[1:] if x.isdigit())
    return ProcessFacts(pid=pid, start_time=start, cgroup=cgroup_path(cgroup_text),
                        cgroup_text=cgroup_text, nspid=nspid)


def cgroup_path(text: str) -> str:
    """The unified hierarchy's path (``0::/…``) if there is one, else the first line's."""
    paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    unified = [p for line, p in zip(text.splitlines(), paths, strict=False)
               if line.startswith("0::")]
    return (unified or paths or [""])[0]


def in_pod(cgroup_text: str, pod_uid: str) -> bool:
    """The cgroup names pod ``pod_uid``'s slice (``pod<uid>`` with the cgroupfs driver,
    ``pod<uid with _>`` with the systemd one), on some hierarchy."""
    if not pod_uid:
        return False
    wanted = {f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}"}
    for part in re.split(r"[/\n:]", cgroup_text):
        stem = part.removesuffix(".slice")
        if stem.rsplit("-", 1)[-1] in wanted or stem in wanted:
            return True
    return False


def mount_roots(pid: int, proc: Path = PROC) -> tuple[str, ...] | None:
    """What each mount of the process's mount namespace shows: ``/proc/<pid>/mountinfo``
    field 4, the directory of its filesystem that is mounted (a bind mount's source, as
    a path within that filesystem). ``None`` if the process is gone."""
    try:
        text = (proc / str(pid) / "mountinfo").read_text()
    except OSError:
        return None
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:  # octal escapes: \040 space, \011 tab, \012 newline, \134 \\
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[3]))
    return tuple(out)


def mounts_dir(roots: tuple[str, ...], directory: Path) -> bool:
    """One of ``roots`` is ``directory`` (matched by its last two names: the root is a
    path within the filesystem the directory lives on, not a host path)."""
    tail = "/" + "/".join(directory.parts[-2:])
    return any(r.rstrip("/").endswith(tail) for r in roots)
