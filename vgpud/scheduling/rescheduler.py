"""The reschedule controller's shell (gate ``Reschedule``): it feeds the
:class:`~vgpud.scheduling.reschedule.Planner` from the informers and carries out its
actions against the API (delete, recreate, events), in the leader only, at
``rescheduleQPS``. What is decided, and why, is :mod:`vgpud.scheduling.reschedule`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.kube.backoff import Backoff
from vgpud.kube.budget import RequestBudget
from vgpud.kube.cache import Added, Deleted, Event, Modified, Synced
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from vgpud.kube.resources import PODS
from vgpud.kube.writes import EventRecorder, ObjectRef, RetryPolicy
from vgpud.scheduling.projections import NodeInfo, PodInfo
from vgpud.scheduling.reschedule import (
    BURST,
    RESCHEDULED_FROM,
    Action,
    Delete,
    GiveUp,
    Leave,
    Planner,
    Recreate,
    reason_to_reschedule,
    replacement,
)

log = structlog.get_logger()


class Rescheduler:
    """Feeds :class:`Planner` from the informers and carries out its actions.

    ``on_pod``/``on_node`` are informer callbacks (cheap: they queue pod keys); ``run``
    takes keys off the queue one at a time while ``is_leader()``.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        events: EventRecorder,
        planner: Planner,
        pod_lookup: Callable[[str], PodInfo | None],
        gpu_problem: Callable[[str, str], str | None],
        qps: float = 1.0,
        burst: int = BURST,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Clock = SYSTEM_CLOCK,
        retry: RetryPolicy | None = None,
        tick: float = 1.0,
        max_backoff: float = 60.0,
        count: Callable[[str], None] = lambda action: None,
    ) -> None:
        self.kube = kube
        self.events = events
        self.planner = planner
        self.pod_lookup = pod_lookup
        self.gpu_problem = gpu_problem
        self.budget = RequestBudget(qps, burst, clock=clock)
        self.is_leader = is_leader
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.tick = tick
        self.max_backoff = max_backoff
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, Backoff] = {}  # a pod's backoff, from its first failure
        self._pending: dict[str, set[str]] = {}  # node -> keys of bound Pending pods
        self._pending_node: dict[str, str] = {}  # key -> its node in _pending
        self._wake = anyio.Event()
        self._seq = 0  # pod events seen: the order the planner matches replacements by
        self._listed = False  # the pod informer's first list is over
        self.deleted = 0
        self.recreated = 0
        self.gave_up = 0
        self.count = count  # a metric per action: deleted, recreated, gave_up

    # -- informer callbacks ------------------------------------------------------------------

    def _enqueue(self, key: str) -> None:
        self._queue[key] = None
        self._wake.set()

    def _unindex(self, key: str) -> None:
        node = self._pending_node.pop(key, None)
        if node is not None:
            keys = self._pending.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._pending[node]

    def on_pod(self, event: Event[PodInfo]) -> None:
        if isinstance(event, Synced):
            self._listed = True
            return
        if isinstance(event, Deleted):
            info = event.obj
            self._unindex(event.key)
            self.planner.forget(info.uid)
            self._queue.pop(event.key, None)
            self._retry_at.pop(event.key, None)
            self._failures.pop(event.key, None)
            return
        info = event.obj if isinstance(event, Added) else event.new
        key = event.key
        self._seq += 1
        now = self.clock.now()
        # The order of a list says nothing about when pods were created: only pods seen
        # appearing afterwards, not failing yet, can be a deleted pod's replacement.
        if isinstance(event, Added) and self._listed and info.failure is None:
            self.planner.added(info, self._seq, now)
        if info.failure is not None and info.placement is not None:
            self.planner.failed(info, self._seq, now)
        watched = (info.placement is not None and not info.deleting and bool(info.node)
                   and info.phase == "Pending")
        if watched and self._pending_node.get(key) != info.node:
            self._unindex(key)
            self._pending.setdefault(info.node, set()).add(key)
            self._pending_node[key] = info.node
        elif not watched:
            self._unindex(key)
        if info.placement is None or info.deleting or self.planner.is_done(info.uid):
            return
        moved = isinstance(event, Added) or (
            event.old.uid != info.uid or event.old.node != info.node
            or event.old.placement != info.placement or event.old.phase != info.phase)
        if info.failure is not None or (watched and moved):
            self._enqueue(key)

    def on_node(self, event: Event[NodeInfo]) -> None:
        """A node's inventory changed: look again at the pods bound there, not started."""
        if isinstance(event, Synced | Deleted):
            return
        if isinstance(event, Modified) and event.old.inventory == event.new.inventory:
            return
        for key in sorted(self._pending.get(event.key, ())):
            self._enqueue(key)

    # -- the loop ---------------------------------------------------------------------------

    def _requeue_due(self) -> float:
        """Queue the keys whose backoff ended; seconds until the next one (or the tick)."""
        now = self.clock.now()
        wait = self.tick
        for key, at in list(self._retry_at.items()):
            if at <= now:
                del self._retry_at[key]
                self._queue[key] = None
            else:
                wait = min(wait, at - now)
        return wait

    def _backoff(self, key: str, error: BaseException) -> None:
        backoff = self._failures.get(key)
        if backoff is None:  # 2, 4, 8 … max_backoff seconds
            backoff = self._failures[key] = Backoff(
                min(2.0, self.max_backoff), self.max_backoff, jitter=0.0, clock=self.clock)
        delay = backoff.next_delay()
        self._retry_at[key] = self.clock.now() + delay
        log.warning("reschedule_failed", pod=key, error=str(error) or repr(error),
                    retry_in=delay)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> NoReturn:
        task_status.started()
        while True:
            self._wake = anyio.Event()
            wait = self._requeue_due()
            if not self._queue or not self.is_leader():
                with anyio.move_on_after(max(0.01, wait)):
                    await self._wake.wait()
                continue
            key, _ = self._queue.popitem(last=False)
            try:
                await self.handle(key)
            except KubeError as e:
                self._backoff(key, e)
            except Exception as e:  # a bug or odd input must not stop the controller
                log.exception("reschedule_error", pod=key)
                self._backoff(key, e)
            else:
                self._failures.pop(key, None)

    def _decide(self, key: str) -> Action | None:
        info = self.pod_lookup(key)
        if info is None:
            return None
        why = reason_to_reschedule(info, self.gpu_problem)
        if why is None:
            return None
        return self.planner.plan(info, why, self.clock.now())

    async def handle(self, key: str) -> None:
        """Decide about one pod and carry the decision out."""
        action = self._decide(key)
        if action is not None:  # a GPU gone is a failure seen now
            self.planner.failed(action.pod, self._seq, self.clock.now())
        if isinstance(action, Delete | Recreate):
            await self.budget.acquire()
            if not self.is_leader():
                self._queue[key] = None
                return
            action = self._decide(key)  # the wait may have changed things
        if action is None:
            return
        if isinstance(action, Leave):
            log.info("reschedule_skipped", pod=action.pod.key, why=action.why,
                     because=action.because)
            self.planner.record(action, self.clock.now())
        elif isinstance(action, GiveUp):
            await self._give_up(action)
        elif isinstance(action, Delete):
            await self._delete_owned(action)
        else:
            await self._recreate(action)

    async def _event(self, pod: PodInfo, reason: str, message: str) -> None:
        ref = ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
        await self.events.record(ref, reason, message, type="Warning")

    async def _give_up(self, action: GiveUp) -> None:
        self.planner.record(action, self.clock.now())
        self.gave_up += 1
        self.count("gave_up")
        log.warning("reschedule_gave_up", pod=action.pod.key, attempts=action.attempts,
                    why=action.why)
        await self._event(action.pod, "RescheduleGaveUp",
                          f"Not rescheduled again: its lineage was rescheduled "
                          f"{action.attempts} times. The last failure: {action.why}")

    async def _delete(self, pod: PodInfo) -> bool:
        """Delete this very pod (uid precondition). False: it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": pod.uid}}
        try:
            await self.retry.run(
                lambda: self.kube.request("DELETE", PODS.object_path(pod.name, pod.namespace),
                                          body=body),
                clock=self.clock, what="delete_pod")
        except (NotFound, Conflict):  # gone, or replaced by a pod of the same name
            return False
        return True

    async def _delete_owned(self, action: Delete) -> None:
        pod = action.pod
        if not await self._delete(pod):
            self.planner.record(Leave(pod, action.why, "already gone"), self.clock.now())
            return
        self.planner.record(action, self.clock.now())
        self.deleted += 1
        self.count("deleted")
        log.warning("pod_rescheduled", pod=pod.key, owner=pod.controller,
                    attempt=action.attempt, why=action.why)
        await self._event(pod, "Rescheduled",
                          f"Deleted so that {pod.controller} recreates it and it is placed "
                          f"again (attempt {action.attempt} of "
                          f"{self.planner.max_attempts}): {action.why}")

    async def _read(self, namespace: str, name: str) -> Json:
        return await self.retry.run(
            lambda: self.kube.request("GET", PODS.object_path(name, namespace)),
            clock=self.clock, what="read_pod")

    async def _recreate(self, action: Recreate) -> None:
        pod = action.pod
        try:
            raw = await self._read(pod.namespace, pod.name)
        except NotFound:
            return
        if (raw.get("metadata") or {}).get("uid") != pod.uid:
            return  # replaced meanwhile: the new pod gets its own decision
        plan = replacement(raw, pod, action.why, max_attempts=self.planner.max_attempts)
        if isinstance(plan, GiveUp):
            await self._give_up(plan)
            return
        try:
            await self.retry.run(
                lambda: self.kube.request("POST", PODS.collection_path(pod.namespace),
                                          body=plan.body),
                clock=self.clock, what="create_pod")
        except AlreadyExists:
            existing = await self._read(pod.namespace, plan.name)
            made_by = ((existing.get("metadata") or {}).get("annotations") or {}).get(
                RESCHEDULED_FROM)
            if made_by != pod.uid:  # someone else's pod has the name: leave both be
                self.planner.record(Leave(pod, action.why, f"{plan.name} exists"),
                                    self.clock.now())
                await self._event(pod, "RescheduleGaveUp",
                                  f"Not recreated: a pod named {plan.name} already exists. "
                                  f"The failure: {action.why}")
                return
            # our own copy from an attempt cut short: finish it
        await self._delete(pod)
        self.planner.record(action, self.clock.now())
        self.recreated += 1
        self.count("recreated")
        log.warning("pod_rescheduled", pod=pod.key, new=plan.name, attempt=plan.attempt,
                    why=action.why)
        await self._event(pod, "Rescheduled",
                          f"Recreated as {plan.name} (attempt {plan.attempt} of "
                          f"{self.planner.max_attempts}): {action.why}")

