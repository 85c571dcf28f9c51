"""Fixtures for the fake driver's own tests: the build, an isolated environment per test
and helpers that run the test programs and parse their JSON lines."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.build import build_fakes

MIB = 1024 * 1024


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

    def start(self, prog: str = "viaproc", *args: str) -> Interactive:
        p = subprocess.Popen(
            [str(self.build / prog), *args],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return Interactive(p)

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

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def fake(fakes: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[Fake]:
    f = Fake(fakes, tmp_path)
    yield f
    f.close()
