"""Reschedule: get the GPU pods that kubelet refused placed again (gate ``Reschedule``).

kubelet can still refuse a pod the scheduler placed: the device plugin's Allocate
failed (the pod ends ``Failed`` with reason ``UnexpectedAdmissionError``), its
``PreStartContainer`` failed (a container waits with ``CreateContainerConfigError``
and kubelet's text "device plugin PreStartContainer rpc failed ..."), or a GPU the
pod was bound to left the node's inventory, or turned unhealthy, before the pod
started. Nothing in Kubernetes places such a pod again. This controller does, in the
leader only.

Candidates are pods carrying a ``vgpud.io/assignment`` (``PodInfo.placement``), bound
and not being deleted, with ``PodInfo.failure`` set, or ``Pending`` with a GPU of
their assignment gone (:func:`reason_to_reschedule`). Each candidate goes through one
decision (:class:`Planner`, pure, time passed in), then the shell executes it:

* **owned by a controller** (ReplicaSet, StatefulSet, Job, ...): :class:`Delete` it
  (with ``preconditions.uid``, so a replacement of the same name is never deleted)
  and let its controller recreate it; the new pod is scheduled like any other.
* **bare** and ``rescheduleBarePods`` on: :class:`Recreate` it. The pod is read back,
  a copy is created under the name ``<name>-r<N>`` (replacing an earlier ``-r<k>``
  of ours) without ``spec.nodeName``, without the assignment, and with
  ``vgpud.io/reschedule-attempts: N``; only then is the old pod deleted.
* **bare** with ``rescheduleBarePods`` off (the default), or a mirror pod (owned by
  its Node): :class:`Leave` it. Recreating a bare pod changes its name, so whatever
  named it (a user's ``kubectl logs``, a script, a Service selecting by name) loses
  it, and whoever created it by hand may want to see the failure.
* after ``rescheduleMaxAttempts`` reschedules of one lineage: :class:`GiveUp`: one
  Warning event ``RescheduleGaveUp`` on the pod, naming the last failure, and
  nothing more.

Every delete or recreate takes a token from a bucket of ``rescheduleQPS`` (burst
:data:`BURST`) and writes a Warning event ``Rescheduled`` on the pod with kubelet's
reason. A pod is decided once (its uid is remembered until it is deleted); API
failures put it back in the queue with a capped backoff.

**Counting attempts.** A bare pod's lineage carries its count in the annotation on
each copy we create, so it survives restarts. A controller's replacement is created
by the controller, under a name we cannot predict, so the count is kept in memory per
owner (``namespace/Kind/name``): each deletion leaves an *expectation* "a replacement
of attempt N is coming"; a failing pod of that owner that appeared after the deleted
pod failed takes the highest one and is attempt N+1. Pods that were there before are
lineages of their own, so ten replicas failing together are ten lineages, not one
(see :class:`Planner` for why the order is reliable). An owner that gave up stays
given up while its pods keep failing. An owner's record is forgotten after
:data:`DECAY` seconds without a failure, and at most :data:`MAX_OWNERS` are kept;
**a scheduler restart, or a new leader, resets these counts** (each controller-owned
lineage may then be tried ``rescheduleMaxAttempts`` more times).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.core.cluster import Cluster
from vgpud.core.codec import ASSIGNMENT
from vgpud.extender.state import NodeInfo, PodInfo
from vgpud.kube.backoff import Backoff
from vgpud.kube.budget import RequestBudget
from vgpud.kube.cache import Added, Deleted, Event, Modified, Synced
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from vgpud.kube.resources import PODS
from vgpud.kube.writes import EventRecorder, ObjectRef, RetryPolicy

log = structlog.get_logger()

ATTEMPTS = "vgpud.io/reschedule-attempts"
RESCHEDULED_FROM = "vgpud.io/rescheduled-from"

BURST = 5
DECAY = 600.0  # seconds without a failure after which an owner's count is forgotten
MAX_OWNERS = 10_000
MAX_DONE = 100_000
MAX_NAME = 253
_OUR_SUFFIX = re.compile(r"-r\d+$")
# Fields of a pod spec the API server (or an admission plugin) sets, that a new pod must
# not carry: the binding, ephemeral containers (not allowed at create), and priority and
# preemption policy (computed again from priorityClassName; a stale copy is refused).
_DROPPED_SPEC = ("nodeName", "ephemeralContainers", "priority", "preemptionPolicy")


# -- the decision (pure) ------------------------------------------------------------------------


def reason_to_reschedule(pod: PodInfo,
                         gpu_problem: Callable[[str, str], str | None]) -> str | None:
    """Why ``pod`` should be placed again, or None. ``gpu_problem(node, uuid)`` says what
    is wrong with one GPU of a node (None: nothing, or the node is not known)."""
    if pod.placement is None or pod.deleting or not pod.node:
        return None
    if pod.failure is not None:
        return pod.failure
    if pod.phase != "Pending" or pod.placement.node != pod.node:
        return None
    for uuid in sorted(pod.placement.charge()):
        problem = gpu_problem(pod.node, uuid)
        if problem is not None:
            return problem
    return None


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the pod; its controller recreates it. ``attempt`` counts from 1."""

    pod: PodInfo
    why: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Recreate:
    """A bare pod: read it, create a copy (:func:`replacement`), delete it."""

    pod: PodInfo
    why: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Rescheduled ``attempts`` times already: one event, then nothing."""

    pod: PodInfo
    why: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Leave:
    """Not ours to reschedule (``because`` says why); logged once."""

    pod: PodInfo
    why: str
    because: str


Action = Delete | Recreate | GiveUp | Leave


@dataclass(frozen=True, slots=True)
class Copy:
    """A bare pod's replacement: the body to create, its name and its attempt number."""

    body: Json
    name: str
    attempt: int


@dataclass(frozen=True, slots=True)
class _Expected:
    """A deleted pod's replacement, to come: its lineage's attempt so far, where the
    deleted pod's failure fell in the pod event order, and when it was deleted."""

    attempt: int
    after: int
    at: float


@dataclass(slots=True)
class _Owner:
    """One controller's lineages: the replacements expected, and whether it gave up."""

    expected: list[_Expected] = field(default_factory=list)
    gave_up: bool = False
    last: float = 0.0


class Planner:
    """Decides what to do with a pod that kubelet refused (see the module docstring).

    The shell reports what it observes, in the order of the pod events (``seq``, any
    increasing number): :meth:`added` for each pod seen appearing (after the informer's
    first list, and not failing yet), :meth:`failed` for each failing one. ``plan``
    then reads state only; ``record`` commits an action once it was carried out, so an
    API failure leaves nothing behind and the pod is planned again.

    A replacement is recognised by order: a pod of the owner that was *added after* the
    failure of a pod we deleted. (A ReplicaSet makes its replacement for a Failed pod
    as soon as it sees the failure, before our delete; the API server orders the two
    writes, and the watch delivers them in that order.) Pods that existed before are
    lineages of their own, so replicas that fail together are counted apart.
    """

    def __init__(self, *, max_attempts: int = 3, bare_pods: bool = False,
                 decay: float = DECAY, max_owners: int = MAX_OWNERS,
                 max_done: int = MAX_DONE) -> None:
        self.max_attempts = max_attempts
        self.bare_pods = bare_pods
        self.decay = decay
        self.max_owners = max_owners
        self.max_done = max_done
        self._owners: OrderedDict[str, _Owner] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()
        # Pod order, kept only for pods of owners with a recent failure (bounded).
        self._born: OrderedDict[str, int] = OrderedDict()
        self._failed: OrderedDict[str, int] = OrderedDict()
        self._seq = 0

    @staticmethod
    def owner_key(pod: PodInfo) -> str:
        return f"{pod.namespace}/{pod.controller}"

    def is_done(self, uid: str) -> bool:
        return uid in self._done

    def _owner(self, key: str, now: float) -> _Owner | None:
        owner = self._owners.get(key)
        if owner is None:
            return None
        if now - owner.last > self.decay:
            del self._owners[key]
            return None
        owner.expected = [e for e in owner.expected if now - e.at <= self.decay]
        return owner

    def _remember(self, table: OrderedDict[str, int], uid: str, seq: int) -> None:
        table.setdefault(uid, seq)
        while len(table) > self.max_done:
            table.popitem(last=False)

    # -- observations --------------------------------------------------------------------------

    def added(self, pod: PodInfo, seq: int, now: float) -> None:
        """A pod appeared (an informer ``Added``)."""
        self._seq = max(self._seq, seq)
        if pod.controller and self._owner(self.owner_key(pod), now) is not None:
            self._remember(self._born, pod.uid, seq)

    def failed(self, pod: PodInfo, seq: int, now: float) -> None:
        """``pod`` is seen failing (every time; the first one counts)."""
        self._seq = max(self._seq, seq)
        if not pod.controller:
            return
        self._remember(self._failed, pod.uid, seq)
        key = self.owner_key(pod)
        owner = self._owner(key, now)
        if owner is None:
            owner = self._owners[key] = _Owner()
        owner.last = now
        self._owners.move_to_end(key)
        while len(self._owners) > self.max_owners:
            self._owners.popitem(last=False)

    # -- decisions -----------------------------------------------------------------------------

    def _matching(self, owner: _Owner | None, uid: str) -> list[_Expected]:
        born = self._born.get(uid)
        if owner is None or born is None:
            return []
        return [e for e in owner.expected if e.after < born]

    def plan(self, pod: PodInfo, why: str, now: float) -> Action | None:
        if pod.uid in self._done:
            return None
        if not pod.controller:
            if not self.bare_pods:
                return Leave(pod, why, "a bare pod (no controller), and rescheduleBarePods "
                                       "is off")
            return Recreate(pod, why)
        if pod.controller.startswith("Node/"):
            return Leave(pod, why, "a static pod: kubelet owns it")
        owner = self._owner(self.owner_key(pod), now)
        if owner is not None and owner.gave_up:
            return GiveUp(pod, why, self.max_attempts)
        prior = max((e.attempt for e in self._matching(owner, pod.uid)), default=0)
        if prior >= self.max_attempts:
            return GiveUp(pod, why, prior)
        return Delete(pod, why, prior + 1)

    def record(self, action: Action, now: float) -> None:
        """``action`` was carried out (or must not be tried again)."""
        pod = action.pod
        self._done[pod.uid] = None
        self._done.move_to_end(pod.uid)
        while len(self._done) > self.max_done:
            self._done.popitem(last=False)
        if not pod.controller or isinstance(action, Recreate | Leave):
            return
        key = self.owner_key(pod)
        owner = self._owner(key, now) or _Owner()
        if isinstance(action, Delete):
            for e in self._matching(owner, pod.uid):
                if e.attempt == action.attempt - 1:
                    owner.expected.remove(e)
                    break
            after = self._failed.get(pod.uid, self._seq)
            owner.expected.append(_Expected(action.attempt, after, now))
        else:  # GiveUp
            owner.gave_up = True
            owner.expected.clear()
        owner.last = now
        self._owners[key] = owner
        self._owners.move_to_end(key)
        while len(self._owners) > self.max_owners:
            self._owners.popitem(last=False)

    def forget(self, uid: str) -> None:
        """The pod is gone from the API."""
        self._done.pop(uid, None)
        self._born.pop(uid, None)
        self._failed.pop(uid, None)


def attempts_of(pod: Json) -> int:
    """The reschedule count a pod carries (0: none, or not a number)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ATTEMPTS)
    try:
        return max(0, int(str(raw)))
    except ValueError:
        return 0


def replacement_name(name: str, attempt: int, *, ours: bool) -> str:
    """``<name>-r<attempt>``; an ``-r<k>`` we added before is replaced, not stacked.
    Cut to the API's 253 characters, ending in an alphanumeric."""
    base = _OUR_SUFFIX.sub("", name) if ours else name
    suffix = f"-r{attempt}"
    return base[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def replacement(pod: Json, info: PodInfo, why: str, *, max_attempts: int) -> Copy | GiveUp:
    """A bare pod's next copy, or the end of its lineage."""
    prior = attempts_of(pod)
    if prior >= max_attempts:
        return GiveUp(info, why, prior)
    meta = pod.get("metadata") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()
                   if k != ASSIGNMENT}
    annotations[ATTEMPTS] = str(prior + 1)
    annotations[RESCHEDULED_FROM] = info.uid
    name = replacement_name(info.name, prior + 1, ours=ATTEMPTS in (meta.get("annotations") or {}))
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _DROPPED_SPEC}
    new_meta: Json = {"name": name, "namespace": info.namespace, "annotations": annotations}
    if meta.get("labels"):
        new_meta["labels"] = dict(meta["labels"])
    body: Json = {"apiVersion": "v1", "kind": "Pod", "metadata": new_meta, "spec": spec}
    return Copy(body, name, prior + 1)


def gpu_problem(cluster: Cluster, node: str, uuid: str) -> str | None:
    """What is wrong with GPU ``uuid`` of ``node`` in the allocator's view: gone from the
    node's inventory, or reported unhealthy. None when it is fine or the node is not
    known (no inventory, or a malformed one: nothing to compare with)."""
    idx = cluster.node_index.get(node)
    if idx is None:
        return None
    if cluster.capacity(node, uuid) is None:
        return f"GPU {uuid} is no longer reported by node {node}"
    n = cluster.nodes[idx]
    for g in n.inventory.devices if n is not None else ():
        if g.uuid == uuid and not g.healthy:
            return f"GPU {uuid} of node {node} is reported unhealthy"
    return None


# -- the shell ------------------------------------------------------------------------------------


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

