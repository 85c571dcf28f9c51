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
from vgpud.core.dra import DRIVER
from vgpud.core.model import ContainerGrant, DeviceGrant, Gpu, NodeInventory, Placement
from vgpud.core.slices import devices as slice_devices
from vgpud.core.slices import pool as slice_pool
from vgpud.inspection import ApiSource
from vgpud.kube.cache import Added
from vgpud.kube.errors import Forbidden, NotFound
from vgpud.kube.resources import RESOURCECLAIMS, RESOURCESLICES
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
    """An API server that answers the two lists, in pages of two; it serves no other
    resource (no ``resource.k8s.io``: a cluster without DRA)."""

    def __init__(self) -> None:
        self.objects = {"/api/v1/nodes": NODES, "/api/v1/pods": PODS}

    async def request(self, method: str, path: str, *, query: dict[str, str]) -> Any:
        if path not in self.objects:
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
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


async def test_the_dra_nodes_show_beside_the_device_plugin_ones() -> None:
    # a DRA node's GPU (the driver's slice) and a claim reserved for a pod on it
    inv = NodeInventory((Gpu("GPU-d0", 0, "NVIDIA L4", 16384),), 1.0, 1.0)
    (dra_slice,) = [s.manifest() for s in slice_pool("d1", slice_devices(inv), 1)]
    claim = {"metadata": {"namespace": "ml", "name": "c"}, "status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "d1", "device": "gpu-0",
             "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]}},
        "reservedFor": [{"resource": "pods", "name": "infer", "uid": "uid-infer"}]}}
    lists = Lists()
    lists.objects.update({RESOURCESLICES.collection_path(): [dra_slice],
                          RESOURCECLAIMS.collection_path(): [claim]})
    api = ApiSource(lists, Settings())  # type: ignore[arg-type]
    await api.load()
    view = api.view()
    assert [(g["node"], g["uuid"], g["memoryAllocated"], g["coresAllocated"])
            for g in view.gpus] == [("d1", "GPU-d0", 4 << 30, 30), ("n1", "GPU-n1-0", 4 << 30, 30),
                                    ("n1", "GPU-n1-1", 0, 0)]
    assert [(p["name"], p["node"]) for p in view.pods] == [("infer", "d1"), ("mine", "n1")]
    assert [(g["node"], g["uuid"]) for g in api.view("d1").gpus] == [("d1", "GPU-d0")]


async def test_a_person_who_may_not_list_claims_is_told_and_sees_the_rest() -> None:
    class NoDra(Lists):
        async def request(self, method: str, path: str, *, query: dict[str, str]) -> Any:
            if path.startswith("/apis/resource.k8s.io/"):
                raise Forbidden(403, "Forbidden", 'resourceslices.resource.k8s.io is forbidden')
            return await super().request(method, path, query=query)

    api = ApiSource(NoDra(), Settings())  # type: ignore[arg-type]
    await api.load()
    assert api.warnings[-1] == (
        "cannot list ResourceSlices, so no DRA node is shown: 403 Forbidden: "
        "resourceslices.resource.k8s.io is forbidden")
    assert [g["node"] for g in api.view().gpus] == ["n1", "n1"]
