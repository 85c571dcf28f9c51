"""Installing the shim library on the host, under versioned names.

The plugin copies ``libvgpu.so.<version>`` into ``<shimHostDir>/lib/`` (never over an
existing file of that name) and writes ``<shimHostDir>/ld.so.preload.<version>``,
which names the library's path *inside* the container. Allocate mounts both
read-only. Because every name carries the version, a new plugin never changes a
file a running container has mounted.

The source library is, in order: ``$VGPUD_SHIM_LIBRARY``, the newest
``libvgpu.so.*`` in ``/usr/local/lib/vgpud`` (the image), then in ``csrc/build`` of a
source checkout. Blocking file I/O: call through ``anyio.to_thread``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vgpud.node.allocations import write_atomic

CONTAINER_LIB_DIR = "/usr/local/vgpud/lib"
IMAGE_LIB_DIR = Path("/usr/local/lib/vgpud")
CHECKOUT_LIB_DIR = Path(__file__).resolve().parents[2] / "csrc" / "build"
_VERSIONED = re.compile(r"^libvgpu\.so\.(\d[\w.+-]*)$")


class ShimError(RuntimeError):
    """The shim library cannot be found or installed."""


@dataclass(frozen=True, slots=True)
class ShimFiles:
    version: str
    host_lib: Path
    container_lib: str
    host_preload: Path


def _version_key(name: str) -> tuple[int | str, ...]:
    m = _VERSIONED.match(name)
    parts = m.group(1).split(".") if m else []
    return tuple(int(p) if p.isdigit() else p for p in parts)


def find_library(env: dict[str, str] | None = None) -> Path | None:
    env = dict(os.environ) if env is None else env
    explicit = env.get("VGPUD_SHIM_LIBRARY")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ShimError(f"VGPUD_SHIM_LIBRARY={explicit} is not a file")
        return p
    for d in (IMAGE_LIB_DIR, CHECKOUT_LIB_DIR):
        if d.is_dir():
            libs = [p for p in d.iterdir() if _VERSIONED.match(p.name) and p.is_file()
                    and not p.is_symlink()]
            if libs:
                return max(libs, key=lambda p: _version_key(p.name))
    return None


def install(source: Path, host_dir: str | Path) -> ShimFiles:
    """Copy ``source`` into ``<host_dir>/lib`` under its versioned name; write the preload."""
    m = _VERSIONED.match(source.name)
    if m is None:
        raise ShimError(f"{source} is not named libvgpu.so.<version>")
    version = m.group(1)
    root = Path(host_dir)
    lib_dir = root / "lib"
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        target = lib_dir / source.name
        if not target.exists():
            fd, tmp = tempfile.mkstemp(prefix=f".{source.name}.", dir=lib_dir)
            os.close(fd)
            shutil.copyfile(source, tmp)
            Path(tmp).chmod(0o755)
            Path(tmp).replace(target)
        container_lib = f"{CONTAINER_LIB_DIR}/{source.name}"
        preload = root / f"ld.so.preload.{version}"
        if not preload.exists() or preload.read_text() != container_lib + "\n":
            write_atomic(preload, container_lib + "\n")
    except OSError as e:
        raise ShimError(f"cannot install the shim into {root}: {e.strerror or e}") from e
    return ShimFiles(version=version, host_lib=target, container_lib=container_lib,
                     host_preload=preload)
