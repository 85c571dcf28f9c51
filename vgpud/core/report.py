"""What the cluster's GPUs look like, as rows: the status page, its JSON API and
``vgpud inspect`` all read these, whether the ledger is the scheduler's own or one
``vgpud inspect`` rebuilt from the API server.

* :func:`gpu_rows` — every GPU: capacity, what is allocated, health, and its slices
  (which pod and container, how much memory and how many cores, at what priority);
* :func:`pod_rows` — every pod holding GPUs, with its grants per container;
* :func:`pending_reasons` — why a pod fits no node, grouped by reason (one line per
  *class* of nodes, as kube-scheduler's "0/N nodes are available" does).

Memory is in bytes here (the JSON API's unit, as the metrics'); cores in percent of
one GPU. Pure: values in, rows out; :func:`to_json` turns rows into plain dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vgpud.core.allocate import Allocator
from vgpud.core.cluster import Cluster
from vgpud.core.ledger import Entry, Ledger, State
from vgpud.core.model import PodRequest

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Slice:
    """One container's share of one GPU."""

    namespace: str
    pod: str
    container: str
    memory: int  # bytes
    cores: int  # percent of the GPU
    priority: int  # nvidia.com/vgpu-priority
    state: str  # assumed | confirmed


@dataclass(frozen=True, slots=True)
class GpuRow:
    node: str
    uuid: str
    index: int
    model: str
    healthy: bool
    mig: bool
    memory_capacity: int  # bytes (physical x scaling)
    memory_allocated: int  # bytes
    cores_capacity: int  # percent (100 x core scaling)
    cores_allocated: int
    vgpus_capacity: int
    vgpus_allocated: int
    slices: tuple[Slice, ...]
    profile: str = ""  # a MIG instance placed whole: its profile
    parent: str = ""  # a MIG instance: its GPU's uuid
    dra: bool = False  # a device of a DRA node (kube-scheduler's claims hold it)


@dataclass(frozen=True, slots=True)
class Grant:
    container: str
    uuid: str
    memory: int  # bytes
    cores: int
    init: bool = False


@dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    name: str
    uid: str
    node: str | None
    state: str  # confirmed | assumed | pending
    priority: int  # nvidia.com/vgpu-priority
    grants: tuple[Grant, ...] = ()
    reason: str | None = None  # why it fits no node, for a pending pod
    since: str | None = None  # RFC 3339: placed at, or first refused at


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


def gpu_rows(cluster: Cluster, ledger: Ledger, nodes: Iterable[str] | None = None,
             ) -> list[GpuRow]:
    """Every GPU of ``nodes`` (default: all, by name), in node then index order."""
    names = sorted(cluster.node_index) if nodes is None else list(nodes)
    out = []
    for name in names:
        if not cluster.has_node(name):
            continue
        slices: dict[str, list[Slice]] = {}
        for e in ledger.on_node(name):
            ns, pod = _split(e.key)
            for c in e.placement.containers:
                for d in c.devices:
                    slices.setdefault(d.uuid, []).append(Slice(
                        ns, pod, c.name, d.memory * MIB, d.cores, e.placement.priority,
                        e.state.value))
        for v in cluster.gpus(name):
            used = cluster.usage(name, v.gpu.uuid)
            out.append(GpuRow(
                node=name, uuid=v.gpu.uuid, index=v.gpu.index, model=v.gpu.model,
                healthy=v.gpu.healthy, mig=v.gpu.mig,
                memory_capacity=v.cap_memory * MIB, memory_allocated=used.memory * MIB,
                cores_capacity=v.cap_cores, cores_allocated=used.cores,
                vgpus_capacity=v.gpu.split, vgpus_allocated=used.vgpus,
                slices=tuple(sorted(slices.get(v.gpu.uuid, ()),
                                    key=lambda s: (s.namespace, s.pod, s.container))),
                profile=v.gpu.profile, parent=v.gpu.parent))
    return out


def pod_row(e: Entry) -> PodRow:
    ns, name = _split(e.key)
    grants = tuple(Grant(c.name, d.uuid, d.memory * MIB, d.cores, c.init)
                   for c in e.placement.containers for d in c.devices)
    return PodRow(ns, name, e.uid, e.placement.node,
                  "confirmed" if e.state is State.CONFIRMED else "assumed",
                  e.placement.priority, grants, since=e.placement.time or None)


def pod_rows(ledger: Ledger) -> list[PodRow]:
    """Every pod the ledger holds GPUs for, by namespace and name."""
    return sorted((pod_row(e) for e in ledger.entries()), key=lambda r: (r.namespace, r.name))


def pending_reasons(alloc: Allocator, pod: PodRequest,
                    nodes: Sequence[str] | None = None) -> list[tuple[int, str, bool]]:
    """Why ``pod`` fits none of ``nodes`` (default: every node with an inventory), as
    (how many nodes, the reason, resolvable), most nodes first. Empty: it fits
    somewhere."""
    got = alloc.filter(pod, nodes)
    if got.feasible:
        return []
    counts: dict[tuple[str, bool], int] = {}
    for r in got.failed.values():
        counts[(r.message, r.resolvable)] = counts.get((r.message, r.resolvable), 0) + 1
    return sorted(((n, msg, res) for (msg, res), n in counts.items()),
                  key=lambda t: (-t[0], t[1]))


def to_json(row: GpuRow | PodRow | Slice | Grant) -> dict[str, Any]:
    """A row as plain JSON-ready values (camelCase keys, like the annotations')."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(row):
        v = getattr(row, f.name)
        key = "".join(p.capitalize() if i else p for i, p in enumerate(f.name.split("_")))
        if isinstance(v, tuple):
            v = [to_json(x) for x in v]
        out[key] = v
    return out
