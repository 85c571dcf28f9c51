"""The fake declares its own CUDA/NVML types (it builds with gcc alone); check every value
and layout it relies on against the official cuda.h and nvml.h when they are installed
(the nvidia-cuda-runtime and nvidia-nvml-dev wheels)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from tests.fakes.build import FAKES_DIR

LAYOUT = FAKES_DIR / "abi" / "layout.c"


def official_include() -> pathlib.Path | None:
    try:
        import nvidia
    except ImportError:
        return None
    for base in nvidia.__path__:
        inc = pathlib.Path(base) / "cu13" / "include"
        if (inc / "cuda.h").exists() and (inc / "nvml.h").exists():
            return inc
    return None


def layout(tmp: pathlib.Path, *flags: str) -> list[str]:
    exe = tmp / ("official" if flags else "fake")
    gcc = shutil.which("gcc")
    assert gcc, "gcc is required"
    subprocess.run([gcc, "-Wall", "-Werror", *flags, str(LAYOUT), "-o", str(exe)], check=True)
    return subprocess.run(
        [str(exe)], capture_output=True, text=True, check=True
    ).stdout.splitlines()


def test_fake_types_match_official_headers(tmp_path: pathlib.Path) -> None:
    inc = official_include()
    if inc is None:
        pytest.skip(
            "official cuda.h/nvml.h not installed (pip install nvidia-cuda-runtime nvidia-nvml-dev)"
        )
    fake = layout(tmp_path)
    official = layout(tmp_path, "-DOFFICIAL", f"-I{inc}")
    assert len(fake) > 60
    assert fake == official
