"""``vgpud inspect``'s ledger is the scheduler's: the API source lists nodes and pods and
lays them out with the scheduler's own projections and rebuild (vgpud.scheduling), so a
pod the scheduler would not count (another scheduler's grant, an assignment for another
node, a malformed one) holds nothing here either, and is named in a warning."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_pod
from vgpud.config import Settings
from vgpud.core.allocate import Allocator
from vgpud.core.codec import NODE_DEVICES, encode_assignment, encode_node_devices
from vgpud.core.model import ContainerGrant, DeviceGrant, Gpu, NodeInventory, Placement
from vgpud.inspection import ApiSource
from vgpud.kube.cache import Added
from vgpud.scheduling.projections import pod_projection, project_node
from vgpud.scheduling.state import SchedulerState

pytestmark = [pytest.mark.anyio]

INVENTORY = NodeInventory(tuple(Gpu(f"GPU-n1-{i}", i, "A100", 16384) for i in range(2)))


def grant(node: str = "n1") -> str:
    return encode_assignment(Placement(node, (ContainerGrant("main", False, (
        DeviceGrant(f"GPU-{node}-0", 4096, 30),)),)))


def node(name: str, devices: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {NODE_DEVICES: devices}}}


def pod(name: str, assignment: str, *, scheduler: str = "vgpu-scheduler", on: str = "n1",
        phase: str = "Running") -> dict[str, Any]:
    return gpu_pod(name, {"nvidia.com/vgpu-number": "1"}, namespace="ml", uid=True,
                   assignment=assignment, scheduler=scheduler, node=on, image=None, phase=phase,
                   typed=False)


NODES = [node("n1", encode_node_devices(INVENTORY)), node("broken", "{not json")]
PODS = [pod("mine", grant()), pod("other", grant(), scheduler="default-scheduler"),
        pod("moved", grant("n2")), pod("garbled", "{"), pod("done", grant(), phase="Succeeded")]


class Lists:
    """An API server that answers the two lists, in pages of two."""

    def __init__(self) -> None:
        self.objects = {"/api/v1/nodes": NODES, "/api/v1/pods": PODS}

    async def request(self, method: str, path: str, *, query: dict[str, str]) -> Any:
        start = int(query.get("continue") or 0)
        items = self.objects[path][start:start + 2]
        more = start + 2 < len(self.objects[path])
        return {"items": items, "metadata": {"continue": str(start + 2) if more else ""}}


async def test_inspect_holds_what_the_scheduler_holds() -> None:
    api = ApiSource(Lists(), Settings())  # type: ignore[arg-type]
    await api.load()
    assert [e.uid for e in api.alloc.ledger.entries()] == ["uid-mine"]
    assert api.alloc.cluster.has_node("n1") and not api.alloc.cluster.has_node("broken")
    assert len(api.warnings) == 4
    assert api.warnings[0].startswith("node broken: ")
    assert any(w.startswith("pod ml/other: not a grant of this scheduler") for w in api.warnings)
    assert "pod ml/moved: bound to n1 but assigned GPUs of n2: it holds none" in api.warnings
    assert any(w.startswith("pod ml/garbled: ") for w in api.warnings)

    # the scheduler's state, fed the same objects as informer events, holds the same
    settings = Settings()
    state = SchedulerState(Allocator(settings.defaults()), warn=lambda *a, **k: None)
    project = pod_projection(settings.schedulerName, state.alloc.defaults)
    for n in NODES:
        state.on_node(Added(n["metadata"]["name"], project_node(n)))
    for p in PODS:
        state.on_pod(Added(f"ml/{p['metadata']['name']}", project(p)))
    assert [(e.uid, e.key, e.placement) for e in state.alloc.ledger.entries()] == [
        (e.uid, e.key, e.placement) for e in api.alloc.ledger.entries()]
