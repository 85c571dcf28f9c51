"""vgpud.core imports no I/O library, directly or through anything it imports.

One list: the import-linter contract "core is pure" in pyproject.toml (``lint-imports``
checks every static import against it, in CI); this test reads the same list and checks
what importing every core module loads at run time, which catches an import made inside
a function or through a library."""

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import vgpud.core

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "core is pure: no I/O library, no shell package"


def _forbidden() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"]
                   if c["name"] == CONTRACT]
    assert contract["source_modules"] == ["vgpud.core"]
    return list(contract["forbidden_modules"])


def test_the_contract_names_the_io_libraries() -> None:
    forbidden = set(_forbidden())
    assert {"anyio", "aiohttp", "asyncio", "socket", "subprocess", "structlog", "pynvml",
            "vgpud.kube", "vgpud.node", "vgpud.plugin", "vgpud.extender"} <= forbidden


def test_importing_core_loads_no_io_module() -> None:
    modules = sorted(m.name for m in pkgutil.walk_packages(vgpud.core.__path__, "vgpud.core."))
    assert len(modules) >= 10
    code = (f"import sys; import {', '.join(modules)}; "
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split())
    bad = sorted(m for m in loaded for f in _forbidden() if m == f or m.startswith(f + "."))
    assert bad == []
