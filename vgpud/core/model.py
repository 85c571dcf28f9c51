"""Frozen value types shared by the whole core.

Units: memory is MiB everywhere in the core (the shim speaks bytes), cores are
percent of one physical GPU's SMs.  A GPU's *capacity* is its physical memory ×
``memory_scaling`` and 100 × ``core_scaling``; ``split`` bounds how many vGPUs
(containers) may share it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Policy(enum.Enum):
    """How to choose among feasible nodes or GPUs."""

    BINPACK = "binpack"
    SPREAD = "spread"


class TopologyMode(enum.Enum):
    """A hard constraint on the GPUs of one container."""

    NONE = "none"
    NUMA = "numa"  # all GPUs of the container on one NUMA node
    LINK = "link"  # the GPUs of the container pairwise NVLink-connected


class ComputePolicy(enum.Enum):
    """How the shim enforces the SM limit (see docs/shim.md)."""

    FIXED = "fixed"
    BALANCE = "balance"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as the node's plugin reports it."""

    uuid: str
    index: int
    model: str
    memory: int  # physical MiB
    split: int = 10
    numa: int = 0
    links: tuple[str, ...] = ()
    healthy: bool = True
    mig: bool = False


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's GPUs and the scaling its plugin applies to them."""

    devices: tuple[Gpu, ...]
    memory_scaling: float = 1.0
    core_scaling: float = 1.0


@dataclass(frozen=True, slots=True)
class Node:
    """What the allocator knows of a node: its name, labels and GPUs."""

    name: str
    inventory: NodeInventory
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """The GPU slice one container asks for.

    ``memory`` is MiB per vGPU; ``memory_percent`` (exclusive with ``memory``) is a
    share of each chosen GPU's capacity. ``cores`` is percent of one GPU per vGPU;
    100 asks for a whole GPU, which needs an idle one and keeps others off it.
    """

    name: str
    number: int
    memory: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    init: bool = False
    sidecar: bool = False  # a restartable init container: runs alongside later ones

    @property
    def exclusive(self) -> bool:
        return self.cores >= 100


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Everything the allocator needs of one pod, parsed from its manifest."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    node_policy: Policy = Policy.BINPACK
    device_policy: Policy = Policy.BINPACK
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    topology: TopologyMode = TopologyMode.NONE
    compute_policy: ComputePolicy = ComputePolicy.FIXED
    priority: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_gpu(self) -> bool:
        return bool(self.containers)


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """One vGPU given to a container: which GPU and how much of it."""

    uuid: str
    memory: int  # MiB
    cores: int  # percent


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    name: str
    init: bool
    devices: tuple[DeviceGrant, ...]
    sidecar: bool = False  # a restartable init container (runs alongside the others)


@dataclass(frozen=True, slots=True)
class Placement:
    """The scheduler's decision for one pod on one node."""

    node: str
    containers: tuple[ContainerGrant, ...]
    compute_policy: ComputePolicy = ComputePolicy.FIXED
    priority: int = 0
    time: str = ""  # RFC 3339, set by the shell that writes it

    def container(self, name: str) -> ContainerGrant | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a pod does not fit a node (or a GPU).

    ``resolvable`` is true when the pod would fit this node if other pods left,
    false when it can never fit (kube-scheduler's Unschedulable vs
    UnschedulableAndUnresolvable).
    """

    code: str
    message: str
    resolvable: bool

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What the ledger holds against one GPU."""

    vgpus: int = 0
    memory: int = 0
    cores: int = 0
    exclusive: int = 0  # number of exclusive holders (0 or 1 when consistent)


@dataclass(frozen=True, slots=True)
class Defaults:
    """Cluster-wide defaults the core applies (the daemon config's keys)."""

    split: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    default_mem: int = 0  # MiB; 0 = the whole GPU's memory
    default_cores: int = 0
    default_gpu_num: int = 1
    node_policy: Policy = Policy.BINPACK
    device_policy: Policy = Policy.BINPACK
    compute_policy: ComputePolicy = ComputePolicy.FIXED
    preset: str = "vgpu-manager"
    compat_presets: tuple[str, ...] = ()
    assume_ttl: float = 120.0  # seconds an assumed placement may go unconfirmed
