"""Frozen value types shared by the whole core.

Units: memory is MiB everywhere in the core (the shim speaks bytes), cores are
percent of one physical GPU's SMs.  A GPU's *capacity* (:meth:`NodeInventory.capacity`,
the one definition) is its physical memory × ``memory_scaling`` and 100 ×
``core_scaling``, rounded to whole MiB and percent; ``split`` bounds how many vGPUs
(containers) may share it.

A vGPU of :data:`EXCLUSIVE_CORES` cores or more is *exclusive* (:func:`is_exclusive`):
it needs an idle GPU and keeps every other pod off it.

A pod's containers run in *phases* (:func:`phases`); what a pod holds on a GPU is the
maximum over its phases (:meth:`GpuUsage.join`), since phases never overlap.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

EXCLUSIVE_CORES = 100
# A MIG profile name as NVIDIA writes it: 1g.10gb, 1c.2g.20gb (a compute-instance
# profile), 1g.10gb+me (with media engines; ``.me`` where a resource name cannot hold "+")
MIG_PROFILE = re.compile(r"^(?:[1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb(?:[.+][a-z]+)?$")


def is_exclusive(cores: int) -> bool:
    """A vGPU with this many cores asks for a whole, idle GPU."""
    return cores >= EXCLUSIVE_CORES


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
    """One GPU as the node's plugin reports it: a physical GPU, or a MIG instance.

    A physical GPU in MIG mode has ``mig`` set and is never placed on; its instances
    (``parent`` names the GPU) are devices of their own. An instance advertised whole
    under its profile's resource (``migStrategy: mixed``, e.g. ``nvidia.com/mig-1g.10gb``)
    has ``profile`` set and only a request for that profile fits it; one shared like a
    GPU (``single``) has no ``profile`` and takes vGPU slices as any GPU does.
    """

    uuid: str
    index: int
    model: str
    memory: int  # physical MiB (an instance's own memory)
    split: int = 10
    numa: int = 0
    links: tuple[str, ...] = ()
    healthy: bool = True
    mig: bool = False
    profile: str = ""  # MIG profile ("1g.10gb") of an instance placed whole
    parent: str = ""  # the physical GPU of a MIG instance
    # a MIG instance's GPU and compute instance ids as NVML numbers them ("3-0"); "" for a
    # GPU, or where the source does not know them (a devices file that leaves them out)
    instance: str = ""

    def offers(self, profile: str) -> bool:
        """A container asking for ``profile`` ("" for vGPUs) may be placed here."""
        return not self.mig and self.profile == profile


MIG_STRATEGIES = ("none", "single", "mixed")


def offered(gpu: Gpu, strategy: str) -> Gpu | None:
    """How a node offers a discovered device under its MIG strategy (NVIDIA's names):
    GPUs as they are; a MIG instance (``parent`` set, ``profile`` its profile) not at
    all with "none", shared like a GPU with "single" (no ``profile``), whole under its
    profile with "mixed" (one vGPU)."""
    if not gpu.parent:
        return gpu
    if strategy == "single":
        return replace(gpu, profile="")
    if strategy == "mixed":
        return replace(gpu, split=1)
    return None


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's GPUs and the scaling its plugin applies to them."""

    devices: tuple[Gpu, ...]
    memory_scaling: float = 1.0
    core_scaling: float = 1.0

    def capacity(self, gpu: Gpu) -> GpuUsage:
        """What ``gpu`` offers under this node's split and scaling (the one definition).

        Rounded, not truncated: ``100 * 1.15`` is ``114.999…`` in binary floating point,
        and a user who writes ``deviceCoreScaling: 1.15`` means 115 %.
        """
        return GpuUsage(vgpus=gpu.split, memory=round(gpu.memory * self.memory_scaling),
                        cores=round(100 * self.core_scaling), exclusive=1)


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
    A ``profile`` request asks for ``number`` whole MIG instances of that profile
    (``memory_percent`` 100, ``cores`` 100).
    """

    name: str
    number: int
    memory: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    init: bool = False
    sidecar: bool = False  # a restartable init container: runs alongside later ones
    profile: str = ""  # MIG instances of this profile, each whole ("" for vGPUs)

    @property
    def exclusive(self) -> bool:
        return is_exclusive(self.cores)


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

    @property
    def usage(self) -> GpuUsage:
        """What this vGPU holds on its GPU."""
        return GpuUsage(vgpus=1, memory=self.memory, cores=self.cores,
                        exclusive=1 if is_exclusive(self.cores) else 0)


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

    def charge(self) -> dict[str, GpuUsage]:
        """What this placement holds per GPU uuid: the maximum over its phases."""
        out: dict[str, GpuUsage] = {}
        for phase in phases(self.containers):
            per: dict[str, GpuUsage] = {}
            for c in phase:
                for d in c.devices:
                    per[d.uuid] = per.get(d.uuid, ZERO) + d.usage
            for uuid, u in per.items():
                out[uuid] = out.get(uuid, ZERO).join(u)
        return out


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
    """An amount of one GPU: what is held on it, what a pod asks of it, or its capacity.

    ``exclusive`` counts exclusive holders (0 or 1 when consistent; in a capacity, 1).
    ``+`` and ``-`` combine holders that run at the same time; :meth:`join` (the
    component-wise maximum) combines phases of one pod, which never overlap.
    """

    vgpus: int = 0
    memory: int = 0
    cores: int = 0
    exclusive: int = 0

    def __add__(self, other: GpuUsage) -> GpuUsage:
        return GpuUsage(self.vgpus + other.vgpus, self.memory + other.memory,
                        self.cores + other.cores, self.exclusive + other.exclusive)

    def __sub__(self, other: GpuUsage) -> GpuUsage:
        return GpuUsage(self.vgpus - other.vgpus, self.memory - other.memory,
                        self.cores - other.cores, self.exclusive - other.exclusive)

    def join(self, other: GpuUsage) -> GpuUsage:
        """At most one of the two at a time: the component-wise maximum."""
        return GpuUsage(max(self.vgpus, other.vgpus), max(self.memory, other.memory),
                        max(self.cores, other.cores), max(self.exclusive, other.exclusive))


ZERO = GpuUsage()


class Phased(Protocol):
    """A container as far as phases go (a request or a grant)."""

    @property
    def init(self) -> bool: ...

    @property
    def sidecar(self) -> bool: ...


P = TypeVar("P", bound=Phased)


def phases(containers: Sequence[P]) -> list[list[P]]:
    """The containers that run together, as Kubernetes runs them: the main phase (app
    containers and every restartable sidecar) first, then each regular init container
    alone with the sidecars declared before it."""
    out = [[c for c in containers if c.sidecar or not c.init]]
    sidecars: list[P] = []
    for c in containers:
        if c.sidecar:
            sidecars.append(c)
        elif c.init:
            out.append([*sidecars, c])
    return out


@dataclass(frozen=True, slots=True)
class Preset:
    """Resource names of one GPU-sharing system (the built-in ones are
    :data:`vgpud.core.requests.PRESETS`; the settings may rename them)."""

    name: str
    number: str
    memory: str | None
    cores: str | None
    memory_percent: str | None = None
    priority: str | None = None  # a resource carrying the priority (HAMi)
    tke: bool = False  # TKE's units: vcuda-core 100 = one GPU, vcuda-memory × 256 MiB
    mig: str | None = None  # prefix of the MIG profile resources (``<mig><profile>``)

    @property
    def names(self) -> tuple[str, ...]:
        """The resource names a pod may ask for (number, memory, cores, memory share,
        priority: those the preset has), MIG profiles aside."""
        return tuple(n for n in (self.number, self.memory, self.cores, self.memory_percent,
                                 self.priority) if n is not None)

    def mig_profile(self, resource: str) -> str | None:
        """The MIG profile a resource name asks for (``nvidia.com/mig-1g.10gb`` →
        ``1g.10gb``), or None when it is not one of this preset's MIG resources."""
        if self.mig is None or not resource.startswith(self.mig):
            return None
        return resource[len(self.mig):]


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
    # presets whose names the settings changed (``resourceNames``): each replaces the
    # built-in preset of its name (vgpud.core.requests.preset_table)
    presets: tuple[Preset, ...] = ()
    assume_ttl: float = 120.0  # seconds an assumed placement may go unconfirmed
