"""Keeps the allocator in step with the API server.

Informer events become ledger operations:

* a node's ``vgpud.io/node-devices`` annotation sets its inventory (missing or
  malformed: the node has no vGPUs, with one warning per change);
* a pod that is bound (``spec.nodeName``) and carries a ``vgpud.io/assignment`` for
  that node is *confirmed*; a terminated or deleted pod is *forgotten*;
* an annotated pod that is not bound yet is a bind in flight (or one that failed
  after its patch): it stays assumed until bound, or expires;
* a ResourceQuota's limits on vGPU memory and cores (:mod:`vgpud.core.quota`) are kept
  by namespace, so a changed quota counts from the next filter on.

Pods are projected to :class:`PodInfo` so the scheduler holds 50,000 pods in a few
tens of MiB. Decoding is the core's; this module only routes.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog

from vgpud.core.admission import is_gpu_pod
from vgpud.core.allocate import Allocator
from vgpud.core.codec import (
    ASSIGNMENT,
    NODE_DEVICES,
    CodecError,
    decode_assignment,
    decode_node_devices,
)
from vgpud.core.model import Defaults, Node, NodeInventory, Placement, PodRequest
from vgpud.core.preempt import Budget, Requirement
from vgpud.core.quota import Quota
from vgpud.kube.cache import Added, Deleted, Event, Modified, Synced
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.timestamps import parse_rfc3339

log = structlog.get_logger()

TERMINAL = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the scheduler keeps of a pod. The assignment is decoded here, once, and
    the same :class:`Placement` object is what the ledger holds."""

    uid: str
    namespace: str
    name: str
    node: str
    phase: str
    resource_version: str
    placement: Placement | None
    assignment_error: str | None = None
    # For preemption (pods holding GPUs only; empty otherwise): the pod's Kubernetes
    # priority (spec.priority), labels (PodDisruptionBudget selectors), start time
    # (older goes last among equals, as kube-scheduler orders victims), and whether
    # it is already being deleted (its room is leaving: never a victim).
    priority: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    start_time: str = ""
    deleting: bool = False
    # For rescheduling: the owner that recreates the pod ("ReplicaSet/web-5d9c"), and
    # why kubelet refused it, when it did (see :func:`kubelet_failure`).
    controller: str = ""
    failure: str | None = None
    # A GPU pod waiting for this scheduler (see :func:`waits_for_gpu`): its creation
    # time, epoch seconds (-1 when the object has none); 0 for every other pod.
    pending_since: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Refused:
    """A GPU pod the last filter found no node for, and why (for the status page)."""

    uid: str
    key: str
    reason: str
    since: str  # RFC 3339: when filter first refused it
    priority: int  # nvidia.com/vgpu-priority


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: tuple[tuple[str, str], ...]
    inventory: NodeInventory | None
    error: str | None = None


PodFilter = Callable[[dict[str, Any]], bool]


def waits_for_gpu(scheduler_name: str, defaults: Defaults) -> PodFilter:
    """Is an unbound pod one this scheduler must place on a GPU? It names this
    scheduler and asks for a vGPU (a resource of an enabled preset)."""
    def check(obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("schedulerName") == scheduler_name and is_gpu_pod(obj, defaults)

    return check


def granted_by(scheduler_name: str, defaults: Defaults) -> PodFilter:
    """Could this scheduler have granted a pod its assignment? Only to a pod that names
    this scheduler and asks for a vGPU (issue 23, finding 2: a plain pod, or one of
    another scheduler, bound by its own ``nodeName`` with an assignment claiming every
    GPU of a node, held them all in the ledger and made the node unschedulable)."""
    return waits_for_gpu(scheduler_name, defaults)


NOT_GRANTED = ("not a grant of this scheduler: the pod does not name it or asks for no "
               "vGPU, so its assignment holds nothing")


def _created(meta: dict[str, Any]) -> float:
    try:
        return parse_rfc3339(str(meta["creationTimestamp"])).timestamp()
    except (KeyError, ValueError):
        return -1.0


def project_pod(obj: dict[str, Any], waits: PodFilter | None = None,
                grants: PodFilter | None = None) -> PodInfo:
    """The pod as the scheduler keeps it; ``waits`` (:func:`waits_for_gpu`) marks the
    pods counted as pending (unbound, not terminated, not being deleted); ``grants``
    (:func:`granted_by`) the pods whose assignment can be this scheduler's."""
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    raw = ann.get(ASSIGNMENT)
    placement, error = None, None
    if raw is not None and grants is not None and not grants(obj):
        error = NOT_GRANTED
    elif raw is not None:
        try:
            placement = decode_assignment(raw)
        except CodecError as e:
            error = str(e)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    holds = placement is not None
    labels = (meta.get("labels") or {}) if holds else {}
    owner = ""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            owner = f"{ref.get('kind')}/{ref.get('name')}"
    prio = spec.get("priority")
    return PodInfo(
        uid=str(meta.get("uid") or ""),
        namespace=sys.intern(str(meta.get("namespace") or "default")),
        name=str(meta.get("name") or ""),
        node=sys.intern(str((obj.get("spec") or {}).get("nodeName") or "")),
        phase=sys.intern(str((obj.get("status") or {}).get("phase") or "")),
        resource_version=str(meta.get("resourceVersion") or ""),
        placement=placement,
        assignment_error=error,
        priority=prio if isinstance(prio, int) and not isinstance(prio, bool) else 0,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(
            labels, dict) else (),
        start_time=str(status.get("startTime") or "") if holds else "",
        deleting=bool(meta.get("deletionTimestamp")),
        controller=sys.intern(owner) if owner else "",
        failure=kubelet_failure(status) if raw is not None and error != NOT_GRANTED else None,
        pending_since=_created(meta) if (
            waits is not None and not spec.get("nodeName") and not meta.get("deletionTimestamp")
            and status.get("phase") in (None, "", "Pending") and waits(obj)) else 0.0,
    )


ADMISSION_FAILURES = frozenset({"UnexpectedAdmissionError"})
# kubelet's waiting reasons when creating a container failed before it ran: a failed
# PreStartContainer (the device manager's run options) surfaces as the first.
START_FAILURES = frozenset({"CreateContainerConfigError", "CreateContainerError",
                            "RunContainerError"})


def kubelet_failure(status: dict[str, Any]) -> str | None:
    """Why kubelet refused a GPU pod, or None: the pod failed admission
    (``UnexpectedAdmissionError``: Allocate failed), or a container could not be
    created because the device plugin's ``PreStartContainer`` failed."""
    if status.get("phase") == "Failed" and status.get("reason") in ADMISSION_FAILURES:
        return f"{status.get('reason')}: {status.get('message') or 'kubelet gave no message'}"
    for kind in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(kind) or []:
            waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
            msg = str(waiting.get("message") or "")
            if waiting.get("reason") in START_FAILURES and "PreStartContainer" in msg:
                return f"{waiting.get('reason')} ({cs.get('name')}): {msg}"
    return None


def project_budget(obj: dict[str, Any]) -> Budget:
    """A policy/v1 PodDisruptionBudget as preemption reads it: an empty selector selects
    every pod of its namespace, a missing one none (:class:`Budget`). A selector that
    cannot be read (an unknown operator) selects nothing, as kube-scheduler treats it."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    sel = spec.get("selector")
    labels: tuple[tuple[str, str], ...] = ()
    exprs: list[Requirement] = []
    ok = isinstance(sel, dict)
    if isinstance(sel, dict):
        ml = sel.get("matchLabels") or {}
        ok = isinstance(ml, dict)
        labels = tuple(sorted((str(k), str(v)) for k, v in ml.items())) if ok else ()
        for e in sel.get("matchExpressions") or []:
            op = e.get("operator") if isinstance(e, dict) else None
            if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
                ok = False
                break
            exprs.append(Requirement(str(e.get("key") or ""), op,
                                     tuple(str(v) for v in e.get("values") or ())))
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods") or {}
    return Budget(
        namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or ""),
        match_labels=labels if ok else (), match_expressions=tuple(exprs) if ok else (),
        disruptions_allowed=allowed if isinstance(allowed, int) else 0,
        disrupted=frozenset(disrupted) if isinstance(disrupted, dict) else frozenset(),
        selects_nothing=not ok)


def project_node(obj: dict[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    name = sys.intern(str(meta.get("name") or ""))
    raw = ann.get(NODE_DEVICES)
    inventory, error = None, None
    if raw is not None:
        try:
            inventory = decode_node_devices(raw)
        except CodecError as e:
            error = str(e)
    return NodeInfo(name, tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                    inventory, error)


class SchedulerState:
    """The allocator, fed by node and pod events; the extender's routes read it."""

    def __init__(self, alloc: Allocator, *, request_cache: int = 20_000,
                 pod_lookup: Callable[[str], PodInfo | None] = lambda key: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """``pod_lookup`` finds a pod's projection by ``namespace/name``: the pod
        informer's own cache (``Informer.get``), so pods are not indexed twice;
        ``clock`` dates the pods that carry no creation time."""
        self.alloc = alloc
        self.clock = clock
        self.pod_lookup = pod_lookup
        self.bad_assignments: set[str] = set()
        self.bad_nodes: dict[str, str] = {}
        self._requests: OrderedDict[str, PodRequest] = OrderedDict()
        self._request_cache = request_cache
        # pods filter found no node for, until they bind or go (bounded like requests)
        self.refused: OrderedDict[str, Refused] = OrderedDict()
        # GPU pods waiting to be placed (PodInfo.pending_since): uid -> creation time
        self.pending: dict[str, float] = {}
        # ResourceQuotas that bound vGPU memory or cores: namespace -> name -> quota
        self.quotas: dict[str, dict[str, Quota]] = {}

    # -- requests seen at filter time, for bind ----------------------------------------------

    def remember(self, req: PodRequest) -> None:
        self._requests[req.uid] = req
        self._requests.move_to_end(req.uid)
        while len(self._requests) > self._request_cache:
            self._requests.popitem(last=False)

    def request(self, uid: str) -> PodRequest | None:
        return self._requests.get(uid)

    def refuse(self, req: PodRequest, reason: str, now: str) -> None:
        """Filter found no node for ``req``: remember why (the first time's date)."""
        old = self.refused.pop(req.uid, None)
        self.refused[req.uid] = Refused(req.uid, req.key, reason,
                                        old.since if old else now, req.priority)
        while len(self.refused) > self._request_cache:
            self.refused.popitem(last=False)

    # -- informer events --------------------------------------------------------------------

    def on_node(self, event: Event[NodeInfo]) -> None:
        if isinstance(event, Synced):
            return
        if isinstance(event, Deleted):
            self.alloc.remove_node(event.key)
            self.bad_nodes.pop(event.key, None)
            return
        info = event.obj if isinstance(event, Added) else event.new
        if info.error is not None:
            if self.bad_nodes.get(info.name) != info.error:
                log.warning("node_inventory_invalid", node=info.name, error=info.error)
            self.bad_nodes[info.name] = info.error
            self.alloc.remove_node(info.name)
            return
        self.bad_nodes.pop(info.name, None)
        if info.inventory is None:
            self.alloc.remove_node(info.name)
            return
        if isinstance(event, Modified) and event.old.inventory == info.inventory \
                and event.old.labels == info.labels:
            return  # a heartbeat or status change: nothing the allocator reads
        self.alloc.set_node(Node(info.name, info.inventory, info.labels))

    def on_quota(self, event: Event[Quota]) -> None:
        if isinstance(event, Synced):
            return
        q = event.obj if isinstance(event, (Added, Deleted)) else event.new
        held = self.quotas.get(q.namespace, {})
        old = held.pop(q.name, None)
        if not isinstance(event, Deleted) and (q.limits or q.errors):
            held[q.name] = q
            if q.errors and (old is None or old.errors != q.errors):
                for e in q.errors:
                    log.warning("quota_invalid", quota=q.key, error=e)
        if held:
            self.quotas[q.namespace] = held
        else:
            self.quotas.pop(q.namespace, None)

    def quotas_in(self, namespace: str) -> list[Quota]:
        """The namespace's ResourceQuotas that bound vGPU memory or cores."""
        held = self.quotas.get(namespace)
        return list(held.values()) if held else []

    def on_pod(self, event: Event[PodInfo]) -> None:
        if isinstance(event, Synced):
            return
        if isinstance(event, Deleted):
            info = event.obj
            self.pending.pop(info.uid, None)
            self.bad_assignments.discard(info.uid)
            self._requests.pop(info.uid, None)
            self.refused.pop(info.uid, None)
            if self.alloc.forget(info.uid):
                log.debug("pod_released", pod=info.key, why="deleted")
            return
        info = event.obj if isinstance(event, Added) else event.new
        if info.pending_since:
            # no creation time: count from when the scheduler first saw it
            self.pending.setdefault(info.uid, info.pending_since if info.pending_since > 0
                                    else self.clock.wall().timestamp())
        else:
            self.pending.pop(info.uid, None)
        if info.phase in TERMINAL or info.node:
            self.refused.pop(info.uid, None)
        if info.phase in TERMINAL:
            if self.alloc.forget(info.uid):
                log.debug("pod_released", pod=info.key, why=info.phase)
            self._requests.pop(info.uid, None)
            return
        if info.assignment_error is not None:
            if info.uid not in self.bad_assignments:
                log.warning("pod_assignment_invalid", pod=info.key, error=info.assignment_error)
            self.bad_assignments.add(info.uid)
            return
        self.bad_assignments.discard(info.uid)
        placement = info.placement
        if placement is None or not info.node:
            return
        if placement.node != info.node:
            log.warning("pod_assignment_other_node", pod=info.key, bound=info.node,
                        assigned=placement.node)
            return
        # event.key is the informer's own "namespace/name" string: the ledger shares it
        # rather than holding a copy per pod
        self.alloc.confirm(info.uid, event.key, placement)

    def pending_since(self) -> Collection[float]:
        """Creation times of the GPU pods waiting to be placed (for the metrics)."""
        return self.pending.values()

    def pod_by_name(self, namespace: str, name: str) -> PodInfo | None:
        return self.pod_lookup(f"{namespace}/{name}")
