"""What the scenarios build on a real control plane: GPU nodes (Node objects as the
device plugin would leave them, without a kubelet), GPU pods, and waits on what the real
components do with them."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from tests.realkube.api import Api, Obj, wait_for
from tests.realkube.controlplane import ControlPlane
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES, decode_assignment, encode_node_devices
from vgpud.core.model import Gpu, NodeInventory, Placement

TEST_LABEL = "realkube.vgpud.io/test"
_ids = itertools.count()


def inventory(name: str, gpus: int, memory: int, *, split: int = 10,
              model: str = "Tesla V100-PCIE-32GB") -> str:
    return encode_node_devices(NodeInventory(tuple(
        Gpu(f"GPU-{name}-{i}", i, model, memory, split, i % 2) for i in range(gpus)), 1.0, 1.0))


class Scenario:
    """One test's corner of the shared control plane: its namespace, and nodes labelled
    for it alone (its pods select that label), all removed at the end."""

    def __init__(self, cp: ControlPlane, name: str) -> None:
        self.cp = cp
        self.id = f"{name[:40].rstrip('-')}-{next(_ids)}"
        self.ns = cp.namespace(self.id)
        self.namespaces = [self.ns]
        self.nodes: list[str] = []
        self.cluster_objects: list[tuple[str, str]] = []  # (kind, name) to delete

    def namespace(self, suffix: str) -> str:
        """Another namespace of this scenario's, emptied at the end."""
        ns = self.cp.namespace(f"{self.id}-{suffix}")
        self.namespaces.append(ns)
        return ns

    def priority_class(self, name: str, value: int) -> str:
        pc = f"{self.id}-{name}"
        self.admin.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": pc}, "value": value})
        self.cluster_objects.append(("PriorityClass", pc))
        return pc

    @property
    def admin(self) -> Api:
        return self.cp.admin

    def gpu_node(self, name: str, gpus: int = 2, memory: int = 16384, *, split: int = 10,
                 extra_allocatable: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> str:
        node = f"{self.id}-{name}"
        allocatable = {"nvidia.com/vgpu-number": str(gpus * split), **(extra_allocatable or {})}
        self.cp.add_node(node, annotations={NODE_DEVICES: inventory(node, gpus, memory,
                                                                    split=split)},
                         labels={TEST_LABEL: self.id, **(labels or {})},
                         allocatable=allocatable)
        self.nodes.append(node)
        return node

    def pod(self, name: str, limits: dict[str, Any] | None = None, *,
            namespace: str | None = None,
            annotations: dict[str, str] | None = None, priority_class: str | None = None,
            labels: dict[str, str] | None = None, scheduler: str | None = None,
            resources: dict[str, Any] | None = None, node_name: str | None = None,
            containers: list[Obj] | None = None) -> Obj:
        """A pod as a user writes it: no schedulerName (the webhook sets it), its GPU
        request in ``limits``, and this scenario's node selector."""
        spec: Obj = {
            "containers": containers or [{"name": "main", "image": "registry.invalid/cuda:12",
                                          "resources": resources or {"limits": limits or {}}}],
            "nodeSelector": {TEST_LABEL: self.id},
            "terminationGracePeriodSeconds": 0,
        }
        if scheduler:
            spec["schedulerName"] = scheduler
        if priority_class:
            spec["priorityClassName"] = priority_class
        if node_name:
            spec["nodeName"] = node_name
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace or self.ns,
                             "annotations": annotations or {}, "labels": labels or {}},
                "spec": spec}

    def apply(self, pod: Obj, api: Api | None = None) -> Obj:
        return (api or self.admin).apply(pod)

    def get(self, name: str, namespace: str | None = None) -> Obj:
        return self.admin.get("Pod", name, namespace or self.ns)

    def ready(self, name: str, namespace: str | None = None) -> None:
        """Mark a bound pod Running and Ready, as its kubelet would (no kubelet here)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.admin.patch("Pod", name, {"status": {
            "phase": "Running", "startTime": now,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}},
            namespace or self.ns, sub="status")

    def wait_bound(self, name: str, *, namespace: str | None = None, timeout: float = 60,
                   detail: Any = None) -> Obj:
        ns = namespace or self.ns

        def bound() -> Obj | None:
            p = self.get(name, ns)
            return p if p["spec"].get("nodeName") else None
        got: Obj = wait_for(f"pod {ns}/{name} to be bound", bound, timeout=timeout,
                            detail=detail or (lambda: self.describe(name, ns)))
        return got

    def describe(self, name: str, namespace: str | None = None) -> str:
        ns = namespace or self.ns
        p = self.admin.find("Pod", name, ns)
        events = self.admin.list("Event", ns, fieldSelector=f"involvedObject.name={name}")
        lines = [f"pod {name}: {None if p is None else p.get('status')}"]
        lines += [f"  event {e.get('reason')}: {e.get('message')}" for e in events]
        return "\n".join(lines)

    def events(self, name: str) -> list[Obj]:
        return self.admin.list("Event", self.ns, fieldSelector=f"involvedObject.name={name}")

    def close(self) -> None:
        for ns in self.namespaces:
            for p in self.admin.list("Pod", ns):
                self.admin.delete("Pod", p["metadata"]["name"], ns, grace=0)
            for b in self.admin.list("PodDisruptionBudget", ns):
                self.admin.delete("PodDisruptionBudget", b["metadata"]["name"], ns)
        for node in self.nodes:
            self.admin.delete("Node", node)
        for kind, name in self.cluster_objects:
            self.admin.delete(kind, name)


def assignment(pod: Obj) -> Placement:
    raw = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
    assert raw, f"pod {pod['metadata']['name']} carries no {ASSIGNMENT}"
    return decode_assignment(raw)


def placed_slice(scenario: Scenario, limits: dict[str, str],
                 detail: Callable[[], str] = lambda: "") -> tuple[Obj, int, int]:
    """A one-container pod asking ``limits``, sent to vgpud's scheduler by the webhook
    and bound: the pod as bound, and the (MiB, cores) its one GPU was granted."""
    created = scenario.apply(scenario.pod("peer", limits))
    assert created["spec"]["schedulerName"] == "vgpu-scheduler"
    pod = scenario.wait_bound("peer", detail=lambda: scenario.describe("peer") + "\n"
                              + detail())
    (grant,) = assignment(pod).containers
    (device,) = grant.devices
    return pod, device.memory, device.cores
