"""``vgpud scheduler``: one task group for the kube-scheduler adapter.

Children: the scheduler service (:class:`vgpud.scheduling.service.SchedulerService`:
the node, pod, PodDisruptionBudget and ResourceQuota informers feeding its state, the
ledger's expiry loop, and the reschedule controller, gate ``Reschedule``, started once
the node and pod informers have synced), the event recorder, the leader elector
(optional), and the HTTP servers. ``/readyz`` turns true once the informers have
synced, which is when the ledger has been rebuilt from every pod's
``vgpud.io/assignment``.

With several replicas (``leader_elect``) only the Lease's holder runs leader-only
work: the reschedule controller, the one writer that acts on pods it did not bind.
Every replica serves filter, prioritize and bind (kube-scheduler's own Lease picks
which replica's kube-scheduler calls its extender, and that need not be the
extender's leader) and records events.
"""

from __future__ import annotations

import gc
import os
import socket

import anyio
import structlog

from vgpud.config import Settings
from vgpud.core.allocate import Allocator
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.kube.client import KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.lease import LeaderElector
from vgpud.kube.writes import EventRecorder, PodBinder
from vgpud.ops import Guard
from vgpud.process import cancel_on_signals, parse_listen, serve
from vgpud.scheduling.service import SchedulerService

log = structlog.get_logger()


async def run_scheduler(settings: Settings, *, kubeconfig: str | None, listen: str,
                        metrics_listen: str | None = None, leader_elect: bool = False,
                        lease_namespace: str = "kube-system",
                        lease_name: str = "vgpud-scheduler", identity: str | None = None,
                        lease_clock: Clock = SYSTEM_CLOCK) -> None:
    """Serve the verbs on ``listen`` and health/metrics on ``metrics_listen`` (on
    ``listen`` too when that is not given). ``identity`` names this replica in the
    Lease (default: host name and process id); ``lease_clock`` times the election."""
    host, port = parse_listen(listen)
    ops_at = parse_listen(metrics_listen) if metrics_listen else None
    guard = Guard.from_settings(settings.ops)  # a bad token file stops the start here
    alloc = Allocator(settings.defaults(), clock=SYSTEM_CLOCK.now)
    metrics = Metrics(alloc)
    async with KubeClient.connect(kubeconfig, qps=settings.kubeQPS,
                                  burst=settings.kubeBurst) as kube:
        events = EventRecorder(kube, component=settings.schedulerName, max_per_second=50)
        elector = None
        if leader_elect:
            elector = LeaderElector(
                kube, name=lease_name, namespace=lease_namespace,
                identity=identity or f"{socket.gethostname()}-{os.getpid()}",
                clock=lease_clock)
        service = SchedulerService(
            kube, alloc, settings, events=events,
            is_leader=(lambda: elector.is_leader) if elector else (lambda: True),
            expired=lambda entry: metrics.expired.inc(),
            rescheduled=lambda action: metrics.reschedules.labels(action).inc())
        metrics.count_pending(service.state.pending_since)
        for informer in service.informers.all:
            metrics.count_syncs(informer)
        sched = settings.scheduler
        async with anyio.create_task_group() as tg:
            ext = Extender(service.state, writer=PodBinder(kube), events=events,
                           metrics=metrics, spawn=tg.start_soon,
                           budgets=service.informers.budget_list,
                           serial_binds=sched.featureGates.SerialBindNode,
                           allow_privileged=settings.allowPrivilegedGPUPods,
                           topology=sched.featureGates.GPUTopology)
            ready, shown = service.ready, service.informers.views_ready
            apps = [make_app(ext, ready, ops=ops_at is None, guard=guard, shown=shown)]
            if ops_at is not None:
                apps.append(make_app(ext, ready, verbs=False, guard=guard, shown=shown))
            for app, (h, p) in zip(apps, [(host, port), *([ops_at] if ops_at else [])],
                                   strict=True):
                await tg.start(serve, app, h, p)
            log.info("scheduler_listening", verbs=listen, ops=metrics_listen or listen)
            tg.start_soon(cancel_on_signals, tg.cancel_scope, "scheduler_stopping")
            tg.start_soon(events.run)
            if elector is not None:
                tg.start_soon(elector.run)
            await tg.start(service.run)  # returns once the ledger is rebuilt
            # The synced caches are ~1M long-lived objects; without this every full
            # collection walks them all and stalls the loop for tens of ms (p99).
            gc.collect()
            gc.freeze()
            log.info("scheduler_ready", nodes=alloc.cluster.n_nodes(),
                     pods_holding_gpus=len(alloc.ledger))
            await anyio.sleep_forever()
