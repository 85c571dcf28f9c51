"""Build the fake CUDA driver and fake NVML once per process (``make -C tests/fakes``).

Tests import ``from tests.fakes.build import build_fakes``; the returned directory holds
``libcuda.so.1``, ``libnvidia-ml.so.1`` and the test programs.  A file lock serialises
concurrent builds (pytest-xdist workers, several test packages).
"""

from __future__ import annotations

import fcntl
import pathlib
import shutil
import subprocess
import threading

FAKES_DIR = pathlib.Path(__file__).resolve().parent
BUILD_DIR = FAKES_DIR / "build"

_lock = threading.Lock()
_built: pathlib.Path | None = None


class FakesBuildError(RuntimeError):
    """make failed; the message carries its output."""


def build_fakes() -> pathlib.Path:
    """Run make (once per process) and return the build directory."""
    global _built
    with _lock:
        if _built is not None:
            return _built
        make = shutil.which("make")
        if make is None:
            raise FakesBuildError("`make` is not installed; the fake driver needs gcc and make")
        BUILD_DIR.mkdir(exist_ok=True)
        with open(BUILD_DIR / ".build.lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            proc = subprocess.run(
                [make, "-s", "-C", str(FAKES_DIR)],
                capture_output=True,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            raise FakesBuildError(
                f"make -C {FAKES_DIR} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        _built = BUILD_DIR
        return _built
