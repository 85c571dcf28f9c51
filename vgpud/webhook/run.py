"""``vgpud webhook``: one task group for the admission role.

Children: the certificate bootstrap's renewal loop (with ``--bootstrap-secret``), the
certificate file watcher, the node informer that keeps the :class:`Catalogue` of the
cluster's GPUs, and the HTTPS (and ops) servers. Ready once the certificate is
loaded: the catalogue is best effort (until the node list arrives, requests are not
checked against the cluster's GPU sizes), so an API server hiccup never stops
admission of GPU pods.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.config import Settings
from vgpud.core.admission import AdmissionPolicy, Catalogue, profile
from vgpud.core.codec import NODE_DEVICES, CodecError, decode_node_devices
from vgpud.core.model import GpuUsage
from vgpud.core.translate import Classes, Shape
from vgpud.kube.cache import Added, Deleted, Event, Informer, Modified
from vgpud.kube.client import KubeClient
from vgpud.kube.errors import AlreadyExists, KubeError, NotFound
from vgpud.kube.resources import CLAIMTEMPLATES, NODES
from vgpud.ops import Guard
from vgpud.process import cancel_on_signals, parse_listen, serve
from vgpud.webhook.bootstrap import Bootstrap, service_names
from vgpud.webhook.server import Metrics, TemplateError, make_app
from vgpud.webhook.tls import TlsFiles

log = structlog.get_logger(__name__)

Profile = tuple[GpuUsage, ...]


def node_profile(obj: dict[str, Any]) -> Profile | None:
    """The informer's projection: a node's GPU profile, or None (no or bad inventory)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(NODE_DEVICES)
    if raw is None:
        return None
    try:
        return profile(decode_node_devices(raw))
    except CodecError:
        return None


class Gpus:
    """The cluster's GPU node profiles, counted, fed by node events."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._count: Counter[Profile] = Counter()
        self.catalogue = Catalogue({})

    def on_node(self, event: Event[Profile | None]) -> None:
        old = new = None
        if isinstance(event, Added):
            new = event.obj
        elif isinstance(event, Modified):
            old, new = event.old, event.new
        elif isinstance(event, Deleted):
            old = event.obj
        else:
            return
        if old == new:
            return
        if old:
            self._count[old] -= 1
        if new:
            self._count[new] += 1
        self._count = +self._count  # drop zeros
        self.catalogue = Catalogue(dict(self._count))
        self.metrics.gpu_nodes.set(sum(self._count.values()))


class ClaimTemplates:
    """Makes the ResourceClaimTemplates of pods headed to DRA nodes
    (:mod:`vgpud.core.translate`): one GET when the template is there, else a create; a
    template of that name whose request is not the shape's (made by someone else) is
    refused, never used."""

    def __init__(self, kube: KubeClient, classes: Classes) -> None:
        self.kube = kube
        self.classes = classes

    async def __call__(self, namespace: str, shapes: tuple[Shape, ...]) -> None:
        for shape in shapes:
            await self._one(namespace, shape)

    async def _one(self, namespace: str, shape: Shape) -> None:
        want = shape.template(namespace, self.classes)
        name = shape.template_name
        try:
            try:
                have = await self.kube.request(
                    "GET", CLAIMTEMPLATES.object_path(name, namespace))
            except NotFound:
                try:
                    await self.kube.request(
                        "POST", CLAIMTEMPLATES.collection_path(namespace), body=want)
                    log.info("claim_template_created", namespace=namespace, name=name)
                    return
                except AlreadyExists:  # made meanwhile (another replica, another pod)
                    have = await self.kube.request(
                        "GET", CLAIMTEMPLATES.object_path(name, namespace))
        except KubeError as e:
            raise TemplateError(f"{namespace}/{shape.template_name}: {e}") from None
        if not shape.made(have, self.classes):
            raise TemplateError(
                f"{namespace}/{shape.template_name} exists with another request than vgpud "
                f"makes for this shape; delete it (vgpud makes it again) or rename it")


@dataclass(frozen=True)
class BootstrapOptions:
    secret: str
    namespace: str
    service: str
    configuration: str | None


@dataclass(frozen=True)
class Serving:
    """What the started webhook hands back (tests use the ports)."""

    port: int
    ops_port: int | None
    tls: TlsFiles


async def run_webhook(settings: Settings, *, kubeconfig: str | None, listen: str,
                      tls_cert: Path, tls_key: Path, metrics_listen: str | None = None,
                      bootstrap: BootstrapOptions | None = None, handle_signals: bool = True,
                      tls_poll: float = 5.0,
                      task_status: TaskStatus[Serving] = anyio.TASK_STATUS_IGNORED) -> None:
    host, port = parse_listen(listen)
    ops_at = parse_listen(metrics_listen, "--metrics-listen") if metrics_listen else None
    guard = Guard.from_settings(settings.ops)  # a bad token file stops the start here
    classes = Classes(vgpu=settings.dra.vgpuClass, gpu=settings.dra.gpuClass)
    policy = AdmissionPolicy(settings.defaults(), settings.schedulerName,
                             settings.allowPrivilegedGPUPods, dra_mode=settings.dra.translate,
                             dra_classes=classes)
    metrics = Metrics()
    gpus = Gpus(metrics)
    async with KubeClient.connect(kubeconfig, qps=settings.kubeQPS,
                                  burst=settings.kubeBurst) as kube:
        boot = None
        if bootstrap is not None:
            boot = Bootstrap(kube, bootstrap.namespace, bootstrap.secret,
                             service_names(bootstrap.service, bootstrap.namespace),
                             tls_cert, tls_key, bootstrap.configuration)
            await boot.once()
        tls = await anyio.to_thread.run_sync(TlsFiles, tls_cert, tls_key)
        metrics.tls_loads.source = lambda: tls.loads
        nodes: Informer[Profile | None] = Informer(kube, NODES, project=node_profile)
        nodes.subscribe(gpus.on_node)

        def catalogue() -> Catalogue:
            return gpus.catalogue

        def ready() -> bool:
            return True  # the certificate loaded before the servers started

        apps = [make_app(policy, catalogue, metrics, ready, ops=ops_at is None, guard=guard,
                         templates=ClaimTemplates(kube, classes))]
        if ops_at is not None:
            apps.append(make_app(policy, catalogue, metrics, ready, reviews=False, guard=guard))
        async with anyio.create_task_group() as tg:
            sites = [await tg.start(serve, app, h, p, ssl) for app, (h, p), ssl in zip(
                apps, [(host, port), *([ops_at] if ops_at else [])], [tls.context, None],
                strict=False)]
            log.info("webhook_listening", reviews=listen, ops=metrics_listen or listen,
                     scheduler_name=policy.scheduler_name,
                     presets={p.name: p.number for p in settings.presets()})
            if handle_signals:
                tg.start_soon(cancel_on_signals, tg.cancel_scope, "webhook_stopping")
            tg.start_soon(nodes.run)
            tg.start_soon(tls.watch, tls_poll)
            if boot is not None:
                tg.start_soon(boot.run)
            task_status.started(Serving(sites[0], sites[1] if ops_at else None, tls))
