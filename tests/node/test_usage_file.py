"""Issue 22, finding 14: the node daemon reads each container's usage file
(``usage.v1``, in a directory the container can write) as hostile input. A container
truncating the file in a loop must not kill the reader (it mapped the file: SIGBUS), a
FIFO put in its place must not hang it, and a link to another container's file must
not be followed."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vgpud.node import usage_state


def valid_file(path: Path, used: int = 123 << 20, host_pid: int = 0, slot_used: int = 0) -> None:
    """A version-1 usage file at ``path``; with ``host_pid``, one process slot naming it
    (its process charged ``slot_used`` bytes on the first device)."""
    buf = bytearray(usage_state.FILE_SIZE)
    h = usage_state.HEADER_FIELDS
    for name, value in (("magic", usage_state.MAGIC), ("version", usage_state.VERSION),
                        ("header_size", usage_state.HEADER_SIZE),
                        ("slot_size", usage_state.SLOT_SIZE),
                        ("max_slots", usage_state.MAX_SLOTS),
                        ("max_devices", usage_state.MAX_DEVICES),
                        ("device_count", 1), ("generation", 2)):
        struct.pack_into(h[name][1], buf, h[name][0], value)
    struct.pack_into("<Q", buf, h["used"][0], used)
    if host_pid:
        slot = usage_state.HEADER_SIZE  # slot 0
        struct.pack_into("<i", buf, slot + usage_state.SLOT_FIELDS["pid"][0], 7)
        struct.pack_into("<i", buf, slot + usage_state.SLOT_FIELDS["host_pid"][0], host_pid)
        struct.pack_into("<Q", buf, slot + usage_state.SLOT_FIELDS["used"][0], slot_used)
    path.write_bytes(bytes(buf))


def test_a_valid_file_reads(tmp_path: Path) -> None:
    valid_file(tmp_path / usage_state.STATE_FILE)
    snap = usage_state.read_usage(tmp_path)
    assert (snap.device_count, snap.devices[0].used) == (1, 123 << 20)


def test_truncation_in_a_loop_never_kills_the_reader(tmp_path: Path) -> None:
    """Run in a child: before the fix the reader died of SIGBUS (rc -7)."""
    valid_file(tmp_path / usage_state.STATE_FILE)
    script = textwrap.dedent(f"""
        import os, sys, threading
        from pathlib import Path
        from vgpud.node import usage_state
        path = Path({str(tmp_path)!r}) / usage_state.STATE_FILE
        good = path.read_bytes()
        stop = threading.Event()
        def hostile():
            fd = os.open(path, os.O_RDWR)
            while not stop.is_set():
                os.ftruncate(fd, 0)
                os.pwrite(fd, good, 0)
        t = threading.Thread(target=hostile); t.start()
        ok = refused = 0
        try:
            for _ in range(3000):
                try:
                    usage_state.read_usage(path.parent); ok += 1
                except usage_state.StateFileError:
                    refused += 1
        finally:
            stop.set(); t.join()
        print(ok, refused)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    ok, refused = map(int, p.stdout.split())
    assert ok + refused == 3000 and refused > 0  # truncation was seen, and refused


def test_a_fifo_in_its_place_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / usage_state.STATE_FILE)
    script = (f"from vgpud.node import usage_state\n"
              f"try:\n    usage_state.read_usage({str(tmp_path)!r})\n"
              f"except usage_state.StateFileError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=30)  # before the fix: blocked in open() forever
    assert p.returncode == 0 and "not a regular file" in p.stdout


def test_a_link_to_a_neighbours_file_is_not_followed(tmp_path: Path) -> None:
    neighbour = tmp_path / "other"
    neighbour.mkdir()
    valid_file(neighbour / usage_state.STATE_FILE)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / usage_state.STATE_FILE).symlink_to(neighbour / usage_state.STATE_FILE)
    with pytest.raises(usage_state.StateFileError):
        usage_state.read_usage(mine)


@pytest.mark.parametrize("kind", ["directory", "short"])
def test_anything_else_is_a_state_file_error(tmp_path: Path, kind: str) -> None:
    target = tmp_path / usage_state.STATE_FILE
    if kind == "directory":
        target.mkdir()
    else:
        target.write_bytes(b"\0" * 100)
    with pytest.raises(usage_state.StateFileError):
        usage_state.read_usage(tmp_path)
