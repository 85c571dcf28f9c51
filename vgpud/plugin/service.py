"""The DevicePlugin gRPC service kubelet calls (grpclib, ``v1beta1.DevicePlugin``).

- **ListAndWatch** streams every replica (``<uuid>::<i>``) with its health and NUMA
  node, and again whenever :class:`~vgpud.plugin.devices.NodeDevices` changes.
- **GetPreferredAllocation** steers kubelet to the GPUs the scheduler assigned to
  the pod kubelet is admitting (the pod whose containers PodResources lists without
  devices yet). It is only a hint; PreStartContainer checks what kubelet really did.
- **Allocate** knows only the IDs. It prepares the allocation's directory and returns
  the visible devices, the shim library, ``/etc/ld.so.preload``, the read-only
  config directory (``/etc/vgpud``) and the writable state directory. The response is
  composed from the small ``_with_*`` functions below.
- **PreStartContainer** (``pre_start_required``) learns the owner from PodResources,
  reads its ``vgpud.io/assignment``, reconciles kubelet's choice
  (:func:`vgpud.plugin.replicas.reconcile`), and writes the limits file atomically.
  Any problem fails that one container with a message kubelet shows on the pod.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import structlog
from grpclib import GRPCError
from grpclib.const import Status

from vgpud.core.codec import ASSIGNMENT, CodecError, decode_assignment, encode_assignment
from vgpud.core.container import GrantError, render_shim_config
from vgpud.core.model import DeviceGrant, Placement, Reason
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.allocations import Allocation, AllocationStore, Owner
from vgpud.plugin.cluster import ClusterApi, ClusterError, PodView
from vgpud.plugin.devices import NodeDevices
from vgpud.plugin.podresources import Held, PodResourcesClient, PodResourcesError, find_owner
from vgpud.plugin.replicas import (
    ReplicaIdError,
    advertised,
    gpus_of,
    held_by,
    preferred,
    reconcile,
)
from vgpud.plugin.shim import ShimFiles

log = structlog.get_logger(__name__)

RESOURCE = "nvidia.com/vgpu-number"
CONFIG_DIR = "/etc/vgpud"
STATE_DIR = "/var/run/vgpud"
PRELOAD = "/etc/ld.so.preload"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
FAILED_REASON = "VgpuAllocationFailed"


class AllocationFailed(Exception):
    """A container cannot get its vGPUs; ``str()`` is what kubelet shows on the pod."""

    def __init__(self, message: str, pod: PodView | None = None) -> None:
        super().__init__(message)
        self.pod = pod


@dataclass(frozen=True, slots=True)
class Granted:
    """A configured container: who, which IDs, and its limits (for metrics)."""

    key: str
    owner: Owner
    devices: tuple[DeviceGrant, ...]
    configured: float


# -- composing the Allocate response ---------------------------------------------------------

def _with_visible(r: pb.ContainerAllocateResponse, uuids: list[str], minors: list[int],
                  mode: str) -> None:
    if mode == "env":
        r.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    elif mode == "cdi":
        r.cdi_devices.extend(pb.CdiDevice(name=f"nvidia.com/gpu={u}") for u in uuids)
    else:
        for path in [f"/dev/nvidia{m}" for m in minors] + list(CONTROL_DEVICES):
            r.devices.append(pb.DeviceSpec(container_path=path, host_path=path,
                                           permissions="rw"))
    r.envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


def _with_shim(r: pb.ContainerAllocateResponse, shim: ShimFiles | None) -> None:
    if shim is None:
        return
    r.mounts.append(pb.Mount(container_path=shim.container_lib, host_path=str(shim.host_lib),
                             read_only=True))
    r.mounts.append(pb.Mount(container_path=PRELOAD, host_path=str(shim.host_preload),
                             read_only=True))


def _with_dirs(r: pb.ContainerAllocateResponse, alloc: Allocation) -> None:
    r.mounts.append(pb.Mount(container_path=CONFIG_DIR, host_path=str(alloc.etc),
                             read_only=True))
    r.mounts.append(pb.Mount(container_path=STATE_DIR, host_path=str(alloc.state),
                             read_only=False))
    r.envs["VGPUD_CONFIG"] = f"{CONFIG_DIR}/config"


def parse_limits(text: str) -> tuple[DeviceGrant, ...]:
    """The devices of a limits file the plugin wrote (to rebuild metrics after a restart)."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip()
    out = []
    i = 0
    while f"device.{i}.uuid" in kv:
        try:
            mem = int(kv.get(f"device.{i}.memory_limit", "0")) >> 20
            cores = int(kv.get(f"device.{i}.core_limit", "0"))
        except ValueError:
            break
        out.append(DeviceGrant(uuid=kv[f"device.{i}.uuid"], memory=mem, cores=cores or 100))
        i += 1
    return tuple(out)


class PluginService(pb.DevicePluginBase):
    def __init__(
        self,
        *,
        node: str,
        devices: NodeDevices,
        store: AllocationStore,
        podresources: PodResourcesClient,
        cluster: ClusterApi,
        visible: str = "env",
        shim: ShimFiles | None = None,
        clock: Callable[[], float] = time.time,
        owner_retries: int = 5,
    ) -> None:
        self.node = node
        self.devices = devices
        self.store = store
        self.podresources = podresources
        self.cluster = cluster
        self.visible = visible
        self.shim = shim
        self.clock = clock
        self.owner_retries = owner_retries
        self.granted: dict[str, Granted] = {}
        self._reconcile_lock = anyio.Lock()

    # -- state after a restart ---------------------------------------------------------------

    def restore(self, allocations: list[Allocation]) -> None:
        """Rebuild what is granted from the allocation directories on disk."""
        for a in allocations:
            if a.owner is None:
                continue
            try:
                text = a.config.read_text()
            except OSError:
                continue
            self.granted[a.key] = Granted(a.key, a.owner, parse_limits(text), a.configured)

    # -- the RPCs ----------------------------------------------------------------------------

    async def get_device_plugin_options(self, message: pb.Empty) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=True,
                                      get_preferred_allocation_available=True)

    def device_list(self) -> pb.ListAndWatchResponse:
        out = []
        for r in advertised(self.devices.inventory()):
            topo = pb.TopologyInfo(nodes=[pb.NumaNode(id=r.numa)]) if r.numa >= 0 else None
            out.append(pb.Device(id=r.id, health=HEALTHY if r.healthy else UNHEALTHY,
                                 topology=topo))
        return pb.ListAndWatchResponse(devices=out)

    async def list_and_watch(self, message: pb.Empty) -> AsyncIterator[pb.ListAndWatchResponse]:
        seen = self.devices.version
        log.info("list_and_watch_started", devices=len(self.devices.uuids))
        yield self.device_list()
        while True:
            seen = await self.devices.wait_change(seen)
            log.info("devices_changed", version=seen)
            yield self.device_list()

    async def get_preferred_allocation(
        self, message: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        out = []
        for req in message.container_requests:
            wanted = await self._wanted(req.allocation_size)
            ids = preferred(list(req.available_deviceIDs), list(req.must_include_deviceIDs),
                            req.allocation_size, wanted)
            log.debug("preferred", size=req.allocation_size, wanted=wanted, ids=ids)
            out.append(pb.ContainerPreferredAllocationResponse(device_i_ds=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    async def allocate(self, message: pb.AllocateRequest) -> pb.AllocateResponse:
        out = []
        for req in message.container_requests:
            out.append(await self._allocate_one(list(req.devices_ids)))
        return pb.AllocateResponse(container_responses=out)

    async def pre_start_container(
        self, message: pb.PreStartContainerRequest
    ) -> pb.PreStartContainerResponse:
        ids = list(message.devices_ids)
        try:
            await self.configure(ids)
        except AllocationFailed as e:
            log.warning("prestart_failed", ids=ids, error=str(e))
            if e.pod is not None:
                await self.cluster.pod_event(e.pod, FAILED_REASON, str(e))
            raise GRPCError(Status.FAILED_PRECONDITION, str(e)) from None
        return pb.PreStartContainerResponse()

    # -- Allocate ----------------------------------------------------------------------------

    def _uuids(self, ids: list[str]) -> list[str]:
        if not ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "Allocate was called with no device IDs")
        try:
            uuids = sorted(set(gpus_of(ids)))
        except ReplicaIdError as e:
            raise GRPCError(Status.INVALID_ARGUMENT, str(e)) from None
        unknown = [u for u in uuids if self.devices.info(u) is None]
        if unknown:
            raise GRPCError(Status.INVALID_ARGUMENT,
                            f"device IDs name GPUs this node does not have: {', '.join(unknown)}")
        return uuids

    async def _allocate_one(self, ids: list[str]) -> pb.ContainerAllocateResponse:
        uuids = self._uuids(ids)
        infos = sorted((i for i in (self.devices.info(u) for u in uuids) if i is not None),
                       key=lambda d: d.gpu.index)
        try:
            alloc = await anyio.to_thread.run_sync(self.store.prepare, ids)
        except OSError as e:
            raise GRPCError(Status.INTERNAL,
                            f"cannot create the allocation directory: {e.strerror or e}") from None
        r = pb.ContainerAllocateResponse()
        _with_visible(r, [i.gpu.uuid for i in infos], [i.minor for i in infos], self.visible)
        _with_shim(r, self.shim)
        _with_dirs(r, alloc)
        log.info("allocated", ids=ids, key=alloc.key)
        return r

    # -- GetPreferredAllocation --------------------------------------------------------------

    async def _wanted(self, size: int) -> list[str]:
        """The GPUs assigned to the container kubelet is probably admitting now."""
        try:
            held = await self.podresources.list()
            pods = {(p.namespace, p.name): p for p in await self.cluster.pods_on_node(self.node)}
        except (PodResourcesError, ClusterError) as e:
            log.warning("preferred_without_hint", error=str(e))
            return []
        empty: dict[tuple[str, str], set[str]] = {}
        for h in held:
            if not h.ids:
                empty.setdefault((h.namespace, h.pod), set()).add(h.container)
        for key, containers in empty.items():
            pod = pods.get(key)
            raw = pod.annotations.get(ASSIGNMENT) if pod is not None else None
            if raw is None:
                continue
            try:
                placement = decode_assignment(raw)
            except CodecError:
                continue
            for c in placement.containers:
                if c.name in containers and len(c.devices) == size:
                    return [d.uuid for d in c.devices]
        return []

    # -- PreStartContainer -------------------------------------------------------------------

    async def _owner(self, ids: list[str]) -> Held:
        delay = 0.05
        for attempt in range(self.owner_retries):
            try:
                held = await self.podresources.list()
            except PodResourcesError as e:
                raise AllocationFailed(str(e)) from None
            owner = find_owner(held, ids)
            if owner is not None:
                return owner
            if attempt + 1 < self.owner_retries:
                await anyio.sleep(delay)
                delay *= 2
        raise AllocationFailed(
            f"kubelet's PodResources lists no container holding exactly the devices "
            f"{', '.join(sorted(ids))}; cannot tell whose limits to write")

    async def configure(self, ids: list[str]) -> Granted:
        """Identify the container holding ``ids`` and write its limits file."""
        try:
            chosen = gpus_of(ids)
        except ReplicaIdError as e:
            raise AllocationFailed(str(e)) from None
        h = await self._owner(ids)
        where = f"pod {h.namespace}/{h.pod} container {h.container!r}"
        try:
            pod = await self.cluster.get_pod(h.namespace, h.pod)
        except ClusterError as e:
            raise AllocationFailed(f"{where}: {e}") from None
        if pod is None:
            raise AllocationFailed(f"{where}: the pod no longer exists in the API")
        placement = self._assignment(pod, where)
        inventory = self.devices.inventory()
        first = reconcile(placement, h.container, chosen, inventory, {})
        if isinstance(first, Reason) and first.code != "no-room":
            raise AllocationFailed(f"{where}: {first.message}", pod)
        if first is not placement:
            placement = await self._reconcile(pod, h.container, chosen, where)
        grant = placement.container(h.container)
        assert grant is not None  # reconcile checked it
        try:
            cfg = render_shim_config(grant, inventory, compute_policy=placement.compute_policy,
                                     priority=placement.priority, state_dir=STATE_DIR)
        except GrantError as e:
            raise AllocationFailed(f"{where}: {e}", pod) from None
        owner = Owner(h.namespace, h.pod, h.container, pod.uid)
        try:
            alloc = await anyio.to_thread.run_sync(self.store.configure, ids, owner, cfg.text)
        except OSError as e:
            raise AllocationFailed(f"{where}: cannot write the limits file: "
                                   f"{e.strerror or e}", pod) from None
        order = {u: i for i, u in enumerate(cfg.visible_uuids)}  # the limits file's order
        g = Granted(alloc.key, owner, tuple(sorted(grant.devices, key=lambda d: order[d.uuid])),
                    alloc.configured)
        self.granted[alloc.key] = g
        log.info("configured", pod=f"{h.namespace}/{h.pod}", container=h.container,
                 key=alloc.key, gpus=list(cfg.visible_uuids))
        return g

    def _assignment(self, pod: PodView, where: str) -> Placement:
        raw = pod.annotations.get(ASSIGNMENT)
        if raw is None:
            raise AllocationFailed(f"{where}: the pod has no {ASSIGNMENT} annotation (was it "
                                   f"placed by the vgpu scheduler?)", pod)
        try:
            placement = decode_assignment(raw)
        except CodecError as e:
            raise AllocationFailed(f"{where}: malformed assignment: {e}", pod) from None
        if placement.node != self.node:
            raise AllocationFailed(f"{where}: the assignment is for node {placement.node!r}, "
                                   f"not {self.node!r}", pod)
        return placement

    async def _reconcile(self, pod: PodView, container: str, chosen: list[str],
                         where: str) -> Placement:
        """kubelet chose other GPUs: rewrite the assignment if they have room."""
        async with self._reconcile_lock:
            for _ in range(5):
                placement = self._assignment(pod, where)
                try:
                    others = [p for p in await self.cluster.pods_on_node(self.node)
                              if (p.namespace, p.name) != (pod.namespace, pod.name)
                              and p.phase not in ("Succeeded", "Failed")]
                except ClusterError as e:
                    raise AllocationFailed(f"{where}: {e}", pod) from None
                held = held_by(_placements(others))
                got = reconcile(placement, container, chosen, self.devices.inventory(), held)
                if isinstance(got, Reason):
                    raise AllocationFailed(f"{where}: {got.message}", pod)
                try:
                    ok = await self.cluster.patch_pod_annotation(pod, ASSIGNMENT,
                                                                 encode_assignment(got))
                except ClusterError as e:
                    raise AllocationFailed(f"{where}: cannot rewrite the assignment: {e}",
                                           pod) from None
                if ok:
                    log.info("reconciled", pod=f"{pod.namespace}/{pod.name}",
                             container=container, gpus=chosen)
                    await self.cluster.pod_event(
                        pod, "VgpuReassigned", f"container {container!r} runs on "
                        f"{', '.join(chosen)} (kubelet's choice); the assignment was updated",
                        warning=False)
                    return got
                fresh = await self.cluster.get_pod(pod.namespace, pod.name)
                if fresh is None:
                    raise AllocationFailed(f"{where}: the pod no longer exists in the API")
                pod = fresh
            raise AllocationFailed(f"{where}: the assignment kept changing while it was "
                                   f"being reconciled", pod)

    # -- housekeeping ------------------------------------------------------------------------

    async def collect(self, *, grace: float = 300.0) -> int:
        """Drop allocation directories kubelet no longer lists (after ``grace`` seconds)."""
        try:
            held = await self.podresources.list()
        except PodResourcesError as e:
            log.warning("collect_skipped", error=str(e))
            return 0
        live = {h.ids for h in held if h.ids}
        now = self.clock()
        removed = 0
        for a in await anyio.to_thread.run_sync(self.store.all):
            if frozenset(a.ids) in live:
                continue
            try:
                age = now - (a.dir / "record.json").stat().st_mtime
            except OSError:
                continue
            if age < grace:
                continue
            await anyio.to_thread.run_sync(self.store.remove, a.key)
            self.granted.pop(a.key, None)
            removed += 1
        if removed:
            log.info("allocations_collected", removed=removed)
        return removed


def _placements(pods: list[PodView]) -> list[Placement]:
    out = []
    for p in pods:
        raw = p.annotations.get(ASSIGNMENT)
        if raw is None:
            continue
        try:
            out.append(decode_assignment(raw))
        except CodecError:
            continue
    return out
