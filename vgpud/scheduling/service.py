"""The scheduler service of one process: what an adapter starts, whatever its wire.

One :class:`SchedulerService` holds the allocator's state and keeps it: the informers
feeding it (:mod:`vgpud.scheduling.informers`), the ledger's expiry of assumptions no
pod event confirmed, and (gate ``Reschedule``) the reschedule controller
(:mod:`vgpud.scheduling.rescheduler`), which acts only while ``is_leader()``. The
adapter (the kube-scheduler extender: :mod:`vgpud.extender.run`) adds its wire, its
servers, its metrics (through the callbacks) and the leader election.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.config import Settings
from vgpud.core.allocate import Allocator
from vgpud.core.ledger import Entry
from vgpud.kube.client import KubeClient
from vgpud.kube.writes import EventRecorder
from vgpud.scheduling.informers import SchedulerInformers
from vgpud.scheduling.reschedule import Planner, gpu_problem
from vgpud.scheduling.rescheduler import Rescheduler

log = structlog.get_logger()

EXPIRE_EVERY = 5.0


class SchedulerService:
    """The informers, the state they feed, the expiry loop and the rescheduler.

    ``expired`` is told of each assumption that expired; ``rescheduled`` of each
    reschedule action carried out (``deleted``, ``recreated``, ``gave_up``)."""

    def __init__(self, kube: KubeClient, alloc: Allocator, settings: Settings, *,
                 events: EventRecorder, is_leader: Callable[[], bool] = lambda: True,
                 expired: Callable[[Entry], None] = lambda entry: None,
                 rescheduled: Callable[[str], None] = lambda action: None) -> None:
        self.alloc = alloc
        self.informers = SchedulerInformers(kube, alloc, settings.schedulerName,
                                            dra=settings.dra.enabled)
        self.state = self.informers.state
        self.expired = expired
        sched = settings.scheduler
        self.rescheduler: Rescheduler | None = None
        if sched.featureGates.Reschedule:
            self.rescheduler = Rescheduler(
                kube, events=events, pod_lookup=self.informers.pods.get,
                planner=Planner(max_attempts=sched.rescheduleMaxAttempts,
                                bare_pods=sched.rescheduleBarePods),
                gpu_problem=lambda node, uuid: gpu_problem(alloc.cluster, node, uuid),
                qps=sched.rescheduleQPS, count=rescheduled, is_leader=is_leader)
            self.informers.nodes.subscribe(self.rescheduler.on_node)
            self.informers.pods.subscribe(self.rescheduler.on_pod)

    def ready(self) -> bool:
        """The ledger is rebuilt and the quotas known: decisions may be made."""
        return self.informers.ready()

    async def _expire(self) -> NoReturn:
        while True:
            await anyio.sleep(EXPIRE_EVERY)
            for e in self.alloc.expire():
                self.expired(e)
                log.warning("assumption_expired", pod=e.key, node=e.placement.node,
                            why="never confirmed by the API")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Run it all; started once the node and pod informers have listed (the ledger
        is rebuilt from every pod's assignment), when the rescheduler starts too."""
        async with anyio.create_task_group() as tg:
            await self.informers.start(tg)
            tg.start_soon(self._expire)
            await self.informers.wait_synced()
            if self.rescheduler is not None:
                tg.start_soon(self.rescheduler.run)
            task_status.started()
