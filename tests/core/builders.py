"""Small builders for core tests: nodes, GPUs and pod manifests."""

from __future__ import annotations

from typing import Any

from vgpud.core.model import Gpu, Node, NodeInventory


def node(name: str, n: int = 2, memory: int = 32768, *, model: str = "Tesla V100-PCIE-32GB",
         split: int = 10, numa: tuple[int, ...] | None = None, scaling: float = 1.0,
         core_scaling: float = 1.0, links: bool = False, healthy: tuple[bool, ...] | None = None,
         ) -> Node:
    uuids = [f"GPU-{name}-{i}" for i in range(n)]
    gpus = tuple(
        Gpu(uuid=u, index=i, model=model, memory=memory, split=split,
            numa=(numa[i] if numa else 0),
            links=tuple(x for x in uuids if x != u) if links else (),
            healthy=healthy[i] if healthy else True)
        for i, u in enumerate(uuids))
    return Node(name, NodeInventory(gpus, scaling, core_scaling))


def pod(name: str = "p", *, containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
        **limits: Any) -> dict[str, Any]:
    """A Pod manifest; keyword limits use the default preset's short names."""
    names = {"number": "nvidia.com/vgpu-number", "memory": "nvidia.com/vgpu-memory",
             "cores": "nvidia.com/vgpu-cores", "percent": "nvidia.com/vgpu-memory-percentage"}
    if containers is None:
        containers = [{"name": "main",
                       "resources": {"limits": {names[k]: v for k, v in limits.items()}}}]
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "annotations": annotations or {}},
            "spec": spec}


def container(name: str, restart: str | None = None, **limits: Any) -> dict[str, Any]:
    names = {"number": "nvidia.com/vgpu-number", "memory": "nvidia.com/vgpu-memory",
             "cores": "nvidia.com/vgpu-cores", "percent": "nvidia.com/vgpu-memory-percentage"}
    c: dict[str, Any] = {"name": name,
                         "resources": {"limits": {names[k]: v for k, v in limits.items()}}}
    if restart:
        c["restartPolicy"] = restart
    return c
