"""Fixtures of the shim tests: build the shim (release + ASan), the fake driver and
the test programs once per session (under a file lock, for xdist), and run the
test programs under the shim against the fake driver."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
PROGS = Path(__file__).resolve().parent / "progs"


def _fakes_dir() -> Path:
    try:
        from tests.fakes.build import build_fakes

        return Path(build_fakes())
    except ImportError:
        subprocess.run(["make", "-s", "-C", str(ROOT / "tests/fakes")], check=True)
        return ROOT / "tests/fakes/build"


@dataclass(frozen=True)
class Built:
    lib: Path
    asan_lib: Path
    fakes: Path
    drv: Path
    drv_direct: Path
    bench: Path
    asan_runtime: str


@pytest.fixture(scope="session")
def built() -> Built:
    (CSRC / "build").mkdir(exist_ok=True)
    with open(CSRC / "build" / ".pytest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "-C", str(CSRC), "all", "asan"], check=True)
        fakes = _fakes_dir()
        subprocess.run(["make", "-s", "-C", str(PROGS), f"FAKES={fakes}"], check=True)
    asan_rt = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # VGPUD_TEST_SHIM=<a libvgpu.so> runs the suite against another build of the shim
    # (an older commit's, to watch a regression test fail before its fix)
    other = os.environ.get("VGPUD_TEST_SHIM")
    return Built(
        lib=Path(other) if other else CSRC / "build/libvgpu.so",
        asan_lib=Path(other) if other else CSRC / "build/asan/libvgpu.so",
        fakes=fakes,
        drv=PROGS / "build/drv",
        drv_direct=PROGS / "build/drv_direct",
        bench=PROGS / "build/bench",
        asan_runtime=asan_rt,
    )


def ask(p: subprocess.Popen[str], op: str) -> dict:
    """Send one op to a program started with :meth:`Shim.spawn`, read its answer."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(op + "\n")
    p.stdin.flush()
    line = p.stdout.readline()
    assert line, f"no answer to {op!r}: {p.stderr.read() if p.stderr else ''}"
    return json.loads(line)


@dataclass
class Shim:
    """Runs test programs under the shim, with one container's config and state."""

    built: Built
    tmp: Path
    asan: bool = True

    @property
    def state_dir(self) -> Path:
        d = self.tmp / "state"
        d.mkdir(exist_ok=True)
        return d

    def config(self, text: str | None = None, **devices: str) -> Path:
        """Write the config file (raw text, or version=1 + state_dir + lines)."""
        path = self.tmp / "config"
        if text is None:
            lines = ["version=1", f"state_dir={self.state_dir}"]
            lines += [f"{k.replace('__', '.')}={v}" for k, v in devices.items()]
            text = "\n".join(lines) + "\n"
        path.write_text(text)
        return path

    def env(self, extra: dict[str, str] | None = None, preload: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPUD_", "FAKECUDA_"))}
        env["LD_LIBRARY_PATH"] = str(self.built.fakes)
        env["VGPUD_CONFIG"] = str(self.tmp / "config")
        env["FAKECUDA_STATE"] = str(self.tmp / "fake.state")
        env["FAKECUDA_CTX_MIB"] = "0"
        if preload:
            if self.asan:
                env["LD_PRELOAD"] = f"{self.built.asan_runtime} {self.built.asan_lib}"
                env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
                env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
            else:
                env["LD_PRELOAD"] = str(self.built.lib)
        env.update(extra or {})
        return env

    def interp(self, script: str, *, prog: str = "viaproc", env: dict[str, str] | None = None,
               timeout: float = 60) -> list[dict]:
        """Run the fake driver's interpreter (tests/fakes/README.md) on ``;``-separated
        ops under the shim; one JSON object per op."""
        p = subprocess.run([str(self.built.fakes / prog), script], env=self.env(env),
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr}"
        return [json.loads(line) for line in p.stdout.splitlines()]

    def spawn(self, *, prog: str = "viaproc", env: dict[str, str] | None = None,
              ) -> subprocess.Popen[str]:
        """The interpreter driven step by step: one op per stdin line, one JSON line back."""
        return subprocess.Popen([str(self.built.fakes / prog)], env=self.env(env),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)

    def cmd(self, *ops: str | int, via: str = "dlsym", dev: int = 0) -> list[str]:
        prog = self.built.drv_direct if via == "direct" else self.built.drv
        return [str(prog), "--via", via, "--dev", str(dev), *map(str, ops)]

    def run(
        self,
        *ops: str | int,
        via: str = "dlsym",
        dev: int = 0,
        env: dict[str, str] | None = None,
        preload: bool = True,
        timeout: float = 60,
    ) -> tuple[list[dict], str]:
        p = subprocess.run(
            self.cmd(*ops, via=via, dev=dev),
            env=self.env(env, preload),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr}"
        return [json.loads(line) for line in p.stdout.splitlines()], p.stderr


@pytest.fixture
def shim(built: Built, tmp_path: Path) -> Iterator[Shim]:
    yield Shim(built, tmp_path)


@dataclass
class Registration:
    """A stand-in for the plugin's registration socket (vgpud/node/registration.py),
    for programs run outside containers: it answers a peer's PID (SO_PEERCRED) plus
    ``offset``, the host PID the fake driver reports for it under
    ``FAKECUDA_HOST_PID_OFFSET`` (a container's PID namespace, simulated). It checks
    nothing; the real server's checks are tested with real containers (tests/node)."""

    path: Path
    offset: int = 0
    requests: list[str] = field(default_factory=list)
    delay: float = 0.0  # seconds before each answer (a plugin slow to answer)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(64)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                pid, _, _ = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                conn.settimeout(2)
                try:
                    self.requests.append(conn.recv(512).decode(errors="replace").strip())
                    time.sleep(self.delay)
                    conn.sendall(f"ok {pid + self.offset}\n".encode())
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def registration(tmp_path: Path) -> Iterator[Registration]:
    r = Registration(tmp_path / "reg.sock")
    yield r
    r.close()
