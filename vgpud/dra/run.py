"""The DRA plugin process: the node runtime with the kubelet DRA plugin over it.

:func:`run_dra` starts the node runtime (:func:`vgpud.node.runtime.run_node`: the GPUs,
the allocations, the shim, the registrar, watchdog, arbiter, health, inventory, metrics),
tells it that the driver's allocations are the adapter's to remove (:meth:`Node.own`: a
claim lives until kubelet unprepares it), reads the checkpoint of prepared claims, and
serves the DRA service and its registration (:func:`vgpud.dra.kubelet.serve_sockets`),
and, given an API client, keeps this node's ResourceSlices in the API
(:func:`vgpud.dra.publisher.run_publisher`) while kubelet holds the plugin registered.
``task_status.started`` hands back a :class:`Running` once kubelet has accepted the
registration. Cancelling the scope stops everything; the files of running containers
(allocations, CDI specs, the checkpoint) stay where they are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.core.dra import DRIVER
from vgpud.dra.kubelet import plugin_socket, registry_socket, serve_sockets
from vgpud.dra.prepare import ClaimReader, KubeClaims, Preparer
from vgpud.dra.publisher import run_publisher
from vgpud.dra.service import DraService, DraServiceV1beta1, RegistrationService
from vgpud.kube.client import KubeClient
from vgpud.node.cluster import ClusterApi, KubeCluster
from vgpud.node.runtime import Node, NodeOptions, run_node
from vgpud.node.vendors import Backend, backend
from vgpud.process import cancel_on_signals

log = structlog.get_logger(__name__)

DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"


@dataclass(kw_only=True)
class DraOptions(NodeOptions):
    """The node runtime's options, and the DRA plugin's own."""

    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)  # kubelet's --root-dir
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    driver: str = DRIVER
    kubelet_poll: float = 1.0
    node_resources: bool = False  # a DRA node runs no device plugin: no extended resources

    @property
    def plugin_socket(self) -> Path:
        return plugin_socket(self.kubelet_dir / "plugins", self.driver)

    @property
    def registry_socket(self) -> Path:
        return registry_socket(self.kubelet_dir / "plugins_registry", self.driver)

    @property
    def checkpoint(self) -> Path:
        return self.state_dir / "dra" / "checkpoint.json"


@dataclass
class Running:
    node: Node
    preparer: Preparer
    registration: RegistrationService
    plugin_socket: Path
    registry_socket: Path


async def run_dra(
    opts: DraOptions,
    gpus: Backend,
    cluster: ClusterApi,
    claims: ClaimReader,
    *,
    kube: KubeClient | None = None,
    task_status: TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
) -> None:
    node: Node | None = None
    try:
        async with anyio.create_task_group() as tg:
            node = await tg.start(run_node, opts.node(), gpus, cluster)
            node.own(opts.driver)
            settings = node.settings
            preparer = Preparer(
                node=node.name, devices=node.devices, store=node.store, gpus=node.gpus,
                claims=claims, cdi_dir=opts.cdi_dir, checkpoint=opts.checkpoint,
                registrar=node.registrar, shim=node.shim, arbiter=node.arbiter_dir,
                policy=settings.computePolicy, driver=opts.driver, spawn=tg.start_soon)
            await preparer.load()
            registration = RegistrationService(opts.driver, str(opts.plugin_socket))
            await tg.start(lambda task_status: serve_sockets(
                [DraService(preparer), DraServiceV1beta1(preparer)], [registration],
                opts.plugin_socket, opts.registry_socket, poll=opts.kubelet_poll,
                task_status=task_status))
            await registration.registered.wait()
            if kube is not None:  # the slices once kubelet has the plugin (it wipes them else)
                await tg.start(partial(run_publisher, kube, node.name, node.devices,
                                       defaults=settings.defaults(),
                                       registered=registration.registered.is_set))
            node.serving()
            task_status.started(Running(node, preparer, registration, opts.plugin_socket,
                                        opts.registry_socket))
    except ExceptionGroup as e:
        if node is None and len(e.exceptions) == 1:  # the node did not start: its own error
            raise e.exceptions[0] from None
        raise


async def main(opts: DraOptions, kubeconfig: str | None, fake_devices: str | None,
               environ: Mapping[str, str] | None = None) -> None:
    """The ``vgpud dra`` process: connect, then :func:`run_dra` until SIGTERM or SIGINT
    (which end it cleanly: its registration socket goes, so kubelet forgets the plugin at
    once rather than dialling a dead endpoint)."""
    env = os.environ if environ is None else environ
    try:
        async with KubeClient.connect(kubeconfig, qps=opts.settings.kubeQPS,
                                      burst=opts.settings.kubeBurst, environ=env) as kube, \
                anyio.create_task_group() as tg:
            tg.start_soon(cancel_on_signals, tg.cancel_scope, "dra_stopping")
            try:
                await run_dra(opts, backend(fake_devices), KubeCluster(kube), KubeClaims(kube),
                              kube=kube)
            finally:
                tg.cancel_scope.cancel()
    except ExceptionGroup as e:  # one error (the node did not start): as it is
        if len(e.exceptions) == 1:
            raise e.exceptions[0] from None
        raise
