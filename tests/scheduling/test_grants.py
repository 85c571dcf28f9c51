"""Issue 23, finding 2: only a grant this scheduler could have made holds GPUs. A pod
that asks for no vGPU, or names another scheduler, bound by its own ``nodeName`` with an
assignment claiming every GPU of a node, was put in the ledger like a scheduled one and
made the node unschedulable for GPU pods."""

from __future__ import annotations

from typing import Any

from vgpud.core.allocate import Allocator
from vgpud.core.codec import ASSIGNMENT, encode_assignment
from vgpud.core.model import (
    ContainerGrant,
    Defaults,
    DeviceGrant,
    Gpu,
    Node,
    NodeInventory,
    Placement,
)
from vgpud.kube.cache import Added
from vgpud.scheduling.projections import NOT_GRANTED, granted_by, project_pod, waits_for_gpu
from vgpud.scheduling.state import SchedulerState

GRANTS = granted_by("vgpu-scheduler", Defaults())
WAITS = waits_for_gpu("vgpu-scheduler", Defaults())
EVERY_GPU = Placement("n1", (ContainerGrant("main", False, tuple(
    DeviceGrant(f"GPU-n1-{i}", 16384, 100) for i in range(2))),))


def bound(name: str, *, scheduler: str = "vgpu-scheduler",
          limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": {ASSIGNMENT: encode_assignment(EVERY_GPU)}},
            "spec": {"schedulerName": scheduler, "nodeName": "n1", "containers": [
                {"name": "main", "resources": {"limits": limits if limits is not None
                                               else {"nvidia.com/vgpu-number": "2"}}}]},
            "status": {"phase": "Running"}}


def state() -> SchedulerState:
    alloc = Allocator()
    alloc.set_node(Node("n1", NodeInventory(tuple(
        Gpu(f"GPU-n1-{i}", i, "A100", 16384) for i in range(2)))))
    return SchedulerState(alloc)


def test_a_pod_that_asks_no_gpu_holds_none() -> None:
    s = state()
    plain = project_pod(bound("plain", limits={"cpu": "1"}), WAITS, GRANTS)
    assert plain.placement is None and plain.assignment_error == NOT_GRANTED
    assert plain.failure is None  # not this scheduler's to reschedule either
    s.on_pod(Added("ml/plain", plain))
    assert not s.alloc.forget("uid-plain")
    assert "uid-plain" in s.bad_assignments  # logged once, as an invalid assignment


def test_a_pod_of_another_scheduler_holds_none() -> None:
    s = state()
    other = project_pod(bound("other", scheduler="default-scheduler"), WAITS, GRANTS)
    assert other.placement is None
    s.on_pod(Added("ml/other", other))
    assert not s.alloc.forget("uid-other")


def test_a_pod_this_scheduler_placed_holds_its_gpus() -> None:
    s = state()
    mine = project_pod(bound("mine"), WAITS, GRANTS)
    assert mine.placement == EVERY_GPU
    s.on_pod(Added("ml/mine", mine))
    assert s.alloc.forget("uid-mine")
