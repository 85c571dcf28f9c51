"""What the DRA plugin's tests share: two fake GPUs, an in-memory claim reader, and a
:class:`~vgpud.dra.prepare.Preparer` over a temporary node."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from vgpud.dra.prepare import ClaimRef, Preparer
from vgpud.node.allocations import AllocationStore
from vgpud.node.devices import NodeDevices
from vgpud.node.fakegpus import FakeGpus
from vgpud.node.shim import ShimFiles
from vgpud.node.vendors import Nvidia

NODE = "gpu-node-1"
UID = "0f4a1c2e-0000-4000-8000-000000000001"
REF = ClaimRef("ns", "c", UID)


class MemoryClaims:
    """:class:`vgpud.dra.prepare.ClaimReader` in memory; counts its reads."""

    def __init__(self, *claims: Mapping[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.fail: Exception | None = None

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.claims.get((namespace, name))


def named(obj: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    return obj | {"metadata": {"name": name, "namespace": "ns", "uid": uid}}


@pytest.fixture
async def gpus(tmp_path: Path) -> Nvidia:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": [
        {"uuid": f"GPU-{i}", "index": i, "model": "NVIDIA Fake", "memory": 24576, "numa": 0,
         "links": [], "healthy": True, "mig": False} for i in range(2)]}))
    return Nvidia(FakeGpus(path), name="fake")


async def preparer(tmp_path: Path, gpus: Nvidia, claims: MemoryClaims) -> Preparer:
    found = await gpus.source.discover()
    shim = ShimFiles("1.0.0", tmp_path / "shim" / "libvgpu.so.1.0.0", "/usr/lib/libvgpu.so",
                     tmp_path / "shim" / "ld.so.preload")
    p = Preparer(node=NODE, devices=NodeDevices(found, split=10, memory_scaling=1.0,
                                                core_scaling=1.0),
                 store=AllocationStore(tmp_path / "state"), gpus=gpus, claims=claims,
                 cdi_dir=tmp_path / "cdi", checkpoint=tmp_path / "state" / "dra" / "cp.json",
                 shim=shim, arbiter=tmp_path / "state" / "arbiter")
    await p.load()
    return p
