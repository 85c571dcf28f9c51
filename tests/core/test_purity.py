"""vgpud.core imports no I/O library, directly or through anything it imports."""

import ast
import subprocess
import sys
from pathlib import Path

import vgpud.core

FORBIDDEN = ("anyio", "aiohttp", "grpclib", "grpc", "kubernetes_asyncio", "kubernetes",
             "pynvml", "asyncio", "socket", "structlog", "subprocess", "vgpud.kube",
             "vgpud.extender", "vgpud.plugin", "vgpud.webhook")
CORE = Path(vgpud.core.__file__).parent


def test_core_sources_import_nothing_forbidden() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names
                          if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    assert offenders == []


def test_importing_core_loads_no_io_module() -> None:
    code = ("import sys, vgpud.core.allocate, vgpud.core.codec, vgpud.core.requests, "
            "vgpud.core.container; print('\\n'.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split())
    bad = sorted(m for m in loaded for f in FORBIDDEN if m == f or m.startswith(f + "."))
    assert bad == []
