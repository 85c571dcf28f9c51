"""The ResourceSlices (``resource.k8s.io/v1``) of a node's GPUs for vgpud's DRA driver,
and what to write to make the API hold exactly them.

:func:`devices` turns a node's :class:`~vgpud.core.model.NodeInventory` (and, where the
backend read them, the facts of :class:`GpuFacts` and :class:`DriverFacts`) into one
:class:`SliceDevice` per GPU or MIG instance: named by
:func:`vgpud.core.dra.device_names` (``gpu-N``, ``gpu-N-mig-GI-CI``; a claim's allocated
device names are read back through its inverse, :func:`vgpud.core.dra.device_of`), with
attributes a claim's CEL selector may test, and three consumable capacities
(``allowMultipleAllocations: true``, KEP-5075), each with the ``requestPolicy`` that
vgpud's own request rules (``core/requests.py``) give a vGPU:

- ``memory``, bytes: the GPU's capacity (physical × ``deviceMemoryScaling``); a claim
  that names none gets ``defaultMem`` MiB, or the whole GPU when that is 0 (a vGPU that
  gives no memory gets all of it); whole MiB from 1 MiB to all of it.
- ``cores``, percent of the GPU's SMs: capacity 100 × ``deviceCoreScaling``; default
  ``defaultCores``; 0 (no SM limit) to 100 (a request is a share of one GPU, never more),
  in whole percent.
- ``vgpus``: ``deviceSplitCount``; every allocation takes exactly one, so no more than
  split claims share a GPU, as with the device plugin.

A MIG instance offered whole (``migStrategy: mixed``) has split 1 and defaults of all its
memory and cores; one shared (``single``) is a GPU of its size. A GPU in MIG mode is not
offered (its instances are). An unhealthy GPU keeps its name and gets a ``NoSchedule``
taint (KEP-5055, GA in 1.37): no new allocations, the claims on it stay.

:func:`pool` cuts the devices into slices of at most :data:`MAX_DEVICES_PER_SLICE` (the
API's limit once a device has a taint) under the pool named after the node;
:func:`plan` compares them with the slices the API holds (:func:`published`, parsed at
the edge) and returns the creates, updates and deletes that make the two equal. A pool
whose content changes gets a new generation on every slice. Each slice carries a digest
of its content (:data:`DIGEST`), so the comparison never depends on how the API server
writes quantities back or on the taints' ``timeAdded``, which it fills in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpud.core.dra import CAPACITY_CORES, CAPACITY_MEMORY, DRIVER, device_names
from vgpud.core.model import Defaults, Gpu, NodeInventory

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
CAPACITY_VGPUS = "vgpus"  # vGPUs (claims) on the GPU: the node's split; each takes one
MIB = 1 << 20
# ResourceSliceMaxDevicesWithAdvancedFeatures: a slice with a tainted device holds 64 at most
MAX_DEVICES_PER_SLICE = 64
MAX_ATTRIBUTE_LENGTH = 64  # DeviceAttributeMaxValueLength
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
DIGEST = f"{DRIVER}/content"  # annotation: the digest of the slice's devices and count
STANDARD = "resource.kubernetes.io/"  # the standard attributes' domain (deviceattribute)

Attribute = int | bool | str


@dataclass(frozen=True, slots=True)
class Version:
    """A ``version`` attribute: semantic version text (``535.104.5``)."""

    text: str


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What a backend may read of a GPU beyond the inventory; empty fields are unknown."""

    pci_bus_id: str = ""  # NVML's "00000000:3B:00.0"
    multiprocessors: int = 0
    compute_capability: str = ""  # "8.0"


@dataclass(frozen=True, slots=True)
class DriverFacts:
    """The node's driver, where known."""

    driver_version: str = ""  # "535.104.05"
    cuda_driver_version: str = ""  # "12.2"


@dataclass(frozen=True, slots=True)
class Capacity:
    """A consumable capacity and its request policy (all integers, in its unit)."""

    value: int
    default: int
    min: int
    max: int
    step: int | None = None
    valid_values: tuple[int, ...] = ()  # instead of the range when set


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a slice."""

    name: str
    uuid: str
    attributes: tuple[tuple[str, Attribute | Version], ...]
    capacity: tuple[tuple[str, Capacity], ...]
    taints: tuple[Taint, ...] = ()

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: _attribute(v) for k, v in self.attributes},
            "capacity": {k: _capacity(c) for k, c in self.capacity},
            "allowMultipleAllocations": True,
        }
        if self.taints:
            out["taints"] = [{"key": t.key, **({"value": t.value} if t.value else {}),
                              "effect": t.effect} for t in self.taints]
        return out


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """One slice of the node's pool, ready for the API (:meth:`manifest`)."""

    name: str
    node: str
    generation: int
    count: int  # resourceSliceCount: the slices of this generation
    devices: tuple[SliceDevice, ...]
    resource_version: str = ""  # set on an update (the version it replaces)

    @property
    def digest(self) -> str:
        return content_digest(self.devices, self.count)

    def manifest(self, node_uid: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "annotations": {DIGEST: self.digest}}
        if node_uid:  # the Node owns them: they go when it goes
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                        "uid": node_uid, "controller": True}]
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": {
            "driver": DRIVER, "nodeName": self.node,
            "pool": {"name": self.node, "generation": self.generation,
                     "resourceSliceCount": self.count},
            "devices": [d.manifest() for d in self.devices]}}


@dataclass(frozen=True, slots=True)
class Published:
    """A slice of this driver and node as the API holds it (:func:`published`)."""

    name: str
    generation: int
    count: int
    digest: str
    resource_version: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What to write: creates first, then updates, then deletes (by name, version)."""

    creates: tuple[ResourceSlice, ...] = ()
    updates: tuple[ResourceSlice, ...] = ()
    deletes: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.creates or self.updates or self.deletes)


# -- devices ---------------------------------------------------------------------------


def devices(inventory: NodeInventory, defaults: Defaults | None = None, *,
            facts: Mapping[str, GpuFacts] | None = None,
            driver: DriverFacts | None = None) -> tuple[SliceDevice, ...]:
    """The node's devices as its slices describe them, in the inventory's order."""
    defaults = defaults or Defaults()
    driver = driver or DriverFacts()
    facts = facts or {}
    names = device_names(inventory.devices)  # the names claims resolve (core/dra.py)
    groups = _nvlink_groups(inventory.devices)
    out = []
    for g in inventory.devices:
        if g.mig:  # a GPU in MIG mode is offered through its instances
            continue
        out.append(SliceDevice(
            name=names[g.uuid], uuid=g.uuid,
            attributes=_attributes(g, names, groups, facts.get(g.uuid, GpuFacts()), driver),
            capacity=_capacities(inventory, g, defaults),
            taints=() if g.healthy else (Taint(TAINT_UNHEALTHY),)))
    return tuple(out)


def _nvlink_groups(gpus: Sequence[Gpu]) -> dict[str, int]:
    """Per GPU with NVLink peers, the lowest index of its NVLink-connected group: one
    claim's requests land on linked GPUs with ``matchAttribute: gpu.vgpud.io/nvlinkGroup``."""
    by_uuid = {g.uuid: g for g in gpus if not g.parent}
    parent = {u: u for u in by_uuid}

    def root(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for g in by_uuid.values():
        for peer in g.links:
            if peer in by_uuid:
                parent[root(peer)] = root(g.uuid)
    linked = {u for g in by_uuid.values() for u in (g.uuid, *g.links) if u in by_uuid
              and g.links}
    lowest: dict[str, int] = {}
    for u in linked:
        r = root(u)
        lowest[r] = min(lowest.get(r, by_uuid[u].index), by_uuid[u].index)
    return {u: lowest[root(u)] for u in linked}


def _attributes(g: Gpu, names: Mapping[str, str], groups: Mapping[str, int], f: GpuFacts,
                driver: DriverFacts) -> tuple[tuple[str, Attribute | Version], ...]:
    attrs: list[tuple[str, Attribute | Version]] = [
        ("type", "mig" if g.parent else "gpu"),
        ("uuid", g.uuid),
        ("index", g.index),
        ("productName", g.model[:MAX_ATTRIBUTE_LENGTH]),
    ]
    if g.parent:
        attrs.append(("parentUUID", g.parent))
    if g.profile:
        attrs.append(("migProfile", g.profile))
    if g.numa >= 0:  # -1: unknown; the standard attribute must then be absent
        attrs.append((f"{STANDARD}numaNode", g.numa))
    bus = pci_bus_id(f.pci_bus_id)
    if bus:
        attrs.append((f"{STANDARD}pciBusID", bus))
    if f.multiprocessors > 0:
        attrs.append(("multiprocessors", f.multiprocessors))
    for name, text in (("cudaComputeCapability", f.compute_capability),
                       ("driverVersion", driver.driver_version),
                       ("cudaDriverVersion", driver.cuda_driver_version)):
        v = semver(text)
        if v is not None:
            attrs.append((name, v))
    if g.uuid in groups:
        attrs.append(("nvlinkGroup", groups[g.uuid]))
        peers = ",".join(sorted((names[p] for p in g.links if p in names),
                                key=lambda n: (len(n), n)))
        if peers and len(peers) <= MAX_ATTRIBUTE_LENGTH:
            attrs.append(("nvlinkPeers", peers))
    return tuple(attrs)


def _capacities(inventory: NodeInventory, g: Gpu,
                defaults: Defaults) -> tuple[tuple[str, Capacity], ...]:
    cap = inventory.capacity(g)
    memory = cap.memory * MIB
    cores_max = min(100, cap.cores)
    if g.profile:  # a MIG instance placed whole: a claim takes all of it
        mem_default, cores_default = memory, cores_max
    else:
        mem_default = min(defaults.default_mem, cap.memory) * MIB if defaults.default_mem > 0 \
            else memory
        cores_default = min(defaults.default_cores, cores_max)
    return (
        (CAPACITY_MEMORY, Capacity(memory, mem_default, MIB, memory,
                                   MIB if memory >= 2 * MIB else None)),
        (CAPACITY_CORES, Capacity(cap.cores, cores_default, 0, cores_max,
                                  1 if cap.cores >= 1 else None)),
        (CAPACITY_VGPUS, Capacity(cap.vgpus, 1, 1, 1, valid_values=(1,))),
    )


_BUS = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def pci_bus_id(text: str) -> str:
    """NVML's bus id (``00000000:3B:00.0``) in the standard attribute's form
    (``0000:3b:00.0``: a 4-digit domain, lower case); "" when it is not one."""
    m = _BUS.match(text.strip())
    if m is None or int(m[1], 16) > 0xFFFF:
        return ""
    return f"{int(m[1], 16):04x}:{m[2].lower()}:{m[3].lower()}.{m[4]}"


_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


def semver(text: str) -> Version | None:
    """A driver's version as a semantic version: ``535.104.05`` → ``535.104.5`` (no
    leading zeros), ``12.2`` → ``12.2.0``; None when it is not numeric."""
    m = _VERSION.match(text.strip())
    if m is None:
        return None
    return Version(".".join(str(int(p or 0)) for p in m.groups()))


# -- slices ----------------------------------------------------------------------------


def slice_name(node: str, i: int) -> str:
    """The name of the node's ``i``-th slice: ``<node>-gpu.vgpud.io-<i>``; a node name
    too long for that is cut and a digest of it added (a name is 253 characters)."""
    tail = f"-{DRIVER}-{i}"
    if len(node) + len(tail) <= 253:
        return node + tail
    h = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[:253 - len(tail) - 11].rstrip('.-')}-{h}{tail}"


def pool(node: str, devs: Sequence[SliceDevice], generation: int) -> tuple[ResourceSlice, ...]:
    """The node's pool at ``generation``: its devices in slices of at most
    :data:`MAX_DEVICES_PER_SLICE` (one slice, empty, when the node has no GPU, so
    the scheduler knows the pool and that it is empty)."""
    chunks = [tuple(devs[i:i + MAX_DEVICES_PER_SLICE])
              for i in range(0, len(devs), MAX_DEVICES_PER_SLICE)] or [()]
    return tuple(ResourceSlice(slice_name(node, i), node, generation, len(chunks), c)
                 for i, c in enumerate(chunks))


def content_digest(devs: Sequence[SliceDevice], count: int) -> str:
    body = json.dumps([count, [d.manifest() for d in devs]], sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def published(obj: Mapping[str, Any]) -> Published:
    """A slice as the API returned it (only what :func:`plan` compares)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    pool_ = spec.get("pool") or {}
    return Published(name=str(meta.get("name", "")),
                     generation=int(pool_.get("generation") or 0),
                     count=int(pool_.get("resourceSliceCount") or 0),
                     digest=str((meta.get("annotations") or {}).get(DIGEST, "")),
                     resource_version=str(meta.get("resourceVersion", "")))


def plan(node: str, devs: Sequence[SliceDevice], current: Sequence[Published]) -> Plan:
    """The writes that make ``current`` (this driver's slices of ``node``) the node's
    pool of ``devs``: nothing when it already is; else every slice at the next
    generation (updated where one of its name exists, created where none does) and
    the slices no longer wanted deleted."""
    want = pool(node, devs, 0)
    have = {p.name: p for p in current}
    generations = {p.generation for p in current}
    if (len(generations) == 1 and len(have) == len(want)
            and all(w.name in have and have[w.name].digest == w.digest for w in want)):
        return Plan()
    generation = max(generations, default=0) + 1
    creates, updates = [], []
    for w in pool(node, devs, generation):
        old = have.get(w.name)
        if old is None:
            creates.append(w)
        else:
            updates.append(ResourceSlice(w.name, w.node, w.generation, w.count, w.devices,
                                         old.resource_version))
    names = {w.name for w in want}
    deletes = tuple((p.name, p.resource_version) for p in current if p.name not in names)
    return Plan(tuple(creates), tuple(updates), deletes)


def _attribute(v: Attribute | Version) -> dict[str, Any]:
    if isinstance(v, Version):
        return {"version": v.text}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    return {"string": v}


def _capacity(c: Capacity) -> dict[str, Any]:
    policy: dict[str, Any] = {"default": str(c.default)}
    if c.valid_values:
        policy["validValues"] = [str(v) for v in c.valid_values]
    else:
        policy["validRange"] = {"min": str(c.min), "max": str(c.max),
                                **({"step": str(c.step)} if c.step else {})}
    return {"value": str(c.value), "requestPolicy": policy}
