"""The plugin process: one anyio task group that owns every task.

:func:`run_plugin` discovers the GPUs, restores the allocations on disk (of every
resource), installs the shim, and then runs, side by side: the health watcher, the
rediscovery loop (GPUs that come and go; a ``VgpuDeviceGone`` event on each pod that
held a GPU that left; MIG profile resources registered as they appear), one gRPC
server with its kubelet registration per served resource
(:func:`vgpud.plugin.resources.served` of ``resourcePreset`` and ``compatPresets``; each
a :func:`vgpud.plugin.kubelet.serve_plugin` task that re-registers on its own after
kubelet restarts), the inventory publisher, the process registrar (one socket per
allocation, :mod:`vgpud.node.registration`), the watchdog (:mod:`vgpud.node.watchdog`),
the housekeeping loop (stale allocation directories, memory in use) and the metrics
server, and the watch of the node's pods (:mod:`vgpud.node.pods`), which the
allocation path reads instead of listing: it is filled before any resource registers
with kubelet. ``task_status.started`` hands back a :class:`Running` once kubelet has accepted
every registration. Cancelling the scope stops everything; the
files of running containers stay where they are.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from vgpud.config import Settings
from vgpud.core.arbitration import Arbiter
from vgpud.kube.client import KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK
from vgpud.node import procfs
from vgpud.node.allocations import AllocationOwner, AllocationStore
from vgpud.node.arbiter import Member, Observed, Publisher, run_arbiter
from vgpud.node.cluster import ClusterApi, KubeCluster, PodView
from vgpud.node.devices import Changes, GpuSource, HealthEvent, NodeDevices
from vgpud.node.inventory import CORES, MEMORY, publish_inventory
from vgpud.node.metrics import NodeCollector, metrics_app
from vgpud.node.podresources import PodResourcesClient
from vgpud.node.pods import NodePods
from vgpud.node.registration import Registered, Registrar, Registry, SocketOwner
from vgpud.node.shim import ShimError, ShimFiles, find_library, install
from vgpud.node.tenant import TenantReads
from vgpud.node.vendors import Backend, backend
from vgpud.node.watchdog import SmUsage, Usage, Watchdog, Watched
from vgpud.ops import Guard
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.kubelet import serve_plugin
from vgpud.plugin.resources import ServedResource, served
from vgpud.plugin.service import PluginService
from vgpud.process import parse_listen, serve

log = structlog.get_logger(__name__)


@dataclass
class PluginOptions:
    node_name: str
    device_plugin_dir: Path
    pod_resources_socket: Path
    state_dir: Path
    settings: Settings = field(default_factory=Settings)
    metrics_listen: str | None = None  # host:port; None: settings.plugin.metricsListen; "": off
    kubelet_poll: float = 1.0
    housekeeping: float = 30.0
    collect_grace: float = 300.0
    require_shim: bool = True


@dataclass
class Running:
    devices: NodeDevices
    metrics_port: int | None
    services: dict[str, PluginService]  # by resource name, resourcePreset's first
    sockets: dict[str, Path]  # likewise

    @property
    def service(self) -> PluginService:
        """resourcePreset's service."""
        return next(iter(self.services.values()))

    @property
    def socket(self) -> Path:
        return next(iter(self.sockets.values()))


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


OnChange = Callable[[Changes], Awaitable[None]]


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
            except Exception as e:  # NVML hiccups must not stop the plugin; try again later
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


def _profiles(devices: NodeDevices) -> list[str]:
    """The MIG profiles the node offers whole (``migStrategy: mixed``)."""
    return sorted({g.profile for g in devices.inventory().devices if g.profile})


async def _housekeeping(service: PluginService, source: GpuSource, used: dict[str, int],
                        every: float, grace: float) -> None:
    while True:
        used.clear()
        used.update(await source.memory_used())
        await service.collect(grace=grace)
        await anyio.sleep(every)


async def run_plugin(
    opts: PluginOptions,
    gpus: Backend,
    cluster: ClusterApi,
    *,
    task_status: TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
) -> None:
    settings = opts.settings
    source = gpus.source
    guard = Guard.from_settings(settings.ops)  # a bad token file stops the start here
    found = await source.discover()
    split, mem_scaling, core_scaling = settings.for_node(opts.node_name)
    devices = NodeDevices(found, split=split, memory_scaling=mem_scaling,
                          core_scaling=core_scaling, mig=settings.mig_strategy_for(opts.node_name))
    presets = settings.presets()  # resourcePreset first, under resourceNames' names
    resources = served(presets[0], presets[1:], split=split,
                       core_scaling=core_scaling, profiles=_profiles(devices))
    log.info("gpus_found", node=opts.node_name, gpus=len(found), split=split,
             resources=[r.name for r in resources])
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
    reconciling = anyio.Lock()
    node_pods = NodePods.of(cluster, opts.node_name)

    def service_for(r: ServedResource) -> PluginService:
        return PluginService(
            resource=r, node=opts.node_name, devices=devices, store=store,
            podresources=PodResourcesClient(str(opts.pod_resources_socket), r.name),
            cluster=cluster, gpus=gpus, visible=settings.plugin.visibleDevices, shim=shim,
            registrar=registrar, reconcile_lock=reconciling, arbiter=arbiter_dir,
            scheduler_name=settings.schedulerName, defaults=settings.defaults(),
            pods=node_pods)

    services = {r.name: service_for(r) for r in resources}
    service = services[resources[0].name]
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

    sockets: dict[str, Path] = {}
    used: dict[str, int] = {}
    observed = Observed()  # the arbiter's last round, for the metrics
    reads = TenantReads()  # the containers' usage files, for the arbiter and the metrics
    listen = settings.plugin.metricsListen if opts.metrics_listen is None else opts.metrics_listen
    gates = settings.plugin.featureGates
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(registrar.run)
            for a in allocations:  # running containers register again after a restart
                await service.listen(a)
            kick = Kick()

            async def on_change(changes: Changes) -> None:
                for uuid in changes.gone:
                    await device_gone(uuid)
                for r in served(presets[0], presets[1:], split=split,
                                core_scaling=core_scaling, profiles=_profiles(devices)):
                    if r.name not in services:  # a MIG profile new to this node
                        services[r.name] = service_for(r)
                        sockets[r.name] = await tg.start(_serve, services[r.name], opts,
                                                         options)
                        log.info("resource_added", resource=r.name)

            tg.start_soon(_health, source, devices, kick)
            tg.start_soon(cluster.run)
            await tg.start(node_pods.run)  # filled before kubelet can call us
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
                opts.node_name, devices, cluster, cores=gates.CorePlugin,
                memory=gates.MemoryPlugin, links=gates.GPUTopology,
                names=(vgm.cores or CORES, vgm.memory or MEMORY)))
            port = None
            if listen:
                metrics = CollectorRegistry(auto_describe=False)
                collector = NodeCollector(opts.node_name, devices, store, lambda: used,
                                            registry=registry, watchdog=watchdog,
                                            arbiter=observed, reads=reads)
                metrics.register(collector)
                port = await tg.start(serve,
                                      guard.install(metrics_app(metrics, collector.refresh)),
                                      *parse_listen(listen))
            options = await service.get_device_plugin_options(pb.Empty())
            for r in resources:  # each re-registers on its own after kubelet restarts
                sockets[r.name] = await tg.start(_serve, services[r.name], opts, options)
            tg.start_soon(partial(_rediscover, source, devices, kick, on_change,
                                  every=plug.rediscoverSeconds, linger=plug.goneLingerSeconds))
            tg.start_soon(_housekeeping, service, source, used, opts.housekeeping,
                          opts.collect_grace)
            task_status.started(Running(devices, port, services, sockets))
    finally:
        for s in services.values():
            s.podresources.close()
        with anyio.CancelScope(shield=True):
            await source.aclose()


async def _serve(service: PluginService, opts: PluginOptions, options: pb.DevicePluginOptions,
                 *, task_status: TaskStatus[Path] = anyio.TASK_STATUS_IGNORED) -> None:
    r = service.resource
    await serve_plugin([service], opts.device_plugin_dir, r.socket, r.name, options,
                       poll=opts.kubelet_poll, task_status=task_status)


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
        owner = SocketOwner(a.key, a.owner.namespace, a.owner.pod, a.owner.container, a.owner.uid)
        sm = ({d.uuid: d.cores for d in a.devices if 0 < d.cores < 100}
              if a.policy == "fixed" else {})
        out[a.key] = Watched(owner, {d.uuid: d.memory << 20 for d in a.devices}, sm)
    return out


async def main(opts: PluginOptions, kubeconfig: str | None, fake_devices: str | None,
               environ: Mapping[str, str] | None = None) -> None:
    """The ``vgpud plugin`` process: connect, then :func:`run_plugin` until cancelled."""
    env = os.environ if environ is None else environ
    async with KubeClient.connect(kubeconfig, qps=opts.settings.kubeQPS,
                                  burst=opts.settings.kubeBurst, environ=env) as kube:
        await run_plugin(opts, backend(fake_devices), KubeCluster(kube))
