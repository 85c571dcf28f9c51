"""Fixtures for the fake driver's own tests: the build, an isolated environment per test
and helpers that run the test programs and parse their JSON lines."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.fakes.build import build_fakes
from tests.fakes.hostpid import HostPidOracle

MIB = 1024 * 1024
PROBE = pathlib.Path(__file__).resolve().parent / "nvml_probe.py"
# a process in a PID namespace of its own (a real container's), killed with its parent
IN_NEW_PID_NS = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


@pytest.fixture(scope="session")
def fakes() -> pathlib.Path:
    return build_fakes()


class Fake:
    """One simulated machine: a state file, knobs, and ways to run programs against it."""

    def __init__(self, build: pathlib.Path, tmp: pathlib.Path) -> None:
        self.build = build
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(build),
            "FAKECUDA_STATE": str(tmp / "state"),
            "FAKECUDA_DEVICES": "8192,4096",
            "FAKECUDA_EVENTS": str(tmp / "events"),
        }
        self.procs: list[subprocess.Popen[str]] = []

    def run(self, prog: str, script: str, *args: str, timeout: float = 30) -> list[dict[str, Any]]:
        out = subprocess.run(
            [str(self.build / prog), *args, script],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    def one(self, prog: str, script: str) -> dict[str, Any]:
        lines = self.run(prog, script)
        assert len(lines) == 1, lines
        return lines[0]

    def start(
        self,
        prog: str = "viaproc",
        *args: str,
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> Interactive:
        """A test program driven op by op; env: extra knobs; wrap: a command prefix
        (IN_NEW_PID_NS, nsenter ...)."""
        p = subprocess.Popen(
            [*wrap, str(self.build / prog), *args],
            env={**self.env, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return Interactive(p)

    def nvml(self, env: dict[str, str] | None = None, wrap: Sequence[str] = ()) -> Interactive:
        """nvml_probe.py driven command by command (see there)."""
        full = {**self.env, **(env or {}), "PYTHONPATH": os.pathsep.join(sys.path)}
        p = subprocess.Popen(
            [*wrap, sys.executable, str(PROBE)],
            env=full,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        probe = Interactive(p)
        assert p.stdout
        assert json.loads(p.stdout.readline()) == {"ready": True}
        return probe

    def python(self, code: str, timeout: float = 60) -> Any:
        """Runs code in a fresh interpreter with this environment; returns its JSON stdout."""
        env = dict(self.env, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdin:
                p.stdin.close()
            if p.stdout:
                p.stdout.close()


class Interactive:
    """A test program fed one op at a time on stdin."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def do(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"program died on {line!r}"
        parsed: dict[str, Any] = json.loads(reply)
        return parsed

    def ok(self, line: str) -> dict[str, Any]:
        reply = self.do(line)
        assert reply["rc"] == 0, reply
        return reply

    def used(self, dev: int = 0) -> int:
        """Physical memory in use on dev, all processes (fake_device_used_bytes)."""
        value: int = self.ok(f"fake_device_used_bytes {dev}")["value"]
        return value

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def fake(fakes: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[Fake]:
    f = Fake(fakes, tmp_path)
    yield f
    f.close()


@pytest.fixture(scope="session")
def pid_namespaces() -> None:
    """Skips unless this machine lets us make PID namespaces (root, util-linux unshare)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    done = subprocess.run([*IN_NEW_PID_NS, "true"], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make PID namespaces here: {done.stderr.decode().strip()}")


@pytest.fixture
def oracle() -> Iterator[HostPidOracle]:
    """The host-PID oracle on a short path (unix socket paths are limited to 107 bytes)."""
    d = tempfile.mkdtemp(prefix="fchp")
    with HostPidOracle(pathlib.Path(d) / "hostpid.sock") as o:
        yield o
    shutil.rmtree(d, ignore_errors=True)


def wait_for_window(window_ns: int, into_ns: int = 5_000_000) -> int:
    """Sleeps until into_ns after the start of the next NVML sampling window (windows are
    aligned to multiples of window_ns of CLOCK_MONOTONIC); returns that window's start."""
    now = time.monotonic_ns()
    start = (now // window_ns + 1) * window_ns
    time.sleep((start + into_ns - now) / 1e9)
    return start


def mono_to_real_us(t_ns: int) -> int:
    """A CLOCK_MONOTONIC time as CLOCK_REALTIME microseconds (NVML timestamps)."""
    return (t_ns + time.time_ns() - time.monotonic_ns()) // 1000


NVML_PRELUDE = """
# pynvml on the fake, for child scripts: val() turns an NVML error into {"code": n}
import ctypes, json, os, pynvml as n
n.nvmlInit()
def val(f, *a):
    try:
        v = f(*a)
    except n.NVMLError as e:
        return {"code": e.value}
    return v.decode() if isinstance(v, bytes) else v
def event(line):
    with open(os.environ["FAKECUDA_EVENTS"], "a") as f:
        f.write(line + "\\n")
def addr(h):
    return ctypes.cast(h, ctypes.c_void_p).value
"""
