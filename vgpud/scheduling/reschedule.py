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
decision (:class:`Planner`, pure, time passed in: this module), then the shell
(:class:`vgpud.scheduling.rescheduler.Rescheduler`) carries it out:

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

from vgpud.core.cluster import Cluster
from vgpud.core.codec import ASSIGNMENT
from vgpud.kube.client import Json
from vgpud.scheduling.projections import PodInfo

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
class _Lineages:
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
        self._owners: OrderedDict[str, _Lineages] = OrderedDict()
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

    def _owner(self, key: str, now: float) -> _Lineages | None:
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
            owner = self._owners[key] = _Lineages()
        owner.last = now
        self._owners.move_to_end(key)
        while len(self._owners) > self.max_owners:
            self._owners.popitem(last=False)

    # -- decisions -----------------------------------------------------------------------------

    def _matching(self, owner: _Lineages | None, uid: str) -> list[_Expected]:
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
        owner = self._owner(key, now) or _Lineages()
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
