"""The DevicePlugin gRPC service kubelet calls (grpclib, ``v1beta1.DevicePlugin``).

One :class:`PluginService` per served resource (:mod:`vgpud.plugin.resources`), each on
its own socket; they share the node's devices, the allocation store (whose keys tell
the resources apart), the API and the registrar.

- **ListAndWatch** streams every replica (``<uuid>::<i>``) with its health and NUMA
  node, and again whenever :class:`~vgpud.node.devices.NodeDevices` changes.
- **GetPreferredAllocation** steers kubelet to the GPUs the scheduler assigned to
  the pod kubelet is admitting (the pod whose containers PodResources lists without
  devices yet), read from the node's watched pods (:mod:`vgpud.node.pods`; one GET for
  a pod the cache does not show in full yet). It is only a hint; PreStartContainer
  checks what kubelet really did.
- **Allocate** knows only the IDs. It prepares the allocation's directory and returns
  the visible devices, the shim library, ``/etc/ld.so.preload``, the read-only
  config directory (``/etc/vgpud``), the writable state directory and the node's
  read-only priority records: the node's :mod:`vgpud.node.edits`, translated into
  kubelet's response by :func:`_response`.
- **PreStartContainer** (``pre_start_required``) learns the owner from PodResources
  (a regular init container, which PodResources does not list, from the active pods'
  assignments and statuses; the pod GetPreferredAllocation last saw admitted is read from
  the API meanwhile, the likely owner) and hands it to the node's
  :class:`~vgpud.node.configure.Configurer`, which reads its ``vgpud.io/assignment``
  and carries out what :func:`vgpud.node.startup.plan` decides: write the limits file
  atomically (after rewriting the assignment when kubelet chose other GPUs with room),
  or fail that one container with a message kubelet shows on the pod.

The servicer only speaks kubelet's protocol: it gathers kubelet's facts and translates
the node's answers; the decisions are pure functions in :mod:`vgpud.node.startup` and
:mod:`vgpud.plugin.replicas`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import structlog
from grpclib import GRPCError
from grpclib.const import Status

from vgpud.core.model import Defaults
from vgpud.kube.backoff import Backoff
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import KubeError
from vgpud.node import edits
from vgpud.node.allocations import DEFAULT_RESOURCE, Allocation, AllocationStore
from vgpud.node.cluster import ClusterApi, PodView
from vgpud.node.configure import AllocationFailed, Configurer, complete
from vgpud.node.devices import NodeDevices
from vgpud.node.ids import ReplicaIdError, gpus_of
from vgpud.node.podresources import Held, PodResourcesClient, PodResourcesError, find_owner
from vgpud.node.pods import NodePods
from vgpud.node.runtime import Registrar, collect, open_registration
from vgpud.node.shim import ShimFiles
from vgpud.node.startup import (
    ActivePod,
    init_pending,
    starting_init_container,
    wanted,
)
from vgpud.node.vendors import Backend, VisibleMode
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.replicas import advertised, preferred
from vgpud.plugin.resources import ServedResource

log = structlog.get_logger(__name__)

RESOURCE = DEFAULT_RESOURCE  # the default preset's; every served one: vgpud.plugin.resources
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
FAILED_REASON = "VgpuAllocationFailed"


# -- composing the Allocate response ---------------------------------------------------------

def _response(e: edits.ContainerEdits) -> pb.ContainerAllocateResponse:
    """The node's container edits in kubelet's words."""
    r = pb.ContainerAllocateResponse()
    for k, v in e.env:
        r.envs[k] = v
    r.devices.extend(pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                                   permissions=d.permissions) for d in e.devices)
    r.cdi_devices.extend(pb.CdiDevice(name=n) for n in e.cdi_devices)
    r.mounts.extend(pb.Mount(container_path=m.container_path, host_path=m.host_path,
                             read_only=m.read_only) for m in e.mounts)
    return r


class PluginService(pb.DevicePluginBase):
    def __init__(
        self,
        *,
        resource: ServedResource,
        node: str,
        devices: NodeDevices,
        store: AllocationStore,
        podresources: PodResourcesClient,
        cluster: ClusterApi,
        gpus: Backend,
        visible: VisibleMode = "env",
        shim: ShimFiles | None = None,
        registrar: Registrar | None = None,
        clock: Clock = SYSTEM_CLOCK,
        owner_retries: int = 5,
        reconcile_lock: anyio.Lock | None = None,
        arbiter: Path | None = None,
        scheduler_name: str | None = None,
        defaults: Defaults | None = None,
        pods: NodePods | None = None,
        rewrite_wait: float = 2.0,
    ) -> None:
        self.resource = resource
        self.registrar = registrar
        self.arbiter = arbiter  # host directory of the priority records (None: off)
        self.node = node
        self.devices = devices
        self.store = store
        self.podresources = podresources
        self.cluster = cluster
        # the node's pods, watched (run_plugin starts it before registering); an
        # unstarted one reads every pod it is asked about with a GET
        self._node_pods = pods
        self.gpus = gpus  # the vendor's backend: its devices' container edits
        self.visible = visible
        self.shim = shim
        self.clock = clock
        self.owner_retries = owner_retries
        # the pod's side of PreStartContainer: the node's (reconcile_lock shared by the
        # services of one node)
        self.configurer = Configurer(
            node=node, devices=devices, store=store, cluster=cluster, pods=lambda: self.pods,
            registrar=registrar, arbiter=arbiter, scheduler_name=scheduler_name,
            defaults=defaults, reconcile_lock=reconcile_lock, rewrite_wait=rewrite_wait,
            clock=clock)
        # the pod GetPreferredAllocation last found kubelet admitting, alone: the likely
        # owner of the next PreStartContainer, read while PodResources is asked
        self._admitting: tuple[str, str] | None = None

    @property
    def pods(self) -> NodePods:
        if self._node_pods is None:
            self._node_pods = NodePods.of(self.cluster, self.node)
        return self._node_pods

    # -- the RPCs ----------------------------------------------------------------------------

    async def get_device_plugin_options(self, message: pb.Empty) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=True,
                                      get_preferred_allocation_available=True)

    def device_list(self) -> pb.ListAndWatchResponse:
        out = []
        for r in advertised(self.devices.inventory(), self.resource.replicas,
                            self.resource.profile):
            topo = pb.TopologyInfo(nodes=[pb.NumaNode(id=r.numa)]) if r.numa >= 0 else None
            out.append(pb.Device(id=r.id, health=HEALTHY if r.healthy else UNHEALTHY,
                                 topology=topo))
        return pb.ListAndWatchResponse(devices=out)

    async def list_and_watch(self, message: pb.Empty) -> AsyncIterator[pb.ListAndWatchResponse]:
        seen = self.devices.version
        log.info("list_and_watch_started", resource=self.resource.name,
                 devices=len(self.devices.uuids))
        yield self.device_list()
        while True:
            seen = await self.devices.wait_change(seen)
            log.info("devices_changed", resource=self.resource.name, version=seen)
            yield self.device_list()

    async def get_preferred_allocation(
        self, message: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        out = []
        for req in message.container_requests:
            wanted = await self._wanted(req.allocation_size)
            ids = preferred(list(req.available_deviceIDs), list(req.must_include_deviceIDs),
                            req.allocation_size, wanted, self.resource.per_gpu)
            log.debug("preferred", resource=self.resource.name, size=req.allocation_size,
                      available=len(req.available_deviceIDs),
                      must_include=sorted(req.must_include_deviceIDs),
                      wanted=sorted(set(wanted)), ids=len(ids))
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
            log.warning("prestart_failed", resource=self.resource.name, ids=ids, error=str(e))
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
            alloc = self.store.prepare(ids, self.resource.name)  # small files, as configure
        except OSError as e:
            raise GRPCError(Status.INTERNAL,
                            f"cannot create the allocation directory: {e.strerror or e}") from None
        await self.listen(alloc)
        r = _response(self.gpus.gpu_edits(infos, self.visible) + edits.shim(self.shim)
                      + edits.allocation_dirs(alloc, self.arbiter))
        log.info("allocated", resource=self.resource.name, ids=len(ids), gpus=uuids,
                 key=alloc.key)
        return r

    # -- GetPreferredAllocation --------------------------------------------------------------

    async def _wanted(self, size: int) -> list[str]:
        """The GPUs assigned to the container kubelet is probably admitting now, one per
        ID of this resource it should get."""
        try:
            held = await self.podresources.list()
        except PodResourcesError as e:
            log.warning("preferred_without_hint", error=str(e))
            return []
        # kubelet lists only pods bound here, whose assignment came with the binding: a
        # pod with a container that holds no IDs yet, which the cache lacks, shows being
        # deleted (a namesake may replace it) or without an assignment while asking for
        # this resource, is read from the API instead
        unsure = {(h.namespace, h.pod) for h in held if not h.ids}
        by_key = await self.pods.views(unsure, self._complete)
        waiting: dict[tuple[str, str], set[str]] = {}
        for h in held:
            pod = by_key.get((h.namespace, h.pod))
            # a running container that asked for another of our resources holds no IDs
            # of this one: it is not waiting for them
            if not h.ids and (pod is None or pod.may_ask(h.container, self.resource.name)):
                waiting.setdefault((h.namespace, h.pod), set()).add(h.container)
        # PodResources never lists regular init containers: they may wait in a pod being
        # admitted (one with waiting containers, or one kubelet has not reported yet)
        admitting = [k for k in dict.fromkeys((h.namespace, h.pod) for h in held)
                     if k in waiting or (k in by_key and not by_key[k].reported)]
        self._admitting = next(iter(waiting)) if len(waiting) == 1 else None
        return wanted(waiting, {k: p.assignment for k, p in by_key.items()}, size,
                      self.resource.per_gpu, init_waiting=admitting)

    def _complete(self, pod: PodView) -> bool:
        """Whether the cached view of a pod kubelet lists can be decided on."""
        return complete(pod, self.resource.name)

    # -- PreStartContainer -------------------------------------------------------------------

    async def _owner(self, ids: list[str]) -> tuple[Held, list[Held]]:
        wait = Backoff(0.05, cap=60.0, jitter=0, clock=self.clock)  # 0.05, 0.1, 0.2 ...
        held: list[Held] = []
        for attempt in range(max(1, self.owner_retries)):
            try:
                held = await self.podresources.list()
            except PodResourcesError as e:
                raise AllocationFailed(str(e)) from None
            owner = find_owner(held, ids)
            if owner is not None:
                return owner, held
            if attempt + 1 < self.owner_retries:
                await wait.sleep()
        got = await self._init_owner(ids, held)
        if isinstance(got, Held):
            return got, held
        raise AllocationFailed(
            f"kubelet's PodResources lists no container holding exactly the "
            f"{self.resource.name} devices {', '.join(sorted(ids))}, and {got}; cannot "
            f"tell whose limits to write")

    async def _init_owner(self, ids: list[str], held: list[Held]) -> Held | str:
        """The regular init container kubelet is starting with ``ids``: PodResources lists
        no such container (:func:`~vgpud.node.startup.starting_init_container`)."""
        by_pod: dict[tuple[str, str], set[str]] = {}
        for h in held:
            by_pod.setdefault((h.namespace, h.pod), set()).update(h.ids)
        # the statuses decide, and a cached one may lag: every active pod the cache shows
        # with a regular init container not yet done (or lacks) is read from the API
        # (a status only ever adds completed init containers)
        pods = await self.pods.views(by_pod, lambda p: self._complete(p) and not init_pending(
            p.assignment, p.init_done))
        active = [ActivePod(p.namespace, p.name, p.assignment, p.init_done,
                            frozenset(by_pod[key]))
                  for key, p in pods.items() if key in by_pod]
        got = starting_init_container(active, ids, per_gpu=self.resource.per_gpu)
        if isinstance(got, str):
            return got
        namespace, pod, container = got
        log.info("init_container_found", resource=self.resource.name,
                 pod=f"{namespace}/{pod}", container=container, ids=len(ids))
        return Held(namespace, pod, container, frozenset(ids))

    async def configure(self, ids: list[str]) -> Allocation:
        """Identify the container holding ``ids`` and write its limits file.

        The pod GetPreferredAllocation last saw admitted is read from the API while
        PodResources is asked who holds ``ids`` (kubelet starts containers soon after
        admitting their pod): when it is the owner, its GET cost no wait of its own;
        when not, the owner is read as before. Either read is made after kubelet's call
        began, so either shows the pod kubelet is starting."""
        try:
            chosen = gpus_of(ids)
        except ReplicaIdError as e:
            raise AllocationFailed(str(e)) from None
        guess, self._admitting = self._admitting, None
        ahead: list[PodView] = []
        found: tuple[Held, list[Held]] | AllocationFailed
        async with anyio.create_task_group() as tg:
            if guess is not None:
                tg.start_soon(self._read_ahead, guess, ahead)
            try:  # raised from here, not out of the task group (as a group)
                found = await self._owner(ids)
            except AllocationFailed as e:
                found = e
            if isinstance(found, AllocationFailed) or (
                    found[0].namespace, found[0].pod) != guess:
                tg.cancel_scope.cancel()  # not the owner: no wait for its read
        if isinstance(found, AllocationFailed):
            raise found
        h, held = found
        return await self.configurer.configure(
            h.namespace, h.pod, h.container, ids, chosen, resource=self.resource.name,
            per_gpu=self.resource.per_gpu, listed={(x.namespace, x.pod) for x in held},
            read=ahead[0] if ahead else None)

    async def _read_ahead(self, key: tuple[str, str], into: list[PodView]) -> None:
        """The pod ``key`` from the API, if it has it (a failure: the owner is read again)."""
        try:
            pod = await self.cluster.get_pod(*key)
        except KubeError:
            return
        if pod is not None:
            into.append(pod)

    async def listen(self, alloc: Allocation) -> None:
        """Serve the allocation's registration socket (after Allocate, and on restart)."""
        await open_registration(self.registrar, alloc)

    # -- housekeeping ------------------------------------------------------------------------

    async def collect(self, *, grace: float = 300.0) -> int:
        """Drop allocation directories kubelet no longer lists (after ``grace`` seconds):
        :func:`vgpud.node.runtime.collect`, over this service's PodResources client."""
        return await collect(self.store, self.podresources, self.registrar, clock=self.clock,
                             grace=grace)
