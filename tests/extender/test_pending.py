"""GPU pods waiting for the scheduler, as its metrics count them: pods that name this
scheduler, ask for a vGPU and are not bound, from creation until bound, ended or gone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import gpu_pod
from tests.kube.clocks import ManualClock
from vgpud.core.allocate import Allocator
from vgpud.core.model import Defaults
from vgpud.extender.metrics import PendingGpuPods
from vgpud.kube.cache import Added, Deleted, Modified
from vgpud.scheduling.projections import project_pod, waits_for_gpu
from vgpud.scheduling.state import SchedulerState

WAITS = waits_for_gpu("vgpu-scheduler", Defaults())
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def pod(name: str, *, scheduler: str = "vgpu-scheduler", limits: dict[str, str] | None = None,
        node: str = "", phase: str = "Pending", created: str | None = "2026-01-01T00:00:00Z",
        ) -> dict[str, Any]:
    return gpu_pod(name, limits or {"nvidia.com/vgpu-number": "1"}, namespace="ml", uid=True,
                   annotations=None, created=created, scheduler=scheduler, node=node or None,
                   image=None, phase=phase, typed=False)


def test_which_pods_count_as_pending() -> None:
    assert project_pod(pod("a"), WAITS).pending_since == T0
    assert project_pod(pod("a")).pending_since == 0  # no filter given: nothing counted
    assert project_pod(pod("b", scheduler="default-scheduler"), WAITS).pending_since == 0
    assert project_pod(pod("c", limits={"cpu": "1"}), WAITS).pending_since == 0
    assert project_pod(pod("d", node="n1"), WAITS).pending_since == 0
    assert project_pod(pod("e", phase="Failed"), WAITS).pending_since == 0
    assert project_pod(pod("f", limits={"nvidia.com/vgpu-memory": "1000"}),
                       WAITS).pending_since == T0
    assert project_pod(pod("g", created=None), WAITS).pending_since == -1


def test_the_state_counts_them_until_bound_or_gone_and_the_metrics_show_the_oldest() -> None:
    state = SchedulerState(Allocator())
    a = project_pod(pod("a"), WAITS)
    b = project_pod(pod("b", created="2026-01-01T00:05:00Z"), WAITS)
    state.on_pod(Added("ml/a", a))
    state.on_pod(Added("ml/b", b))
    gauges = PendingGpuPods(state.pending_since,
                            clock=ManualClock(wall=datetime.fromtimestamp(T0 + 600, UTC)))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(gauges)

    def read() -> dict[str, float]:
        return {s.name: s.value for f in text_string_to_metric_families(
            generate_latest(reg).decode()) for s in f.samples}

    assert read() == {"vgpud_scheduler_pending_gpu_pods": 2,
                      "vgpud_scheduler_oldest_pending_gpu_pod_age_seconds": 600}
    state.on_pod(Modified("ml/a", a, project_pod(pod("a", node="n1"), WAITS)))  # bound
    assert read() == {"vgpud_scheduler_pending_gpu_pods": 1,
                      "vgpud_scheduler_oldest_pending_gpu_pod_age_seconds": 300}
    state.on_pod(Deleted("ml/b", b))
    assert read() == {"vgpud_scheduler_pending_gpu_pods": 0,
                      "vgpud_scheduler_oldest_pending_gpu_pod_age_seconds": 0}
