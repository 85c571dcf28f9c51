"""Read-only view of the shim's usage-state file (``<state_dir>/usage.v1``).

The layout mirrors ``csrc/include/vgpu_state_abi.h`` (version 1); the test
``tests/shim/test_layout.py`` compiles a C program that prints the C layout and
compares it with the constants here. The file is copied with ``pread`` (no locks
taken): every field is an aligned 64- or 32-bit word that the shim writes atomically,
and ``generation`` lets the reader retry until it sees a snapshot no writer touched.

The file lives in a directory the container can write, so the node daemon reads it as
hostile input: opened without following a link and without blocking (a FIFO or a
symlink to a neighbour's file put in its place is refused, never waited on), only a
regular file of the full size, and copied rather than mapped (a container truncating a
mapped file would kill the reader with SIGBUS).
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "usage.v1"
MAGIC = 0x3176646170677601
VERSION = 1
MAX_DEVICES = 16
MAX_SLOTS = 512
HEADER_SIZE = 4096
SLOT_SIZE = 512
FILE_SIZE = HEADER_SIZE + MAX_SLOTS * SLOT_SIZE

# (name, offset, struct format) of the header fields the view reads
HEADER_FIELDS: dict[str, tuple[int, str]] = {
    "magic": (0, "<Q"),
    "version": (8, "<I"),
    "header_size": (12, "<I"),
    "slot_size": (16, "<I"),
    "max_slots": (20, "<I"),
    "max_devices": (24, "<I"),
    "device_count": (28, "<I"),
    "generation": (32, "<Q"),
    "limit": (40, f"<{MAX_DEVICES}Q"),
    "core_limit": (168, f"<{MAX_DEVICES}I"),
    "used": (232, f"<{MAX_DEVICES}Q"),
    "spilled": (360, f"<{MAX_DEVICES}Q"),
    "sm_tokens": (488, f"<{MAX_DEVICES}q"),
    "sm_refill": (616, f"<{MAX_DEVICES}Q"),
    "sm_rate": (744, f"<{MAX_DEVICES}I"),
    "lock": (816, "64s"),
}
SLOT_FIELDS: dict[str, tuple[int, str]] = {
    "pid": (0, "<i"),
    "host_pid": (4, "<i"),
    "start_time": (8, "<Q"),
    "last_seen": (16, "<Q"),
    "used": (24, f"<{MAX_DEVICES}Q"),
    "context": (152, f"<{MAX_DEVICES}Q"),
    "spilled": (280, f"<{MAX_DEVICES}Q"),
}


class StateFileError(Exception):
    """The file is missing, too short, or not a version-1 usage-state file."""


@dataclass(frozen=True)
class DeviceUsage:
    index: int
    limit: int  # bytes, 0 = unlimited
    used: int  # bytes charged by all processes of the container
    spilled: int  # bytes spilled into managed memory (oversubscription)
    core_limit: int  # percent, 0 = unlimited
    sm_rate_permille: int  # the controller's current rate


@dataclass(frozen=True)
class ProcessSlot:
    slot: int
    pid: int  # in the container's PID namespace
    host_pid: int  # as NVML reports it; 0 = unknown
    start_time: int  # /proc/<pid>/stat starttime (clock ticks since boot)
    last_seen_ns: int  # CLOCK_REALTIME ns of the last update
    used: tuple[int, ...]  # per device, bytes
    context: tuple[int, ...]  # per device, bytes of context memory (part of used)
    spilled: tuple[int, ...]


@dataclass(frozen=True)
class UsageSnapshot:
    generation: int
    device_count: int
    devices: tuple[DeviceUsage, ...]
    processes: tuple[ProcessSlot, ...]

    def used(self, device: int) -> int:
        return self.devices[device].used


def _field(buf: bytes, base: int, spec: tuple[int, str]) -> tuple[int, ...]:
    offset, fmt = spec
    return struct.unpack_from(fmt, buf, base + offset)


def _parse(buf: bytes) -> UsageSnapshot:
    def h(name: str) -> tuple[int, ...]:
        return _field(buf, 0, HEADER_FIELDS[name])

    (magic,) = h("magic")
    (version,) = h("version")
    if magic != MAGIC or version != VERSION:
        raise StateFileError(f"not a version-{VERSION} usage file (magic {magic:#x}, v{version})")
    sizes = (h("header_size")[0], h("slot_size")[0], h("max_slots")[0], h("max_devices")[0])
    if sizes != (HEADER_SIZE, SLOT_SIZE, MAX_SLOTS, MAX_DEVICES):
        raise StateFileError(f"unexpected layout sizes {sizes}")
    count = min(h("device_count")[0], MAX_DEVICES)
    limit, used, spilled = h("limit"), h("used"), h("spilled")
    core, rate = h("core_limit"), h("sm_rate")
    devices = tuple(
        DeviceUsage(i, limit[i], used[i], spilled[i], core[i], rate[i]) for i in range(count)
    )
    procs = []
    for i in range(MAX_SLOTS):
        base = HEADER_SIZE + i * SLOT_SIZE
        (pid,) = _field(buf, base, SLOT_FIELDS["pid"])
        if pid <= 0:
            continue
        procs.append(
            ProcessSlot(
                slot=i,
                pid=pid,
                host_pid=_field(buf, base, SLOT_FIELDS["host_pid"])[0],
                start_time=_field(buf, base, SLOT_FIELDS["start_time"])[0],
                last_seen_ns=_field(buf, base, SLOT_FIELDS["last_seen"])[0],
                used=_field(buf, base, SLOT_FIELDS["used"])[:count],
                context=_field(buf, base, SLOT_FIELDS["context"])[:count],
                spilled=_field(buf, base, SLOT_FIELDS["spilled"])[:count],
            )
        )
    return UsageSnapshot(h("generation")[0], count, devices, tuple(procs))


def read_usage(path: str | os.PathLike[str], attempts: int = 20) -> UsageSnapshot:
    """Snapshot of a usage-state file, or of ``<dir>/usage.v1`` when given a directory.

    Retries (up to ``attempts`` times) while the generation counter moves under the
    read; the last read is returned even if writers never paused. Anything but a
    regular file of the layout's size, reached without a symbolic link, is a
    :class:`StateFileError`.
    """
    p = Path(path)
    if p.is_dir():
        p = p / STATE_FILE
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise StateFileError(f"{p}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(f"{p}: not a regular file")
        if st.st_size < FILE_SIZE:
            raise StateFileError(f"{p}: shorter than {FILE_SIZE} bytes")
        buf = _copy(fd, p)
        for _ in range(attempts):  # parsed once: the generation alone tells a torn copy
            again = _copy(fd, p)
            if _generation(again) == _generation(buf):
                return _parse(again)
            buf = again
        return _parse(buf)
    except OSError as e:
        raise StateFileError(f"{p}: {e.strerror}") from e
    finally:
        os.close(fd)


def _generation(buf: bytes) -> int:
    return _field(buf, 0, HEADER_FIELDS["generation"])[0]


def _copy(fd: int, p: Path) -> bytes:
    buf = os.pread(fd, FILE_SIZE, 0)
    if len(buf) < FILE_SIZE:  # truncated while we read
        raise StateFileError(f"{p}: shorter than {FILE_SIZE} bytes")
    return buf
