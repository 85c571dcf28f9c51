"""Preemption by GPU room, as kube-scheduler 1.37 really does it.

kube-scheduler's dry run checks only its in-tree filters, never an extender's. On a node
that only the extender refused it finds no victim and drops the node before any
extender's ``ProcessPreemption`` ("expected at least one victim pod on node"); the
placeholder that lets an extender fill such a node (kubernetes#135486) is not in 1.37.
So GPU room reaches kube-scheduler's preemption only through resources it counts itself:
the vGPU count, and with the plugin's ``MemoryPlugin`` / ``CorePlugin`` gates the node's
``nvidia.com/vgpu-memory`` / ``nvidia.com/vgpu-cores`` totals (docs/install.md,
"Preemption"). The extender then corrects kube-scheduler's victims GPU by GPU.

The nodes here are Node objects as the plugin leaves them with ``MemoryPlugin`` on (the
inventory annotation and ``nvidia.com/vgpu-memory`` in allocatable); the chart is
rendered with that gate, so kube-scheduler counts the resource.
"""

from __future__ import annotations

import pytest

from tests.realkube.api import wait_for
from tests.realkube.cluster import Scenario, assignment
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import Release

MEMORY = "nvidia.com/vgpu-memory"


@pytest.fixture(scope="module")
def chart_values() -> tuple[str, ...]:
    return ("config.plugin.featureGates.MemoryPlugin=true",)


@pytest.fixture(autouse=True)
def _release(release: Release) -> Release:
    return release


def _gpu_node(s: Scenario, name: str, gpus: int, memory: int) -> str:
    return s.gpu_node(name, gpus=gpus, memory=memory,
                      extra_allocatable={MEMORY: str(gpus * memory)})


def _hold(s: Scenario, name: str, memory: int, priority_class: str, gpu: str, *,
          namespace: str | None = None) -> str:
    """A running GPU pod of ``memory`` MiB on the GPU ``gpu``, scheduled by vgpud."""
    s.apply(s.pod(name, {MEMORY: str(memory)}, namespace=namespace,
                  priority_class=priority_class,
                  annotations={"nvidia.com/include-gpu-uuid": gpu}))
    pod = s.wait_bound(name, namespace=namespace)
    (grant,) = assignment(pod).containers
    assert [d.uuid for d in grant.devices] == [gpu]
    s.ready(name, namespace)
    return str(pod["metadata"]["uid"])


def _gone(s: Scenario, name: str, namespace: str | None = None) -> bool:
    return s.admin.find("Pod", name, namespace or s.ns) is None


def test_the_fewest_lower_priority_holders_leave_the_gpu(scenario: Scenario,
                                                         release: Release) -> None:
    s = scenario
    node = _gpu_node(s, "a", gpus=1, memory=16384)
    gpu = f"GPU-{node}-0"
    low = s.priority_class("low", 1)
    high = s.priority_class("high", 100)
    for name in ("old", "mid", "new"):
        _hold(s, name, 5000, low, gpu)
    # 15,000 of 16,384 MiB held: a pod of 8,000 needs two of the three to leave. The
    # vGPU slots (3 of 10), CPU and memory are free: only GPU room is short.
    s.apply(s.pod("urgent", {MEMORY: "8000"}, priority_class=high))
    pod = s.wait_bound("urgent", timeout=120,
                       detail=lambda: s.describe("urgent") + "\n" + release.tails())
    assert pod["spec"]["nodeName"] == node
    left = [n for n in ("old", "mid", "new") if _gone(s, n)]
    assert len(left) == 2, left
    (grant,) = assignment(pod).containers
    assert [(d.uuid, d.memory) for d in grant.devices] == [(gpu, 8000)]
    events = {e["reason"] for n in left for e in s.events(n)}
    assert "Preempted" in events, events


def test_a_budget_with_an_empty_selector_guards_every_pod_of_its_namespace(
        control_plane: ControlPlane, scenario: Scenario, release: Release) -> None:
    """policy/v1: ``selector: {}`` selects every pod of its namespace. kube-scheduler 1.37
    proposes one victim by the node's memory total; the extender must add one more on a
    GPU, and of the two it could take it takes the one no budget guards."""
    control_plane.start_controller_manager("disruption")
    s = scenario
    node = _gpu_node(s, "a", gpus=2, memory=16384)
    gpu0, gpu1 = f"GPU-{node}-0", f"GPU-{node}-1"
    p = {v: s.priority_class(f"p{v}", v) for v in (1, 2, 3, 4, 100)}
    guarded = s.namespace("guarded")
    s.admin.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "all", "namespace": guarded},
                    "spec": {"minAvailable": 1, "selector": {}}})
    _hold(s, "a1", 6000, p[2], gpu0, namespace=guarded)  # guarded by the budget
    _hold(s, "b1", 6000, p[3], gpu0)
    _hold(s, "c1", 4000, p[1], gpu1)
    _hold(s, "d1", 10000, p[4], gpu1)
    budget = wait_for("the disruption controller to count the guarded pod", lambda: (
        b if (b := s.admin.get("PodDisruptionBudget", "all", guarded)).get("status", {})
        .get("currentHealthy") == 1 else None), timeout=60,
        detail=lambda: control_plane.tails())
    assert budget["spec"]["selector"] == {}
    assert budget["status"]["disruptionsAllowed"] == 0
    # 26,000 of 32,768 MiB held; 10,000 more on one GPU. By the node's total, evicting the
    # least important pod (c1, 4,000) is enough; GPU by GPU it is not: one more must go
    # from GPU 0 (a1 or b1). a1 is less important, but its budget allows no disruption.
    s.apply(s.pod("urgent", {MEMORY: "10000"}, priority_class=p[100]))
    pod = s.wait_bound("urgent", timeout=120,
                       detail=lambda: s.describe("urgent") + "\n" + release.tails())
    assert pod["spec"]["nodeName"] == node
    assert _gone(s, "c1") and _gone(s, "b1")
    assert not _gone(s, "a1", guarded) and not _gone(s, "d1")
    (grant,) = assignment(pod).containers
    assert [(d.uuid, d.memory) for d in grant.devices] == [(gpu0, 10000)]


def test_the_node_total_decides_whether_kube_scheduler_asks_at_all(
        scenario: Scenario, release: Release) -> None:
    """Where the node's total has room but no single GPU does, kube-scheduler 1.37 finds
    no victim by its own filters and never calls the extender's preempt: the pod waits,
    and nothing is evicted (docs/install.md, "Preemption", says so)."""
    s = scenario
    node = _gpu_node(s, "a", gpus=2, memory=16384)
    low = s.priority_class("low", 1)
    high = s.priority_class("high", 100)
    _hold(s, "x", 10000, low, f"GPU-{node}-0")
    _hold(s, "y", 10000, low, f"GPU-{node}-1")
    before = _preempt_calls(release)
    # 12,768 MiB free on the node, 6,384 on each GPU: a pod of 8,000 fits by the total
    s.apply(s.pod("urgent", {MEMORY: "8000"}, priority_class=high))
    event = wait_for("kube-scheduler's verdict on preemption", lambda: next(
        (e for e in s.events("urgent") if e["reason"] == "FailedScheduling"
         and "preemption:" in e["message"]), None), timeout=60,
        detail=lambda: s.describe("urgent") + "\n" + release.tails())
    # the dry run removed every lower-priority pod, found the in-tree filters pass without
    # them, reprieved them all, and gave up on the node before asking any extender
    assert f'preemption: expected at least one victim pod on node "{node}"' in (
        event["message"]), event["message"]
    assert _preempt_calls(release) == before
    assert not _gone(s, "x") and not _gone(s, "y")
    assert not s.get("urgent")["spec"].get("nodeName")


def _preempt_calls(release: Release) -> float:
    return sum(float(line.rpartition(" ")[2]) for line in release.extender_metrics().splitlines()
               if line.startswith('vgpud_extender_requests_total{') and 'verb="preempt"' in line)
