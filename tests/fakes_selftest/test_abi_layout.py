"""The fake declares its own CUDA/NVML types (it builds with gcc alone); check every value
and layout it relies on against the official cuda.h and nvml.h when they are installed
(the nvidia-cuda-runtime and nvidia-nvml-dev wheels)."""

from __future__ import annotations

import pathlib
import re
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


def test_proc_table_versions_match_official_typedefs() -> None:
    """Every row of cu_proctable.c names a CUDA version for which the official
    cudaTypedefs.h has a PFN_<name>_v<version>[_ptsz|_ptds] typedef."""
    inc = official_include()
    if inc is None or not (inc / "cudaTypedefs.h").exists():
        pytest.skip("official cudaTypedefs.h not installed (pip install nvidia-cuda-runtime)")
    typedefs = set(
        re.findall(r"\bPFN_(cu\w+?_v\d+(?:_ptsz|_ptds)?)\b", (inc / "cudaTypedefs.h").read_text())
    )
    table = (FAKES_DIR / "src" / "cu_proctable.c").read_text()
    rows = re.findall(r"X\((cu\w+), (\d+), ([01]), (cu\w+)\)", table)
    assert len(rows) > 100
    missing = []
    for base, version, per_thread, sym in rows:
        suffix = ("_ptds" if sym.endswith("_ptds") else "_ptsz") if per_thread == "1" else ""
        if f"{base}_v{version}{suffix}" not in typedefs:
            missing.append(f"{sym}: PFN_{base}_v{version}{suffix}")
    assert not missing, missing
