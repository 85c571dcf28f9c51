"""The nodes vgpud's DRA driver serves, as ``vgpud inspect`` shows them: their GPUs from
the driver's ResourceSlices, and what the allocated ResourceClaims hold of each, in the
rows the device-plugin nodes get (:mod:`vgpud.core.report`). Pure: no I/O, no async.

A DRA node's ledger is the API's, not the scheduler's: kube-scheduler allocates the
claims (``status.allocation``), and the kubelet prepares them on the node. So a GPU's
memory, cores and vGPUs allocated are the sums of the ``consumedCapacity`` of the results
naming it (a result without them holds the whole device, as :func:`vgpud.core.claims.grant_of`
grants it), and its slices are the pods each claim is reserved for (``status.reservedFor``;
a claim allocated but reserved for no pod yet shows under its own name). Only the newest
generation of each pool counts, as the scheduler's allocator reads them. What cannot be
read (a result naming a device no slice publishes, a capacity that is not a quantity) is
said in :attr:`DraRows.warnings`, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpud.core.dra import CAPACITY_CORES, CAPACITY_MEMORY, DRIVER
from vgpud.core.report import GpuRow, Grant, PodRow, Slice
from vgpud.core.requests import RequestError, parse_quantity
from vgpud.core.slices import CAPACITY_VGPUS, TAINT_UNHEALTHY

ALLOCATED = "allocated"  # a slice of a claim no pod is reserved for (yet)
RESERVED = "reserved"  # a slice of a pod the claim is reserved for


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a published pool: a GPU or a MIG instance of a DRA node."""

    node: str
    pool: str
    name: str  # gpu-N, gpu-N-mig-GI-CI
    uuid: str
    index: int
    model: str
    healthy: bool
    memory: int  # bytes
    cores: int  # percent
    vgpus: int
    parent: str = ""
    profile: str = ""


@dataclass
class DraRows:
    gpus: list[GpuRow] = field(default_factory=list)
    pods: list[PodRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _attr(attrs: Mapping[str, Any], key: str) -> Any:
    v = attrs.get(key) or attrs.get(f"{DRIVER}/{key}")
    if not isinstance(v, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in v:
            return v[kind]
    return None


def _quantity(value: Any, what: str, warnings: list[str]) -> int | None:
    try:
        return parse_quantity(value, what)
    except RequestError as e:
        warnings.append(str(e))
        return None


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


def published_devices(slices: Iterable[Mapping[str, Any]], warnings: list[str],
                      ) -> list[Device]:
    """The devices of vgpud's driver in ``slices`` (any drivers'), newest generation of
    each pool only, in node then index order."""
    newest: dict[str, int] = {}
    ours = []
    for s in slices:
        spec = _dict(s.get("spec"))
        if spec.get("driver") != DRIVER:
            continue
        pool = _dict(spec.get("pool"))
        name = str(pool.get("name", ""))
        generation = int(pool.get("generation") or 0)
        newest[name] = max(newest.get(name, generation), generation)
        ours.append((name, generation, spec))
    out = []
    for pool_name, generation, spec in ours:
        if generation != newest[pool_name]:
            continue
        node = str(spec.get("nodeName") or pool_name)
        for d in _items(spec.get("devices")):
            name = str(d.get("name", ""))
            attrs = _dict(d.get("attributes"))
            cap = _dict(d.get("capacity"))
            where = f"ResourceSlice device {pool_name}/{name}"
            size = [_quantity(_dict(cap.get(k)).get("value", 0), f"{where}: capacity {k}",
                              warnings) for k in (CAPACITY_MEMORY, CAPACITY_CORES,
                                                  CAPACITY_VGPUS)]
            index = _attr(attrs, "index")
            out.append(Device(
                node=node, pool=pool_name, name=name, uuid=str(_attr(attrs, "uuid") or name),
                index=index if isinstance(index, int) else -1,
                model=str(_attr(attrs, "productName") or ""),
                healthy=not any(_dict(t).get("key") == TAINT_UNHEALTHY
                                for t in _items(d.get("taints"))),
                memory=size[0] or 0, cores=size[1] or 0, vgpus=size[2] or 0,
                parent=str(_attr(attrs, "parentUUID") or ""),
                profile=str(_attr(attrs, "migProfile") or "")))
    return sorted(out, key=lambda d: (d.node, d.index, d.name))


@dataclass
class _Use:
    memory: int = 0
    cores: int = 0
    vgpus: int = 0
    slices: list[Slice] = field(default_factory=list)


def slice_projection(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What :func:`dra_rows` reads of a ResourceSlice (for an informer to hold): its spec
    when it is vgpud's driver's, nothing of any other driver's."""
    spec = _dict(obj.get("spec"))
    return {"spec": spec} if spec.get("driver") == DRIVER else {}


def claim_projection(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What :func:`dra_rows` reads of a ResourceClaim: its name, the results of its
    allocation on vgpud's driver's devices and whom it is reserved for; nothing of a claim
    that holds none of them."""
    status = _dict(obj.get("status"))
    results = [r for r in _items(_dict(_dict(status.get("allocation")).get("devices"))
                                 .get("results")) if r.get("driver") == DRIVER]
    if not results:
        return {}
    meta = _dict(obj.get("metadata"))
    return {"metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", "")},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": status.get("reservedFor") or []}}


def dra_rows(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
             ) -> DraRows:
    """The GPU rows of the DRA nodes and the rows of the pods their claims are reserved
    for."""
    rows = DraRows()
    devs = published_devices(slices, rows.warnings)
    by_id = {(d.pool, d.name): d for d in devs}
    use: dict[tuple[str, str], _Use] = {}
    grants: dict[tuple[str, str], tuple[str, str, list[Grant]]] = {}  # pod -> uid, node
    for c in claims:
        meta = _dict(c.get("metadata"))
        ns, claim = str(meta.get("namespace", "")), str(meta.get("name", ""))
        status = _dict(c.get("status"))
        results = _items(_dict(_dict(status.get("allocation")).get("devices")).get("results"))
        pods = [(str(r.get("name", "")), str(r.get("uid", "")))
                for r in _items(status.get("reservedFor"))
                if r.get("resource") == "pods" and not r.get("apiGroup")]
        for r in results:
            if r.get("driver") != DRIVER:
                continue
            key = (str(r.get("pool", "")), str(r.get("device", "")))
            request = str(r.get("request", ""))
            d = by_id.get(key)
            if d is None:
                rows.warnings.append(
                    f"ResourceClaim {ns}/{claim}: request {request!r} holds device "
                    f"{key[0]}/{key[1]}, which no ResourceSlice of {DRIVER} publishes "
                    "(its node's driver is gone, or the device was removed)")
                continue
            consumed = _dict(r.get("consumedCapacity"))
            where = f"ResourceClaim {ns}/{claim}: consumedCapacity"
            memory = (d.memory if CAPACITY_MEMORY not in consumed else
                      _quantity(consumed[CAPACITY_MEMORY], f"{where} {CAPACITY_MEMORY}",
                                rows.warnings) or 0)
            cores = (100 if CAPACITY_CORES not in consumed else
                     _quantity(consumed[CAPACITY_CORES], f"{where} {CAPACITY_CORES}",
                               rows.warnings) or 0)
            u = use.setdefault(key, _Use())
            u.memory += memory
            u.cores += cores
            u.vgpus += 1
            part = f"{claim}/{request}"
            holders = pods or [(f"(claim {claim})", "")]
            for pod, _uid in holders:
                u.slices.append(Slice(ns, pod, part, memory, cores, 0,
                                      RESERVED if pods else ALLOCATED))
            for pod, uid in pods:
                g = grants.setdefault((ns, pod), (uid, d.node, []))
                g[2].append(Grant(part, d.uuid, memory, cores))
    for d in devs:
        u = use.get((d.pool, d.name), _Use())
        rows.gpus.append(GpuRow(
            node=d.node, uuid=d.uuid, index=d.index, model=d.model, healthy=d.healthy,
            mig=False, memory_capacity=d.memory, memory_allocated=u.memory,
            cores_capacity=d.cores, cores_allocated=u.cores,
            vgpus_capacity=d.vgpus, vgpus_allocated=u.vgpus,
            slices=tuple(sorted(u.slices, key=lambda s: (s.namespace, s.pod, s.container))),
            profile=d.profile, parent=d.parent, dra=True))
    rows.pods = sorted((PodRow(ns, pod, uid, node, "confirmed", 0, tuple(gs))
                        for (ns, pod), (uid, node, gs) in grants.items()),
                       key=lambda r: (r.namespace, r.name))
    return rows
