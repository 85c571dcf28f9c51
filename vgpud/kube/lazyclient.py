"""kubernetes_asyncio's ``client`` package, loaded lazily.

Importing ``kubernetes_asyncio.client`` runs its ``__init__``, which imports every API
class and all ~750 generated models: about 30 MiB of a process that uses a dozen
endpoints and parses responses as plain JSON (``vgpud.kube.client`` asks for the raw
body). :func:`install` puts, before anything imports the package, a stand-in module
for ``kubernetes_asyncio.client`` (and its ``models``) in ``sys.modules``: a package
with the real directory as its path, whose attributes are resolved on first use from
the real ``__init__``'s own ``from <module> import <name>`` lines. So
``from kubernetes_asyncio.client import CoreV1Api`` imports ``api/core_v1_api.py``
and nothing else; every name the real package exports still resolves, to the same
class. If the package was imported already, or its layout is not the one read here,
nothing is changed and the package loads as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

_EXPORT = re.compile(r"^from (kubernetes_asyncio\.client[\w.]*) import (\w+)\s*$", re.M)
CLIENT = "kubernetes_asyncio.client"


def _lazy(name: str, directory: Path) -> types.ModuleType | None:
    try:
        text = (directory / "__init__.py").read_text()
    except OSError:
        return None
    index = {m.group(2): m.group(1) for m in _EXPORT.finditer(text)}
    if not index:
        return None
    mod = types.ModuleType(name, f"{name} (vgpud: loaded on first use)")
    mod.__path__ = [str(directory)]
    mod.__file__ = str(directory / "__init__.py")
    mod.__package__ = name
    mod.__all__ = list(index)  # type: ignore[attr-defined]

    def __getattr__(attr: str) -> Any:
        where = index.get(attr)
        if where is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(where), attr)
        setattr(mod, attr, value)
        return value

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


def install() -> bool:
    """Make ``kubernetes_asyncio.client`` load on demand; False when it could not."""
    if CLIENT in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations))) / "client"
    client = _lazy(CLIENT, root)
    models = _lazy(f"{CLIENT}.models", root / "models")
    if client is None or models is None:
        return False
    client.models = models  # type: ignore[attr-defined]
    sys.modules[CLIENT] = client
    sys.modules[f"{CLIENT}.models"] = models
    # the parent package's __init__ (config, watch, ...: it asks the client for ApiClient)
    # runs now, at a known point: run first by an API module's own imports, it found
    # api_client half-imported and `from kubernetes_asyncio.client import CoreV1Api`,
    # the first thing a process did, failed with ImportError
    importlib.import_module("kubernetes_asyncio")
    return True
