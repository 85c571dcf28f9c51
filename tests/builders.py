"""The builders the tests share: pod manifests, node objects, the core model's nodes, and
placements.

Each builds one thing with keyword arguments for what tests vary; what a test builds
on purpose wrong (a garbled annotation, a pod only a webhook sees) stays in the test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES, encode_assignment, encode_node_devices
from vgpud.core.model import ContainerGrant, DeviceGrant, Gpu, Node, NodeInventory, Placement

# the default preset's resource names, by the short names tests give them
SHORT = {"number": "nvidia.com/vgpu-number", "memory": "nvidia.com/vgpu-memory",
         "cores": "nvidia.com/vgpu-cores", "percent": "nvidia.com/vgpu-memory-percentage"}
NO_ANNOTATIONS: Mapping[str, str] = MappingProxyType({})


def vgpu(**short: Any) -> dict[str, Any]:
    """Limits in the default preset's resource names: ``vgpu(number=1, memory=4096)``."""
    return {SHORT[k]: v for k, v in short.items()}


def container(name: str = "main", limits: Mapping[str, Any] | None = None, *,
              image: str | None = None, restart: str | None = None, **short: Any,
              ) -> dict[str, Any]:
    """A container asking ``limits`` and the limits ``short`` names (:func:`vgpu`)."""
    c: dict[str, Any] = {"name": name}
    if image is not None:
        c["image"] = image
    c["resources"] = {"limits": {**(limits or {}), **vgpu(**short)}}
    if restart:
        c["restartPolicy"] = restart
    return c


def gpu_pod(name: str = "p", limits: Mapping[str, Any] | None = None, *,
            namespace: str = "default", uid: bool | str = False,
            annotations: Mapping[str, str] | None = NO_ANNOTATIONS,
            assignment: str | Placement | None = None, labels: Mapping[str, str] | None = None,
            created: str | None = None, scheduler: str | None = "vgpu-scheduler",
            node: str | None = None, image: str | None = "cuda",
            containers: Sequence[dict[str, Any]] | None = None,
            init: Sequence[dict[str, Any]] | None = None, phase: str | None = None,
            typed: bool = True) -> dict[str, Any]:
    """A Pod manifest: one container ``main`` asking ``limits`` (as given), or ``containers``.

    ``uid=True`` gives ``uid-<name>``; ``annotations=None`` leaves them out (the default
    is an empty map); ``assignment`` (encoded, or a Placement to encode) joins them;
    ``scheduler``, ``node``, ``image``, ``phase`` and ``init`` are left out when None;
    ``limits=None`` gives ``main`` no ``resources``; ``typed=False`` leaves out apiVersion
    and kind.
    """
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = f"uid-{name}" if uid is True else uid
    if created is not None:
        meta["creationTimestamp"] = created
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None or assignment is not None:
        meta["annotations"] = dict(annotations or {})
        if assignment is not None:
            meta["annotations"][ASSIGNMENT] = (
                assignment if isinstance(assignment, str) else encode_assignment(assignment))
    spec: dict[str, Any] = {}
    if node is not None:
        spec["nodeName"] = node
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init is not None:
        spec["initContainers"] = list(init)
    if containers is None:
        main = container("main", limits, image=image)
        if limits is None:  # a pod that asks nothing
            del main["resources"]
        containers = [main]
    spec["containers"] = list(containers)
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"} if typed else {}
    out |= {"metadata": meta, "spec": spec}
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


def pod(name: str = "p", *, containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
        **short: Any) -> dict[str, Any]:
    """The core tests' pod: ``uid-<name>``, no scheduler or image, limits by short name
    (``pod("a", number=1, memory=4096)``)."""
    return gpu_pod(name, vgpu(**short), uid=True, annotations=annotations or {},
                   scheduler=None, image=None, containers=containers, init=init or None)


def node(name: str, n: int = 2, memory: int = 32768, *, model: str = "Tesla V100-PCIE-32GB",
         split: int = 10, numa: tuple[int, ...] | None = None, scaling: float = 1.0,
         core_scaling: float = 1.0, links: bool = False, healthy: tuple[bool, ...] | None = None,
         ) -> Node:
    """The core model's Node: ``n`` GPUs ``GPU-<name>-<i>``."""
    uuids = [f"GPU-{name}-{i}" for i in range(n)]
    gpus = tuple(
        Gpu(uuid=u, index=i, model=model, memory=memory, split=split,
            numa=(numa[i] if numa else 0),
            links=tuple(x for x in uuids if x != u) if links else (),
            healthy=healthy[i] if healthy else True)
        for i, u in enumerate(uuids))
    return Node(name, NodeInventory(gpus, scaling, core_scaling))


def gpu_node(name: str, gpus: int, memory: int, *, split: int = 10, scaling: float = 1.0,
             model: str = "Tesla V100-PCIE-32GB", numa: tuple[int, ...] | None = None,
             ) -> dict[str, Any]:
    """A Node object whose ``vgpud.io/node-devices`` annotation holds :func:`node`'s
    inventory; ``numa`` defaults to alternating 0 and 1."""
    numa = numa if numa is not None else tuple(i % 2 for i in range(gpus))
    inv = node(name, gpus, memory, model=model, split=split, numa=numa, scaling=scaling).inventory
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {NODE_DEVICES: encode_node_devices(inv)}}}


def placement(containers: dict[str, list[tuple[int, int, int]]], *, node: str,
              uuid: Callable[[int], str], time: str = "2026-01-01T00:00:00Z") -> Placement:
    """{container: [(gpu index, MiB, cores)]} → a Placement, GPU ``i`` named ``uuid(i)``."""
    return Placement(node=node, containers=tuple(
        ContainerGrant(name=name, init=False, devices=tuple(
            DeviceGrant(uuid=uuid(g), memory=m, cores=c) for g, m, c in devs))
        for name, devs in containers.items()), time=time)
