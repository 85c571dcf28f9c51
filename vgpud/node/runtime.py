"""The node runtime: one anyio task group that owns every task of a GPU node, whichever
adapter speaks to kubelet (the device plugin, :mod:`vgpud.plugin`, today; a DRA kubelet
plugin would be a second adapter over the same runtime).

:func:`run_node` discovers the GPUs, restores the allocations on disk (of every
resource) and opens their registration sockets again, installs the shim, and then runs,
side by side: the process registrar (one socket per allocation,
:mod:`vgpud.node.registration`), the health watcher, the watch of the node's pods
(:mod:`vgpud.node.pods`; filled before the runtime is ready, so an adapter reads it
instead of listing), the watchdog (:mod:`vgpud.node.watchdog`), the arbiter
(:mod:`vgpud.node.arbiter`), the inventory publisher and the metrics server
(:mod:`vgpud.node.metrics`, the usage-file reader among them). ``task_status.started``
hands back a :class:`Node` once all of that runs.

Two loops wait for the adapter to say it serves (:meth:`Node.serving`, once kubelet has
accepted it): the rediscovery loop (GPUs that come and go; a ``VgpuDeviceGone`` event on
each pod that held a GPU that left; then each hook of :meth:`Node.on_change`, where an
adapter offers what is new, MIG profile resources say) and housekeeping (allocation
directories kubelet no longer lists, memory in use). Cancelling the scope stops
everything; the files of running containers stay where they are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from vgpud.config import Settings
from vgpud.core.arbitration import Arbiter
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.node import procfs
from vgpud.node.allocations import Allocation, AllocationOwner, AllocationStore
from vgpud.node.arbiter import Member, Observed, Publisher, run_arbiter
from vgpud.node.cluster import ClusterApi, PodView
from vgpud.node.devices import Changes, GpuSource, HealthEvent, NodeDevices
from vgpud.node.inventory import CORES, MEMORY, publish_inventory
from vgpud.node.metrics import NodeCollector, metrics_app
from vgpud.node.podresources import PodResourcesClient, PodResourcesError
from vgpud.node.pods import NodePods
from vgpud.node.registration import Registered, Registrar, Registry, SocketOwner
from vgpud.node.shim import ShimError, ShimFiles, find_library, install
from vgpud.node.startup import stale
from vgpud.node.tenant import TenantReads
from vgpud.node.vendors import Backend
from vgpud.node.watchdog import SmUsage, Usage, Watchdog, Watched
from vgpud.ops import Guard
from vgpud.process import parse_listen, serve

__all__ = ["Kick", "Node", "NodeOptions", "OnChange", "Registrar", "collect",
           "open_registration", "profiles", "run_node"]  # Registrar: Node.registrar's type

log = structlog.get_logger(__name__)

OnChange = Callable[[Changes], Awaitable[None]]


@dataclass
class NodeOptions:
    node_name: str
    pod_resources_socket: Path
    state_dir: Path
    settings: Settings = field(default_factory=Settings)
    metrics_listen: str | None = None  # host:port; None: settings.plugin.metricsListen; "": off
    housekeeping: float = 30.0
    collect_grace: float = 300.0
    require_shim: bool = True
    # the CorePlugin / MemoryPlugin node totals (node status capacity), where their gates
    # are on: resources the device plugin's pods ask; an adapter that serves no
    # device-plugin resources (``vgpud dra``) publishes none, and its role has no
    # nodes/status
    node_resources: bool = True

    def node(self) -> NodeOptions:
        """The runtime's own options, out of an adapter's (which extend these)."""
        return NodeOptions(**{f.name: getattr(self, f.name) for f in fields(NodeOptions)})


@dataclass
class Node:
    """The running node, as an adapter needs it: its devices and their allocations, the
    registrar of the processes using them, the node's pods and the API."""

    name: str
    settings: Settings
    gpus: Backend
    cluster: ClusterApi
    devices: NodeDevices
    store: AllocationStore
    registrar: Registrar
    pods: NodePods
    shim: ShimFiles | None
    arbiter_dir: Path  # host directory of the priority records
    split: int
    core_scaling: float
    metrics_port: int | None = None
    # two reconciliations onto one GPU (by any adapter) must not both see the same room
    reconcile_lock: anyio.Lock = field(default_factory=anyio.Lock)
    _hooks: list[OnChange] = field(default_factory=list, init=False, repr=False)
    _serving: anyio.Event = field(default_factory=anyio.Event, init=False, repr=False)
    # resources whose allocations the adapter removes itself (housekeeping leaves them)
    _owned: set[str] = field(default_factory=set, init=False, repr=False)

    def profiles(self) -> list[str]:
        """The MIG profiles the node offers whole (``migStrategy: mixed``)."""
        return profiles(self.devices)

    def on_change(self, hook: OnChange) -> None:
        """Call ``hook`` after each change rediscovery finds (after the node's own events)."""
        self._hooks.append(hook)

    def serving(self) -> None:
        """The adapter serves now: start rediscovery and housekeeping."""
        self._serving.set()

    def own(self, resource: str) -> None:
        """The allocations of ``resource`` live until the adapter removes them: kubelet's
        PodResources does not list them (a DRA claim is the DRA driver's until kubelet
        unprepares it), so housekeeping must not collect them."""
        self._owned.add(resource)


def profiles(devices: NodeDevices) -> list[str]:
    """The MIG profiles the node offers whole (``migStrategy: mixed``)."""
    return sorted({g.profile for g in devices.inventory().devices if g.profile})


def _shim(settings: Settings, required: bool) -> ShimFiles | None:
    source = find_library()
    if source is None:
        if required:
            raise ShimError("the shim library libvgpu.so.<version> was not found "
                            "(set VGPUD_SHIM_LIBRARY); without it no limit is enforced")
        log.warning("shim_missing", hint="set VGPUD_SHIM_LIBRARY; containers run unlimited")
        return None
    return install(source, settings.plugin.shimHostDir)


class Kick:
    """Asks the rediscovery loop to run now (an event said a GPU left the bus)."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, at_most: float) -> None:
        with anyio.move_on_after(at_most):
            await self._event.wait()
        self._event = anyio.Event()


async def _health(source: GpuSource, devices: NodeDevices, kick: Kick) -> None:
    send, receive = anyio.create_memory_object_stream[HealthEvent](16)
    async with anyio.create_task_group() as tg, receive:
        tg.start_soon(source.watch_health, send)
        async for event in receive:
            if devices.apply(event):
                log.warning("gpu_health", uuid=event.uuid, healthy=event.healthy,
                            reason=event.reason)
            if event.gone:
                kick.set()


async def _rediscover(source: GpuSource, devices: NodeDevices, kick: Kick, on_change: OnChange,
                      *, every: float, linger: float) -> None:
    """Discover the GPUs again every ``every`` seconds and when kicked (over NVML each
    discovery is a new NVML session: its device list is fixed at init); a GPU that is
    gone is advertised unhealthy for ``linger`` seconds, then dropped."""
    async def drop_later(gone: tuple[str, ...]) -> None:
        await anyio.sleep(linger)
        if devices.drop(gone):
            log.warning("gpus_dropped", uuids=list(gone))

    async with anyio.create_task_group() as tg:
        while True:
            await kick.wait(every)
            try:
                found = await source.discover()
            except Exception as e:  # NVML hiccups must not stop the node; try again later
                log.warning("rediscovery_failed", error=str(e))
                continue
            changes = devices.update(found)
            if not changes:
                continue
            log.warning("gpus_changed", added=list(changes.added), gone=list(changes.gone),
                        replaced=[list(r) for r in changes.replaced])
            await on_change(changes)
            if changes.gone:
                tg.start_soon(drop_later, changes.gone)


async def open_registration(registrar: Registrar | None, alloc: Allocation) -> None:
    """Serve the allocation's registration socket (after an allocation, and on restart)."""
    if registrar is None:
        return
    owner = None if alloc.owner is None else SocketOwner(
        alloc.key, alloc.owner.namespace, alloc.owner.pod, alloc.owner.container,
        alloc.owner.uid)
    try:
        await registrar.open(alloc.key, alloc.etc, owner)
    except OSError as e:
        log.error("registration_socket_failed", key=alloc.key, error=str(e))


async def collect(store: AllocationStore, kubelet: PodResourcesClient,
                  registrar: Registrar | None = None, *, clock: Clock = SYSTEM_CLOCK,
                  grace: float = 300.0, owned: Collection[str] = ()) -> int:
    """Drop allocation directories kubelet no longer lists (after ``grace`` seconds).

    The store is the node's, so one call covers every resource's allocations, those
    of resources no longer served included (kubelet lists their IDs while their
    containers live), except those of the resources an adapter ``owned``
    (:meth:`Node.own`). kubelet lists no regular init container, so an allocation
    stays while the pod that owns it is listed."""
    try:
        live, listed = await kubelet.snapshot()  # one List: one instant
    except PodResourcesError as e:
        log.warning("collect_skipped", error=str(e))
        return 0
    allocations = [a for a in await anyio.to_thread.run_sync(store.all)
                   if a.resource not in owned
                   and (a.owner is None or (a.owner.namespace, a.owner.pod) not in listed)]
    gone = stale(((a.key, (a.resource, frozenset(a.ids)), a.written) for a in allocations),
                 live, clock.wall().timestamp(), grace)
    for key in gone:
        if registrar is not None:
            registrar.close(key)
        await anyio.to_thread.run_sync(store.remove, key)
    if gone:
        log.info("allocations_collected", removed=len(gone))
    return len(gone)


async def _housekeeping(store: AllocationStore, kubelet: PodResourcesClient,
                        registrar: Registrar, source: GpuSource, used: dict[str, int],
                        every: float, grace: float, owned: Collection[str]) -> None:
    while True:
        used.clear()
        used.update(await source.memory_used())
        await collect(store, kubelet, registrar, grace=grace, owned=owned)
        await anyio.sleep(every)


async def run_node(
    opts: NodeOptions,
    gpus: Backend,
    cluster: ClusterApi,
    *,
    task_status: TaskStatus[Node] = anyio.TASK_STATUS_IGNORED,
) -> None:
    settings = opts.settings
    source = gpus.source
    guard = Guard.from_settings(settings.ops)  # a bad token file stops the start here
    found = await source.discover()
    split, mem_scaling, core_scaling = settings.for_node(opts.node_name)
    devices = NodeDevices(found, split=split, memory_scaling=mem_scaling,
                          core_scaling=core_scaling, mig=settings.mig_strategy_for(opts.node_name))
    log.info("gpus_found", node=opts.node_name, gpus=len(found), split=split)
    store = AllocationStore(opts.state_dir)
    shim = await anyio.to_thread.run_sync(_shim, settings, opts.require_shim)
    registry = Registry()
    arbiter_dir = Path(opts.state_dir) / "arbiter"
    publisher = await anyio.to_thread.run_sync(
        Publisher, arbiter_dir, [d.gpu.uuid for d in found])

    async def env_ignored(owner: SocketOwner, r: Registered, held: int) -> None:
        names = list(r.claim.ignored)
        if r.claim.unknown:
            names.append(f"{r.claim.unknown} other VGPUD_* name{'s' * (r.claim.unknown > 1)}")
        await cluster.pod_event(
            _pod_of(owner), "VgpuEnvIgnored",
            f"container {owner.container!r} (process {r.host_pid}) set "
            f"{', '.join(names)}: ignored, its limits come from the vgpud plugin"
            + (f" ({held} more such reports about it were held back)" if held else ""))

    registrar = Registrar(registry, on_ignored_env=env_ignored)
    node_pods = NodePods.of(cluster, opts.node_name)
    node = Node(opts.node_name, settings, gpus, cluster, devices, store, registrar, node_pods,
                shim, arbiter_dir, split, core_scaling)
    allocations = await anyio.to_thread.run_sync(store.all)  # also loads the store's index
    log.info("allocations_restored", configured=len(store.configured()),
             by_resource={r: sum(1 for a in allocations if a.resource == r)
                          for r in {a.resource for a in allocations}})
    plug = settings.plugin
    watchdog = Watchdog(registry, lambda: _watched(store), action=plug.overLimitAction,
                        grace=plug.overLimitGraceSeconds,
                        tolerance=plug.overLimitToleranceMiB << 20,
                        interval=plug.watchdogIntervalSeconds)

    async def over_limit(u: Usage | SmUsage, owner: SocketOwner) -> None:
        if isinstance(u, SmUsage):
            await cluster.pod_event(
                _pod_of(owner), "VgpuOverSmLimit",
                f"container {owner.container!r} used {u.percent:.0f} % of the SMs of GPU "
                f"{u.uuid} over {watchdog.sm_window:.0f} s, past its limit of {u.limit} % "
                f"(the shim's pacing was undone or bypassed)"
                + (": killing its processes there" if plug.overLimitAction == "kill"
                   else ""))
            return
        await cluster.pod_event(
            _pod_of(owner), "VgpuOverLimit",
            f"container {owner.container!r} uses {u.used >> 20} MiB of GPU {u.uuid}, over "
            f"its limit of {u.limit >> 20} MiB for {plug.overLimitGraceSeconds:.0f} s"
            + (": killing its largest processes there" if plug.overLimitAction == "kill"
               else ""))

    async def device_gone(uuid: str) -> None:
        info = devices.info(uuid)
        what = f"GPU {uuid}" + (f" (index {info.gpu.index}, {info.gpu.model})" if info else "")
        for a in store.configured():
            if a.owner is None or uuid not in {d.uuid for d in a.devices}:
                continue
            log.warning("gpu_gone_under_container", uuid=uuid, pod=a.owner.pod,
                        namespace=a.owner.namespace, container=a.owner.container)
            await cluster.pod_event(
                _pod_of(a.owner), "VgpuDeviceGone",
                f"{what} is gone from node {opts.node_name} (removed or fell off the bus); "
                f"container {a.owner.container!r} was using it")

    async def on_change(changes: Changes) -> None:
        for uuid in changes.gone:
            await device_gone(uuid)
        for hook in node._hooks:
            await hook(changes)

    used: dict[str, int] = {}
    observed = Observed()  # the arbiter's last round, for the metrics
    reads = TenantReads()  # the containers' usage files, for the arbiter and the metrics
    listen = settings.plugin.metricsListen if opts.metrics_listen is None else opts.metrics_listen
    gates = settings.plugin.featureGates
    kubelet = PodResourcesClient(str(opts.pod_resources_socket), "")  # housekeeping's
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(registrar.run)
            for a in allocations:  # running containers register again after a restart
                await open_registration(registrar, a)
            kick = Kick()
            tg.start_soon(_health, source, devices, kick)
            tg.start_soon(cluster.run)
            await tg.start(node_pods.run)  # filled before kubelet can call an adapter
            tg.start_soon(watchdog.run, source, SYSTEM_CLOCK, over_limit)
            tg.start_soon(partial(
                run_arbiter, Arbiter(floor_permille=plug.priorityFloorPercent * 10,
                                     hold=plug.priorityHoldSeconds),
                publisher, source.utilisation, lambda: _members(store),
                lambda pid: registry.allocation_of(pid, procfs.read(pid)),
                period=plug.arbitrationPeriodSeconds, observed=observed,
                on_sm=watchdog.record_sm, reads=reads))
            vgm = settings.preset_named("vgpu-manager")  # the gates' names, renamed too
            tg.start_soon(lambda: publish_inventory(
                opts.node_name, devices, cluster, cores=opts.node_resources and gates.CorePlugin,
                memory=opts.node_resources and gates.MemoryPlugin, links=gates.GPUTopology,
                names=(vgm.cores or CORES, vgm.memory or MEMORY)))
            if listen:
                metrics = CollectorRegistry(auto_describe=False)
                collector = NodeCollector(opts.node_name, devices, store, lambda: used,
                                          registry=registry, watchdog=watchdog,
                                          arbiter=observed, reads=reads)
                metrics.register(collector)
                node.metrics_port = await tg.start(
                    serve, guard.install(metrics_app(metrics, collector.refresh)),
                    *parse_listen(listen))

            async def once_served() -> None:
                await node._serving.wait()
                tg.start_soon(partial(_rediscover, source, devices, kick, on_change,
                                      every=plug.rediscoverSeconds,
                                      linger=plug.goneLingerSeconds))
                tg.start_soon(_housekeeping, store, kubelet, registrar, source, used,
                              opts.housekeeping, opts.collect_grace, node._owned)

            tg.start_soon(once_served)
            task_status.started(node)
    finally:
        kubelet.close()
        with anyio.CancelScope(shield=True):
            await source.aclose()


def _pod_of(owner: SocketOwner | AllocationOwner) -> PodView:
    """The pod a container belongs to, as far as an event about it needs."""
    return PodView(namespace=owner.namespace, name=owner.pod, uid=owner.uid,
                   resource_version="", node_name="", phase="")


def _members(store: AllocationStore) -> list[Member]:
    """What the arbiter weighs: every configured container's GPUs and priority."""
    return [Member(a.key, a.priority, tuple(d.uuid for d in a.devices), a.state)
            for a in store.configured() if a.devices]


def _watched(store: AllocationStore) -> dict[str, Watched]:
    """What the watchdog compares: every configured container's memory limits, in bytes,
    and its SM limits where they are fixed."""
    out = {}
    for a in store.configured():
        if a.owner is None:
            continue
        owner = SocketOwner(a.key, a.owner.namespace, a.owner.pod, a.owner.container,
                            a.owner.uid)
        sm = ({d.uuid: d.cores for d in a.devices if 0 < d.cores < 100}
              if a.policy == "fixed" else {})
        out[a.key] = Watched(owner, {d.uuid: d.memory << 20 for d in a.devices}, sm)
    return out
