"""grpcio stubs for the official kubelet protos, generated once per process.

``protos/generate.py`` runs grpcio-tools' protoc into a temporary directory, which
is put on ``sys.path`` so the generated modules' absolute imports
(``from deviceplugin.v1beta1 import api_pb2``) resolve.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_cache: dict[str, Any] = {}


def load() -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """(deviceplugin pb2, deviceplugin pb2_grpc, podresources pb2, podresources pb2_grpc)."""
    if "mods" not in _cache:
        sys.path.insert(0, str(ROOT / "protos"))
        try:
            generate = importlib.import_module("generate")
        finally:
            sys.path.remove(str(ROOT / "protos"))
        out = Path(tempfile.mkdtemp(prefix="vgpud-grpcio-"))
        atexit.register(shutil.rmtree, out, True)
        generate.generate_grpcio(out)
        sys.path.insert(0, str(out))
        _cache["mods"] = tuple(importlib.import_module(m) for m in (
            "deviceplugin.v1beta1.api_pb2", "deviceplugin.v1beta1.api_pb2_grpc",
            "podresources.v1.api_pb2", "podresources.v1.api_pb2_grpc"))
    mods: tuple[ModuleType, ModuleType, ModuleType, ModuleType] = _cache["mods"]
    return mods
