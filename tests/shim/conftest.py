"""Fixtures of the shim tests: build the shim (release + ASan), the fake driver and
the test programs once per session (under a file lock, for xdist), and run the
test programs under the shim against the fake driver."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
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
    return Built(
        lib=CSRC / "build/libvgpu.so",
        asan_lib=CSRC / "build/asan/libvgpu.so",
        fakes=fakes,
        drv=PROGS / "build/drv",
        drv_direct=PROGS / "build/drv_direct",
        bench=PROGS / "build/bench",
        asan_runtime=asan_rt,
    )


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
