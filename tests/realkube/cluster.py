"""What the scenarios build on a real control plane: GPU nodes (Node objects as the
device plugin would leave them, without a kubelet), GPU pods, and waits on what the real
components do with them."""

from __future__ import annotations

import itertools
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
        self.nodes: list[str] = []

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
                "metadata": {"name": name, "namespace": self.ns,
                             "annotations": annotations or {}, "labels": labels or {}},
                "spec": spec}

    def apply(self, pod: Obj, api: Api | None = None) -> Obj:
        return (api or self.admin).apply(pod)

    def get(self, name: str) -> Obj:
        return self.admin.get("Pod", name, self.ns)

    def wait_bound(self, name: str, *, timeout: float = 60, detail: Any = None) -> Obj:
        def bound() -> Obj | None:
            p = self.get(name)
            return p if p["spec"].get("nodeName") else None
        got: Obj = wait_for(f"pod {self.ns}/{name} to be bound", bound, timeout=timeout,
                            detail=detail or (lambda: self.describe(name)))
        return got

    def describe(self, name: str) -> str:
        p = self.admin.find("Pod", name, self.ns)
        events = self.admin.list("Event", self.ns,
                                 fieldSelector=f"involvedObject.name={name}")
        lines = [f"pod {name}: {None if p is None else p.get('status')}"]
        lines += [f"  event {e.get('reason')}: {e.get('message')}" for e in events]
        return "\n".join(lines)

    def events(self, name: str) -> list[Obj]:
        return self.admin.list("Event", self.ns, fieldSelector=f"involvedObject.name={name}")

    def close(self) -> None:
        for p in self.admin.list("Pod", self.ns):
            self.admin.delete("Pod", p["metadata"]["name"], self.ns, grace=0)
        for node in self.nodes:
            self.admin.delete("Node", node)


def assignment(pod: Obj) -> Placement:
    raw = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
    assert raw, f"pod {pod['metadata']['name']} carries no {ASSIGNMENT}"
    return decode_assignment(raw)
