"""The plugin process: the node runtime with the kubelet device plugin over it.

:func:`run_plugin` starts the node runtime (:func:`vgpud.node.runtime.run_node`: the
GPUs, the allocations, the shim, the registrar, watchdog, arbiter, health, inventory,
metrics and the watch of the node's pods), then serves one gRPC server with its kubelet
registration per served resource (:func:`vgpud.plugin.resources.served` of
``resourcePreset`` and ``compatPresets``; each a :func:`vgpud.plugin.kubelet.serve_plugin`
task that re-registers on its own after kubelet restarts), and one more for each MIG
profile resource rediscovery finds. ``task_status.started`` hands back a
:class:`Running` once kubelet has accepted every registration. Cancelling the scope
stops everything; the files of running containers stay where they are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.kube.client import KubeClient
from vgpud.node.cluster import ClusterApi, KubeCluster
from vgpud.node.devices import Changes, NodeDevices
from vgpud.node.podresources import PodResourcesClient
from vgpud.node.runtime import Node, NodeOptions, run_node
from vgpud.node.vendors import Backend, backend
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.kubelet import serve_plugin
from vgpud.plugin.resources import ServedResource, served
from vgpud.plugin.service import PluginService

log = structlog.get_logger(__name__)


@dataclass(kw_only=True)
class PluginOptions(NodeOptions):
    """The node runtime's options, and the device plugin's own."""

    device_plugin_dir: Path
    kubelet_poll: float = 1.0


@dataclass
class Running:
    devices: NodeDevices
    metrics_port: int | None
    services: dict[str, PluginService]  # by resource name, resourcePreset's first
    sockets: dict[str, Path]  # likewise
    node: Node

    @property
    def service(self) -> PluginService:
        """resourcePreset's service."""
        return next(iter(self.services.values()))

    @property
    def socket(self) -> Path:
        return next(iter(self.sockets.values()))


def _resources(node: Node) -> tuple[ServedResource, ...]:
    presets = node.settings.presets()  # resourcePreset first, under resourceNames' names
    return served(presets[0], presets[1:], split=node.split, core_scaling=node.core_scaling,
                  profiles=node.profiles())


def _service(node: Node, opts: PluginOptions, r: ServedResource) -> PluginService:
    settings = node.settings
    return PluginService(
        resource=r, node=node.name, devices=node.devices, store=node.store,
        podresources=PodResourcesClient(str(opts.pod_resources_socket), r.name),
        cluster=node.cluster, gpus=node.gpus, visible=settings.plugin.visibleDevices,
        shim=node.shim, registrar=node.registrar, reconcile_lock=node.reconcile_lock,
        arbiter=node.arbiter_dir, scheduler_name=settings.schedulerName,
        defaults=settings.defaults(), pods=node.pods)


async def run_plugin(
    opts: PluginOptions,
    gpus: Backend,
    cluster: ClusterApi,
    *,
    task_status: TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
) -> None:
    services: dict[str, PluginService] = {}
    sockets: dict[str, Path] = {}
    node: Node | None = None
    try:
        async with anyio.create_task_group() as tg:
            node = await tg.start(run_node, opts.node(), gpus, cluster)
            resources = _resources(node)
            log.info("resources_served", node=node.name, resources=[r.name for r in resources])
            services.update((r.name, _service(node, opts, r)) for r in resources)
            options = await services[resources[0].name].get_device_plugin_options(pb.Empty())

            async def offer_new(changes: Changes) -> None:
                for r in _resources(node):
                    if r.name not in services:  # a MIG profile new to this node
                        services[r.name] = _service(node, opts, r)
                        sockets[r.name] = await tg.start(_serve, services[r.name], opts,
                                                         options)
                        log.info("resource_added", resource=r.name)

            node.on_change(offer_new)
            for r in resources:  # each re-registers on its own after kubelet restarts
                sockets[r.name] = await tg.start(_serve, services[r.name], opts, options)
            node.serving()
            task_status.started(Running(node.devices, node.metrics_port, services, sockets,
                                        node))
    except ExceptionGroup as e:
        # the node did not start (no GPUs, no shim, a bad token file): its own error, as
        # before the node had a task group of its own (``vgpud plugin`` exits 2 on it)
        if node is None and len(e.exceptions) == 1:
            raise e.exceptions[0] from None
        raise
    finally:
        for s in services.values():
            s.podresources.close()


async def _serve(service: PluginService, opts: PluginOptions, options: pb.DevicePluginOptions,
                 *, task_status: TaskStatus[Path] = anyio.TASK_STATUS_IGNORED) -> None:
    r = service.resource
    await serve_plugin([service], opts.device_plugin_dir, r.socket, r.name, options,
                       poll=opts.kubelet_poll, task_status=task_status)


async def main(opts: PluginOptions, kubeconfig: str | None, fake_devices: str | None,
               environ: Mapping[str, str] | None = None) -> None:
    """The ``vgpud plugin`` process: connect, then :func:`run_plugin` until cancelled."""
    env = os.environ if environ is None else environ
    async with KubeClient.connect(kubeconfig, qps=opts.settings.kubeQPS,
                                  burst=opts.settings.kubeBurst, environ=env) as kube:
        await run_plugin(opts, backend(fake_devices), KubeCluster(kube))
