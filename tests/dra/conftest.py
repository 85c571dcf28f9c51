"""What the DRA plugin's tests share: two fake GPUs, a node with a GPU in MIG mode, an
in-memory claim reader, and a :class:`~vgpud.dra.prepare.Preparer` over a temporary node."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from vgpud.core.model import Gpu
from vgpud.dra.prepare import ClaimRef, Preparer
from vgpud.node.allocations import AllocationStore
from vgpud.node.devices import DeviceInfo, NodeDevices
from vgpud.node.fakegpus import FakeGpus
from vgpud.node.shim import ShimFiles
from vgpud.node.vendors import Nvidia

NODE = "gpu-node-1"
UID = "0f4a1c2e-0000-4000-8000-000000000001"
REF = ClaimRef("ns", "c", UID)


class MemoryClaims:
    """:class:`vgpud.dra.prepare.ClaimReader` in memory; counts its reads, keeps the
    device statuses written."""

    def __init__(self, *claims: Mapping[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.fail: Exception | None = None
        self.fail_status: Exception | None = None
        self.statuses: dict[str, list[dict[str, Any]]] = {}

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.claims.get((namespace, name))

    async def apply_status(self, ref: ClaimRef, devices: list[dict[str, Any]]) -> None:
        """What the driver wrote of ``status.devices``, by claim uid (``fail_status``:
        the API refuses it)."""
        if self.fail_status is not None:
            raise self.fail_status
        self.statuses[ref.uid] = devices


def named(obj: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    return obj | {"metadata": {"name": name, "namespace": "ns", "uid": uid}}


@pytest.fixture
async def gpus(tmp_path: Path) -> Nvidia:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": [
        {"uuid": f"GPU-{i}", "index": i, "model": "NVIDIA Fake", "memory": 24576, "numa": 0,
         "links": [], "healthy": True, "mig": False} for i in range(2)]}))
    return Nvidia(FakeGpus(path), name="fake")


async def preparer(tmp_path: Path, gpus: Nvidia, claims: MemoryClaims, *,
                   found: tuple[DeviceInfo, ...] | None = None, mig: str = "none") -> Preparer:
    """A preparer over ``gpus``' devices, or over ``found`` (with ``mig``, the node's MIG
    strategy)."""
    if found is None:
        found = await gpus.source.discover()
    shim = ShimFiles("1.0.0", tmp_path / "shim" / "libvgpu.so.1.0.0", "/usr/lib/libvgpu.so",
                     tmp_path / "shim" / "ld.so.preload")
    p = Preparer(node=NODE, devices=NodeDevices(found, split=10, memory_scaling=1.0,
                                                core_scaling=1.0, mig=mig),
                 store=AllocationStore(tmp_path / "state"), gpus=gpus, claims=claims,
                 cdi_dir=tmp_path / "cdi", checkpoint=tmp_path / "state" / "dra" / "cp.json",
                 shim=shim, arbiter=tmp_path / "state" / "arbiter")
    await p.load()
    return p


A100 = "NVIDIA A100-SXM4-80GB"
MIG_PARENT = "GPU-mig-parent"
# (uuid, profile, MiB, its GPU and compute instances' /dev/nvidia-caps minors); listed out
# of uuid order: the names count a GPU's instances in uuid order
MIG_INSTANCES = (("MIG-c", "2g.20gb", 19968, (30, 31)), ("MIG-a", "1g.10gb", 9856, (12, 13)),
                 ("MIG-b", "1g.10gb", 9856, (21, 22)))


def mig_node() -> tuple[DeviceInfo, ...]:
    """GPU 0 whole (``/dev/nvidia0``), GPU 1 in MIG mode (``/dev/nvidia1``) with three
    instances with their access devices, as NVML discovers them."""
    return (DeviceInfo(Gpu("GPU-0", 0, A100, 81920, split=1), minor=0),
            DeviceInfo(Gpu(MIG_PARENT, 1, A100, 81920, split=1, mig=True), minor=1),
            *(DeviceInfo(Gpu(u, 1, f"{A100} MIG {p}", mib, split=1, profile=p,
                             parent=MIG_PARENT), minor=1, caps=caps)
              for u, p, mib, caps in MIG_INSTANCES))
