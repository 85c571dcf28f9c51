"""``vgpud scheduler``: one task group for the extender role.

Children: the node, pod, PodDisruptionBudget and ResourceQuota informers (feeding
:class:`SchedulerState`; quotas: :mod:`vgpud.core.quota`), the ledger's expiry loop,
the event recorder, the leader elector (optional), the reschedule controller (gate
``Reschedule``, started once the node and pod informers have synced;
``vgpud/extender/reschedule.py``), and the HTTP server. ``/readyz`` turns true once
the informers have synced, which is when the ledger has been rebuilt from every
pod's ``vgpud.io/assignment``.

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
from functools import partial

import anyio
import structlog

from vgpud.config import Settings
from vgpud.core.allocate import Allocator
from vgpud.core.preempt import Budget
from vgpud.core.quota import Quota, quota_keys, read_quota
from vgpud.extender.metrics import Metrics
from vgpud.extender.reschedule import Planner, Rescheduler, gpu_problem
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.extender.state import (
    NodeInfo,
    PodInfo,
    SchedulerState,
    granted_by,
    project_budget,
    project_node,
    project_pod,
    waits_for_gpu,
)
from vgpud.kube.cache import Informer
from vgpud.kube.client import KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.lease import LeaderElector
from vgpud.kube.resources import NODES, PDBS, PODS, RESOURCEQUOTAS
from vgpud.kube.writes import EventRecorder, PodBinder
from vgpud.ops import Guard
from vgpud.process import cancel_on_signals, parse_listen, serve

log = structlog.get_logger()

EXPIRE_EVERY = 5.0


async def _expire(alloc: Allocator, metrics: Metrics) -> None:
    while True:
        await anyio.sleep(EXPIRE_EVERY)
        for e in alloc.expire():
            metrics.expired.inc()
            log.warning("assumption_expired", pod=e.key, node=e.placement.node,
                        why="never confirmed by the API")


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
        nodes: Informer[NodeInfo] = Informer(kube, NODES, project=project_node)
        waits = waits_for_gpu(settings.schedulerName, alloc.defaults)
        grants = granted_by(settings.schedulerName, alloc.defaults)
        pods: Informer[PodInfo] = Informer(kube, PODS, project=partial(
            project_pod, waits=waits, grants=grants))
        budgets: Informer[Budget] = Informer(kube, PDBS, project=project_budget)
        quotas: Informer[Quota] = Informer(kube, RESOURCEQUOTAS, project=partial(
            read_quota, keys=quota_keys(alloc.defaults)))
        state = SchedulerState(alloc, pod_lookup=pods.get)
        metrics.count_pending(state.pending_since)
        nodes.subscribe(state.on_node)
        pods.subscribe(state.on_pod)
        quotas.subscribe(state.on_quota)
        for informer in (nodes, pods, budgets, quotas):
            metrics.count_syncs(informer)
        events = EventRecorder(kube, component=settings.schedulerName, max_per_second=50)
        elector = None
        if leader_elect:
            elector = LeaderElector(
                kube, name=lease_name, namespace=lease_namespace,
                identity=identity or f"{socket.gethostname()}-{os.getpid()}",
                clock=lease_clock)
        sched = settings.scheduler
        resched = None
        if sched.featureGates.Reschedule:
            resched = Rescheduler(
                kube, events=events, pod_lookup=pods.get,
                planner=Planner(max_attempts=sched.rescheduleMaxAttempts,
                                bare_pods=sched.rescheduleBarePods),
                gpu_problem=lambda node, uuid: gpu_problem(alloc.cluster, node, uuid),
                qps=sched.rescheduleQPS,
                count=lambda action: metrics.reschedules.labels(action).inc(),
                is_leader=(lambda: elector.is_leader) if elector else (lambda: True))
            nodes.subscribe(resched.on_node)
            pods.subscribe(resched.on_pod)
        async with anyio.create_task_group() as tg:
            ext = Extender(state, writer=PodBinder(kube), events=events, metrics=metrics,
                           spawn=tg.start_soon,
                           budgets=lambda: [b for _, b in budgets.items()],
                           serial_binds=sched.featureGates.SerialBindNode,
                           allow_privileged=settings.allowPrivilegedGPUPods,
                           topology=sched.featureGates.GPUTopology)
            def ready() -> bool:
                return nodes.has_synced and pods.has_synced and quotas.has_synced

            apps = [make_app(ext, ready, ops=ops_at is None, guard=guard)]
            if ops_at is not None:
                apps.append(make_app(ext, ready, verbs=False, guard=guard))
            for app, (h, p) in zip(apps, [(host, port), *([ops_at] if ops_at else [])],
                                   strict=True):
                await tg.start(serve, app, h, p)
            log.info("scheduler_listening", verbs=listen, ops=metrics_listen or listen)
            tg.start_soon(cancel_on_signals, tg.cancel_scope, "scheduler_stopping")
            await tg.start(nodes.run)
            await tg.start(pods.run)
            await tg.start(budgets.run)
            await tg.start(quotas.run)
            tg.start_soon(events.run)
            if elector is not None:
                tg.start_soon(elector.run)
            tg.start_soon(_expire, alloc, metrics)
            await nodes.wait_synced()
            await pods.wait_synced()
            if resched is not None:
                tg.start_soon(resched.run)
            # The synced caches are ~1M long-lived objects; without this every full
            # collection walks them all and stalls the loop for tens of ms (p99).
            gc.collect()
            gc.freeze()
            log.info("scheduler_ready", nodes=alloc.cluster.n_nodes(),
                     pods_holding_gpus=len(alloc.ledger))
            await anyio.sleep_forever()
