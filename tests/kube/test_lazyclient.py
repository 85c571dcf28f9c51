"""kubernetes_asyncio's client package loaded on first use (vgpud/kube/lazyclient.py), in
fresh interpreters (what a process imports first matters)."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_an_api_class_imported_first_resolves() -> None:
    """A process whose first use of the client is an API class: the parent package's
    __init__ ran in the middle of that class's own imports, found api_client half-imported,
    and the import failed ("cannot import name 'ApiClient'"); seen as a test-collection
    error when tests/plugin ran before tests/deploy)."""
    out = _run("import vgpud.kube\n"
               "from kubernetes_asyncio.client import CoreV1Api, ApiClient\n"
               "from kubernetes_asyncio.client.api_client import ApiClient as Real\n"
               "print(ApiClient is Real, CoreV1Api.__module__)")
    assert out == "True kubernetes_asyncio.client.api.core_v1_api"


def test_the_generated_models_stay_unloaded() -> None:
    """The point of the lazy package: a client and an API class load none of the ~750
    generated models (about 30 MiB a process)."""
    out = _run("import sys, vgpud.kube.client\n"
               "from kubernetes_asyncio.client import CoreV1Api, CoordinationV1Api\n"
               "print(sum(m.startswith('kubernetes_asyncio.client.models.') "
               "for m in sys.modules))")
    assert int(out) == 0
