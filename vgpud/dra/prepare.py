"""Preparing and unpreparing claims: the DRA adapter's shell over the node's pieces.

:meth:`Preparer.prepare` reads the claim kubelet names from the API (one GET; the uid
must match), lets :func:`vgpud.core.claims.grant_of` decide what it grants on this node,
and then writes what the device plugin writes for a container: the limits file
(:func:`vgpud.core.limits.limits_for`, rendered into the node's allocation store under the
allocation key of the claim's uid and the driver's name) with its registration socket,
plus a CDI spec (:mod:`vgpud.dra.cdi`) that gives a container the claim's GPUs (the
vendor backend's edits for each device: for a MIG instance its GPU's device node and the
instance's own access devices, as the device plugin gives one), the shim, the limits
directory (read-only), the state directory and the priority records. A device the claim
names that is no longer found on the node (a GPU off the bus, a MIG instance destroyed,
kept in the inventory, unhealthy, until the runtime drops it) is refused. Every
container that uses the claim gets the same directories: they share its limits, as the
processes of one container do.

What was prepared is kept in a checkpoint file (``<state-dir>/dra/checkpoint.json``,
replaced atomically after each change), so preparing a claim twice gives the same answer
without a second API read, and a restarted plugin answers kubelet's ``NodeUnprepareResources``
for claims its predecessor prepared (the allocation directories and their registration
sockets come back with the node runtime, :func:`vgpud.node.runtime.run_node`).
:meth:`Preparer.unprepare` removes the spec, the allocation and the entry; a claim it
does not know is already unprepared.

Failures are :class:`PrepareFailed`, one claim at a time, with a message kubelet shows on
the pod; nothing about one claim stops another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from vgpud.core.claims import ClaimError, ClaimGrant, Share, device_status, grant_of
from vgpud.core.dra import DRIVER
from vgpud.core.limits import GrantError, LimitsError, limits_for, render
from vgpud.core.model import ComputePolicy
from vgpud.dra import cdi
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import KubeError, NotFound
from vgpud.kube.resources import RESOURCECLAIMS
from vgpud.kube.timestamps import rfc3339
from vgpud.kube.writes import RetryPolicy
from vgpud.node import edits
from vgpud.node.allocations import Allocation, AllocationOwner, AllocationStore, write_atomic
from vgpud.node.devices import DeviceInfo, NodeDevices
from vgpud.node.runtime import Registrar, open_registration
from vgpud.node.shim import ShimFiles
from vgpud.node.vendors import Backend

log = structlog.get_logger(__name__)

CHECKPOINT_VERSION = 1
STATUS_MANAGER = "vgpud-dra"  # the field manager of the claims' status.devices it writes


class PrepareFailed(Exception):
    """One claim cannot be prepared (or unprepared); ``str()`` is what kubelet shows."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it."""

    namespace: str
    name: str
    uid: str

    @property
    def where(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as kubelet is told about it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    claim: ClaimRef
    key: str  # the allocation's key in the node's store
    devices: tuple[PreparedDevice, ...]


class ClaimReader(Protocol):
    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ResourceClaim (None: it does not exist); raises ``KubeError``."""
        ...

    async def apply_status(self, ref: ClaimRef, devices: list[dict[str, Any]]) -> None:
        """Make ``devices`` this driver's entries of the claim's ``status.devices``;
        raises ``KubeError``."""
        ...


class KubeClaims:
    """:class:`ClaimReader` over :class:`~vgpud.kube.client.KubeClient`, with the retry
    policy the node's other reads use."""

    def __init__(self, kube: KubeClient, *, retry: RetryPolicy | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.kube = kube
        self.retry = retry or RetryPolicy()
        self.clock = clock

    async def get_claim(self, namespace: str, name: str) -> Json | None:
        try:
            return await self.retry.run(
                lambda: self.kube.request("GET", RESOURCECLAIMS.object_path(name, namespace)),
                clock=self.clock, what="read_resourceclaim")
        except NotFound:
            return None

    async def apply_status(self, ref: ClaimRef, devices: list[dict[str, Any]]) -> None:
        """Server-side apply of ``status.devices`` (KEP-4817) as the driver's field manager:
        its entries only, whoever wrote the rest; the claim's uid a precondition. The API
        server lets a node's driver write the devices of its own node only
        (``resourceclaims/driver``, ``associated-node:patch``)."""
        body = {"apiVersion": RESOURCECLAIMS.api_version,
                "kind": RESOURCECLAIMS.kind,
                "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
                "status": {"devices": devices}}
        await self.retry.run(
            lambda: self.kube.request(
                "PATCH", RESOURCECLAIMS.object_path(ref.name, ref.namespace) + "/status",
                query={"fieldManager": STATUS_MANAGER, "force": "true"}, body=body,
                content_type="application/apply-patch+yaml"),
            clock=self.clock, what="apply_resourceclaim_status")


# -- the checkpoint --------------------------------------------------------------------------

def encode_checkpoint(prepared: Mapping[str, Prepared]) -> str:
    claims = {uid: {"namespace": p.claim.namespace, "name": p.claim.name, "key": p.key,
                    "devices": [{"requests": list(d.requests), "pool": d.pool,
                                 "device": d.device, "cdi": list(d.cdi_ids),
                                 "shareID": d.share_id} for d in p.devices]}
              for uid, p in prepared.items()}
    return json.dumps({"v": CHECKPOINT_VERSION, "claims": claims}, indent=1,
                      sort_keys=True) + "\n"


def decode_checkpoint(text: str) -> dict[str, Prepared]:
    """The checkpoint's claims; ``ValueError`` names what is wrong with it."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("v") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {doc.get('v') if isinstance(doc, dict) else '?'}"
                         f" is not {CHECKPOINT_VERSION}")
    out = {}
    try:
        for uid, c in (doc.get("claims") or {}).items():
            out[uid] = Prepared(
                ClaimRef(str(c["namespace"]), str(c["name"]), str(uid)), str(c["key"]),
                tuple(PreparedDevice(tuple(str(r) for r in d["requests"]), str(d["pool"]),
                                     str(d["device"]), tuple(str(i) for i in d["cdi"]),
                                     None if d.get("shareID") is None else str(d["shareID"]))
                      for d in c["devices"]))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"checkpoint entry malformed: {e!r}") from None
    return out


class Checkpoint:
    """The prepared claims on disk (blocking I/O: call through ``anyio.to_thread``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Prepared]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        return decode_checkpoint(text)

    def save(self, prepared: Mapping[str, Prepared]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, encode_checkpoint(prepared), 0o600)


# -- prepare and unprepare -------------------------------------------------------------------

class Preparer:
    def __init__(
        self,
        *,
        node: str,
        devices: NodeDevices,
        store: AllocationStore,
        gpus: Backend,
        claims: ClaimReader,
        cdi_dir: Path,
        checkpoint: Path,
        registrar: Registrar | None = None,
        shim: ShimFiles | None = None,
        arbiter: Path | None = None,
        policy: ComputePolicy = ComputePolicy.FIXED,
        driver: str = DRIVER,
        clock: Clock = SYSTEM_CLOCK,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None,
    ) -> None:
        """``spawn`` runs the claims' status writes beside kubelet's call, not in its
        path (a task group's ``start_soon``); without it they are awaited."""
        self.node = node
        self.devices = devices
        self.store = store
        self.gpus = gpus
        self.claims = claims
        self.cdi_dir = cdi_dir
        self.checkpoint = Checkpoint(checkpoint)
        self.registrar = registrar
        self.shim = shim
        self.arbiter = arbiter
        self.policy = policy
        self.driver = driver
        self.clock = clock
        self.spawn = spawn
        self.prepared: dict[str, Prepared] = {}
        self._lock = anyio.Lock()  # one change of the checkpoint at a time

    async def load(self) -> None:
        """Read the checkpoint (after a restart: what the plugin before this one prepared)."""
        try:
            self.prepared = await anyio.to_thread.run_sync(self.checkpoint.load)
        except (OSError, ValueError) as e:
            # the allocations stay on disk and in kubelet's own checkpoint; an unprepare
            # of a claim not found here still removes its files (by its uid)
            log.error("dra_checkpoint_unreadable", path=str(self.checkpoint.path), error=str(e))
            self.prepared = {}
        log.info("dra_claims_restored", claims=len(self.prepared))

    def key(self, uid: str) -> str:
        return self.store.path((uid,), self.driver).name

    async def prepare(self, ref: ClaimRef) -> Prepared:
        async with self._lock:
            done = self.prepared.get(ref.uid)
            if done is not None:  # kubelet asks again (its retry, its restart): same answer
                return done
            grant = await self._grant(ref)
            alloc = await self._configure(ref, grant)
            prepared = Prepared(ref, alloc.key, tuple(
                PreparedDevice((s.request,), s.pool, s.device,
                               (cdi.device_id(f"{ref.uid}-{s.device}"),), s.share_id)
                for s in grant.shares))
            try:
                await anyio.to_thread.run_sync(
                    cdi.write, self.cdi_dir, ref.uid, self._cdi_devices(ref, grant, alloc))
                await anyio.to_thread.run_sync(self.checkpoint.save,
                                               {**self.prepared, ref.uid: prepared})
            except OSError as e:
                raise PrepareFailed(f"{ref.where}: cannot write its CDI spec or the "
                                    f"checkpoint: {e.strerror or e}") from None
            self.prepared[ref.uid] = prepared
        log.info("dra_prepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                 key=alloc.key, devices=[(s.device, s.memory, s.cores) for s in grant.shares])
        devices = device_status(grant, self.devices.inventory(), driver=self.driver,
                                now=rfc3339(self.clock.wall()))

        async def report() -> None:
            """The claim's device status: what it was given, for ``kubectl describe`` and
            the pod's owner. Informational: a failure to write it is logged, the claim
            stays prepared (kubelet's retry would not prepare it again: the checkpoint
            answers)."""
            try:
                await self.claims.apply_status(ref, devices)
            except KubeError as e:
                log.warning("dra_status_unwritten", claim=f"{ref.namespace}/{ref.name}",
                            uid=ref.uid, error=str(e))

        if self.spawn is not None:
            self.spawn(report)
        else:
            await report()
        return prepared

    async def _grant(self, ref: ClaimRef) -> ClaimGrant:
        try:
            claim = await self.claims.get_claim(ref.namespace, ref.name)
        except KubeError as e:
            raise PrepareFailed(f"{ref.where}: cannot read it: {e}") from None
        if claim is None:
            raise PrepareFailed(f"{ref.where} no longer exists")
        try:
            grant = grant_of(claim, namespace=ref.namespace, name=ref.name, uid=ref.uid,
                             node=self.node, inventory=self.devices.inventory(),
                             driver=self.driver)
        except ClaimError as e:
            raise PrepareFailed(str(e)) from None
        for s in grant.shares:
            self._found(ref, s)
        return grant

    def _found(self, ref: ClaimRef, share: Share) -> DeviceInfo:
        """The device of ``share``, which must still be on the node: one no longer found
        (a GPU off the bus, a MIG instance destroyed) keeps its name, unhealthy, for a
        while after, but a container given it would get nothing."""
        info = self.devices.info(share.uuid)
        if info is None or not self.devices.found(share.uuid):
            what = (f"MIG instance {share.uuid}" if info is not None and info.gpu.parent
                    else f"GPU {share.uuid}")
            raise PrepareFailed(
                f"{ref.where}: device {share.device} ({what}) is no longer found on node "
                f"{self.node} (removed, off the bus, or its GPU's MIG layout changed since "
                "the claim was allocated)")
        return info

    async def _configure(self, ref: ClaimRef, grant: ClaimGrant) -> Allocation:
        inventory = self.devices.inventory()
        container = grant.container_grant(inventory)
        pod = grant.pods[0] if grant.pods else None
        owner = AllocationOwner(ref.namespace, pod.name if pod else "", container.name,
                                pod.uid if pod else "")
        try:
            limits = limits_for(container, inventory, compute_policy=self.policy, priority=0,
                                state_dir=edits.STATE_DIR,
                                register=edits.REGISTER if self.registrar is not None else "",
                                arbiter_dir=edits.ARBITER_DIR if self.arbiter is not None
                                else "")
            text = render(limits)
        except (GrantError, LimitsError) as e:
            raise PrepareFailed(f"{ref.where}: {e}") from None
        try:
            alloc = await anyio.to_thread.run_sync(
                lambda: self.store.configure((ref.uid,), owner, text, container.devices,
                                             self.driver, limits.priority,
                                             self.policy.value))
        except OSError as e:
            raise PrepareFailed(f"{ref.where}: cannot write the limits file: "
                                f"{e.strerror or e}") from None
        await open_registration(self.registrar, alloc)
        return alloc

    def _cdi_devices(self, ref: ClaimRef, grant: ClaimGrant,
                     alloc: Allocation) -> dict[str, edits.ContainerEdits]:
        common = edits.shim(self.shim) + edits.allocation_dirs(alloc, self.arbiter)
        out: dict[str, edits.ContainerEdits] = {}
        for s in grant.shares:  # a MIG instance: its GPU's node and its access devices
            gpu = self.gpus.gpu_edits([self._found(ref, s)], "device-specs")
            out.setdefault(f"{grant.uid}-{s.device}", gpu + common)
        return out

    async def unprepare(self, ref: ClaimRef) -> None:
        async with self._lock:
            key = self.key(ref.uid)
            if self.registrar is not None:
                self.registrar.close(key)
            rest = {uid: p for uid, p in self.prepared.items() if uid != ref.uid}
            try:
                await anyio.to_thread.run_sync(cdi.remove, self.cdi_dir, ref.uid)
                await anyio.to_thread.run_sync(self.store.remove, key)
                if ref.uid in self.prepared:
                    await anyio.to_thread.run_sync(self.checkpoint.save, rest)
            except OSError as e:
                raise PrepareFailed(f"{ref.where}: cannot remove its files: "
                                    f"{e.strerror or e}") from None
            known = ref.uid in self.prepared
            self.prepared = rest
        log.info("dra_unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                 known=known)
