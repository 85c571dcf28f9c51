"""Issue 26, item 5: a node is either the device plugin's or DRA's (the label
``vgpud.io/node-mode=dra``), and the extender never counts GPUs DRA manages: there
kube-scheduler allocates from vgpud's ResourceSlices, and a second ledger over the same
GPUs would hand them out twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests import builders
from vgpud.core.allocate import Allocator
from vgpud.core.codec import NODE_DEVICES, encode_node_devices
from vgpud.core.dra import MODE_DEVICE_PLUGIN, MODE_DRA, NODE_MODE_LABEL
from vgpud.core.model import Gpu, NodeInventory
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.wire import ExtenderArgs
from vgpud.kube.cache import Added, Modified
from vgpud.scheduling.projections import project_node
from vgpud.scheduling.state import SchedulerState

pytestmark = pytest.mark.anyio

INVENTORY = NodeInventory(tuple(Gpu(f"GPU-{i}", i, "A100", 16384) for i in range(2)))


def node(name: str, mode: str | None) -> dict[str, Any]:
    labels = {NODE_MODE_LABEL: mode} if mode else {}
    return {"metadata": {"name": name, "labels": labels,
                         "annotations": {NODE_DEVICES: encode_node_devices(INVENTORY)}}}


def counted(state: SchedulerState) -> list[str]:
    return sorted(n.name for n in state.alloc.cluster.nodes if n is not None)


def test_a_dra_node_is_not_counted_whatever_its_annotation_says() -> None:
    state = SchedulerState(Allocator())
    for name, mode in (("dp", MODE_DEVICE_PLUGIN), ("plain", None), ("dra", MODE_DRA)):
        state.on_node(Added(name, project_node(node(name, mode))))
    assert counted(state) == ["dp", "plain"]
    assert state.dra_nodes == {"dra"}
    assert state.bad_nodes == {}  # not malformed: someone else's


def test_a_node_that_changes_mode_changes_hands() -> None:
    state = SchedulerState(Allocator())
    dp, dra = project_node(node("n", MODE_DEVICE_PLUGIN)), project_node(node("n", MODE_DRA))
    state.on_node(Added("n", dp))
    assert counted(state) == ["n"]
    state.on_node(Modified("n", dp, dra))
    assert counted(state) == [] and state.dra_nodes == {"n"}
    state.on_node(Modified("n", dra, dp))
    assert counted(state) == ["n"] and state.dra_nodes == set()


async def test_filter_says_a_dra_nodes_gpus_are_not_the_extenders() -> None:
    state = SchedulerState(Allocator())
    state.on_node(Added("dp", project_node(node("dp", MODE_DEVICE_PLUGIN))))
    state.on_node(Added("dra", project_node(node("dra", MODE_DRA))))
    ext = Extender(state, writer=None, events=None, metrics=Metrics(state.alloc))
    pod = builders.gpu_pod("p", {"nvidia.com/vgpu-number": "1",
                                 "nvidia.com/vgpu-memory": "1000"}, phase="Pending")
    got = await ext.filter(ExtenderArgs(pod, ("dp", "dra"), None))
    assert got["NodeNames"] == ["dp"]
    assert "managed by DRA" in got["FailedAndUnresolvableNodes"]["dra"]
