"""A ResourceClaim, as vgpud's DRA kubelet plugin prepares it: what this node grants.
Pure: no I/O, no async.

kubelet's ``NodePrepareResources`` names a claim (namespace, name, uid); the plugin reads
it from the API and :func:`grant_of` decides, from the claim's ``status.allocation``
alone, what it grants here: for each of this node's devices that the allocation's results
of vgpud's driver (:data:`vgpud.core.dra.DRIVER`) name, the device memory and the SM share
the results consumed (``consumedCapacity`` ``memory`` in bytes and ``cores`` in percent,
:mod:`vgpud.core.dra`; a result without them holds the whole device). A device is a GPU or
a MIG instance, named as the node's ResourceSlices name it: the name is resolved by
:func:`vgpud.core.dra.device_of`, the inverse of the slices' own naming, so a MIG instance
(``gpu-0-mig-1``) is granted as the device plugin grants one: its uuid, all of its memory
unless the claim consumed less, and the cores the claim consumed. Several results on one
GPU (two requests, say) add up. The result is a :class:`ClaimGrant`, a value the node turns
into the same limits file the device plugin writes (:func:`vgpud.core.limits.limits_for`
of :meth:`ClaimGrant.container_grant`).

A claim that cannot be prepared here raises :class:`ClaimError` with a message a person
understands (kubelet shows it on the pod): not allocated, allocated for another node, a
device this node does not have, another claim under the same name (uid), no result of
vgpud's driver, capacities that are not whole numbers or exceed the device. A name the node
does not have says which: not a name of this driver, a GPU in MIG mode named whole, a MIG
instance that is gone (the GPU's MIG layout changed since the claim was allocated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpud.core.dra import CAPACITY_CORES, CAPACITY_MEMORY, DRIVER, DeviceNameError, device_of
from vgpud.core.model import ContainerGrant, DeviceGrant, NodeInventory
from vgpud.core.requests import RequestError, parse_quantity

MIB = 1 << 20
NODE_NAME_FIELD = "metadata.name"


class ClaimError(ValueError):
    """The claim cannot be prepared on this node; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Share:
    """One allocation result of vgpud's driver: a share of one GPU for one request."""

    request: str
    pool: str
    device: str  # the ResourceSlice device name: gpu-<index>, gpu-<index>-mig-<gi>-<ci>
    uuid: str  # the GPU's or the MIG instance's
    memory: int  # MiB
    cores: int  # percent of the GPU's SMs, 0-100; 0: no SM limit (the slices' policy)
    share_id: str | None  # the allocation's shareID (consumable capacity), if any


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod the claim is reserved for (``status.reservedFor``)."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ClaimGrant:
    """What a prepared claim grants on this node."""

    namespace: str
    name: str
    uid: str
    shares: tuple[Share, ...]  # in the allocation's order
    pods: tuple[PodRef, ...] = ()

    @property
    def where(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"

    def devices(self, inventory: NodeInventory) -> tuple[DeviceGrant, ...]:
        """One grant per GPU, in the node's index order: the shares on it added up (cores
        at most 100; a share with no SM limit, 0, leaves the GPU's without one)."""
        index = {g.uuid: g.index for g in inventory.devices}
        memory: dict[str, int] = {}
        cores: dict[str, int] = {}
        for s in self.shares:
            memory[s.uuid] = memory.get(s.uuid, 0) + s.memory
            before = cores.get(s.uuid)
            cores[s.uuid] = 0 if s.cores == 0 or before == 0 else min(
                100, (before or 0) + s.cores)
        return tuple(DeviceGrant(u, memory[u], cores[u])
                     for u in sorted(memory, key=lambda u: index.get(u, 1 << 30)))

    def container_grant(self, inventory: NodeInventory) -> ContainerGrant:
        """The claim as one container's grant: every container that uses the claim shares
        its limits (one limits file, one usage state)."""
        return ContainerGrant(name=f"claim:{self.name}", init=False,
                              devices=self.devices(inventory))


def _obj(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{what} is not an object")
    return value


def _list(value: object, what: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClaimError(f"{what} is not a list")
    return value


def allocated_nodes(selector: Mapping[str, Any]) -> set[str] | None:
    """The node names an allocation's ``nodeSelector`` pins it to (``matchFields``
    ``metadata.name In [...]``); None when it names no node by name."""
    names: set[str] = set()
    pinned = False
    for term in _list(selector.get("nodeSelectorTerms"), "nodeSelector.nodeSelectorTerms"):
        for field in _list(_obj(term, "a node selector term").get("matchFields"),
                           "matchFields"):
            f = _obj(field, "a matchFields entry")
            if f.get("key") == NODE_NAME_FIELD and f.get("operator") == "In":
                pinned = True
                names.update(str(v) for v in _list(f.get("values"), "values"))
    return names if pinned else None


def _capacity(consumed: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in consumed:
        return None
    try:
        return parse_quantity(consumed[key], f"{where} consumedCapacity {key}")
    except RequestError as e:
        raise ClaimError(str(e)) from None


def grant_of(claim: Mapping[str, Any], *, namespace: str, name: str, uid: str, node: str,
             inventory: NodeInventory, driver: str = DRIVER) -> ClaimGrant:
    """What ``claim`` (the API object kubelet named by ``namespace``, ``name`` and ``uid``)
    grants on ``node``, whose GPUs are ``inventory``. Raises :class:`ClaimError`."""
    where = f"ResourceClaim {namespace}/{name}"
    meta = _obj(claim.get("metadata"), f"{where}: metadata")
    got_uid = str(meta.get("uid", ""))
    if got_uid != uid:
        raise ClaimError(f"{where} has uid {got_uid or '(none)'}, kubelet asked for {uid}: "
                         "the claim was deleted and created again under the same name")
    status = _obj(claim.get("status"), f"{where}: status")
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated (no status.allocation)")
    allocation = _obj(allocation, f"{where}: status.allocation")
    selector = allocation.get("nodeSelector")
    if selector:
        nodes = allocated_nodes(_obj(selector, f"{where}: status.allocation.nodeSelector"))
        if nodes is not None and node not in nodes:
            raise ClaimError(f"{where} is allocated on node {', '.join(sorted(nodes))}, "
                             f"not on {node}")
    results = _list(_obj(allocation.get("devices"), f"{where}: allocation.devices")
                    .get("results"), f"{where}: allocation.devices.results")
    shares: list[Share] = []
    for i, raw in enumerate(results):
        r = _obj(raw, f"{where}: result {i}")
        if r.get("driver") != driver:
            continue
        device = str(r.get("device", ""))
        at = f"{where}: request {r.get('request', '')!r} device {device!r}"
        try:
            gpu = device_of(inventory.devices, device)
        except DeviceNameError as e:
            raise ClaimError(f"{at}: node {node} {e}") from None
        consumed = _obj(r.get("consumedCapacity"), f"{at}: consumedCapacity")
        whole = inventory.capacity(gpu)
        memory_bytes = _capacity(consumed, CAPACITY_MEMORY, at)
        memory = whole.memory if memory_bytes is None else memory_bytes // MIB
        cores = _capacity(consumed, CAPACITY_CORES, at)
        cores = 100 if cores is None else cores
        if memory_bytes is not None and memory_bytes < MIB:
            raise ClaimError(f"{at}: consumes {memory_bytes} bytes of memory, less than 1 MiB")
        if memory > whole.memory:
            what = "MIG instance's" if gpu.parent else "GPU's"
            raise ClaimError(f"{at}: consumes {memory} MiB of memory, more than the {what} "
                             f"{whole.memory} MiB")
        if not 0 <= cores <= 100:  # 0: the policy's default of defaultCores 0, no SM limit
            raise ClaimError(f"{at}: consumes {cores} % of the cores, not 0-100")
        share_id = r.get("shareID")
        shares.append(Share(request=str(r.get("request", "")), pool=str(r.get("pool", "")),
                            device=device, uuid=gpu.uuid, memory=memory, cores=cores,
                            share_id=None if share_id is None else str(share_id)))
    if not shares:
        raise ClaimError(f"{where} has no device of driver {driver} in its allocation")
    pods = tuple(PodRef(str(ref.get("name", "")), str(ref.get("uid", "")))
                 for ref in (_obj(x, f"{where}: reservedFor entry")
                             for x in _list(status.get("reservedFor"), f"{where}: reservedFor"))
                 if ref.get("resource") == "pods" and not ref.get("apiGroup"))
    return ClaimGrant(namespace=namespace, name=name, uid=uid, shares=tuple(shares), pods=pods)


def device_status(grant: ClaimGrant, inventory: NodeInventory, *, driver: str = DRIVER,
                  now: str) -> list[dict[str, Any]]:
    """The claim's ``status.devices`` entries of this driver once it is prepared (KEP-4817):
    per share, its device's identity (uuid, index, model; a MIG instance's GPU and profile)
    and the limits its containers are held to, with a ``Ready`` condition dated ``now``
    (RFC 3339). Keyed as the API keys them: driver, pool, device and shareID."""
    gpus = {g.uuid: g for g in inventory.devices}
    out = []
    for s in grant.shares:
        g = gpus.get(s.uuid)
        data: dict[str, Any] = {"uuid": s.uuid, "memoryLimitBytes": s.memory * MIB,
                                "coreLimitPercent": s.cores}
        if g is not None:
            data |= {"index": g.index, "model": g.model}
            if g.parent:
                data |= {"parentUUID": g.parent, "migProfile": g.profile}
        cores = f"{s.cores} % of its SMs" if s.cores else "no SM limit"
        entry: dict[str, Any] = {
            "driver": driver, "pool": s.pool, "device": s.device,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Prepared",
                "message": (f"prepared: held to {s.memory} MiB of device memory and "
                            f"{cores} by vgpud's shim"),
                "lastTransitionTime": now}],
            "data": data}
        if s.share_id:
            entry["shareID"] = s.share_id
        out.append(entry)
    return out
