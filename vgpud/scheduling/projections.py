"""What the scheduler keeps of the API's objects: one projection per kind.

A pod becomes a :class:`PodInfo` once per informer event (:func:`project_pod`); its
``vgpud.io/assignment`` is decoded there, and only there, in the scheduler's process
(the extender's state and preemption, the reschedule controller, the status views and
``vgpud inspect`` all read the same value). A node becomes a :class:`NodeInfo`, a
PodDisruptionBudget a :class:`~vgpud.core.preempt.Budget`. Decoding is the core's; this
module only reads the objects' fields.

The output rows are views of these values, not projections of their own:
:class:`~vgpud.core.preempt.Holder` (preemption's input: :func:`holder`) and
:class:`~vgpud.core.report.PodRow` (the status API's and ``inspect``'s rows, made from
the ledger's entries).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from vgpud.core.admission import is_gpu_pod
from vgpud.core.codec import (
    ASSIGNMENT,
    NODE_DEVICES,
    CodecError,
    decode_assignment,
    decode_node_devices,
)
from vgpud.core.dra import MODE_DRA, NODE_MODE_LABEL
from vgpud.core.ledger import Entry
from vgpud.core.model import Defaults, NodeInventory, Placement
from vgpud.core.preempt import Budget, Holder, Requirement
from vgpud.kube.timestamps import parse_rfc3339

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
class NodeInfo:
    name: str
    labels: tuple[tuple[str, str], ...]
    inventory: NodeInventory | None
    error: str | None = None
    dra: bool = False  # its GPUs are DRA's (label vgpud.io/node-mode=dra): never counted here


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
    dra = labels.get(NODE_MODE_LABEL) == MODE_DRA
    if raw is not None and not dra:  # a DRA node's GPUs are kube-scheduler's to allocate
        try:
            inventory = decode_node_devices(raw)
        except CodecError as e:
            error = str(e)
    return NodeInfo(name, tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                    inventory, error, dra)




def pod_projection(scheduler_name: str, defaults: Defaults) -> Callable[[dict[str, Any]], PodInfo]:
    """:func:`project_pod` for the scheduler named ``scheduler_name``: the one projection
    its pod informer, and ``vgpud inspect``'s rebuild, apply."""
    return partial(project_pod, waits=waits_for_gpu(scheduler_name, defaults),
                   grants=granted_by(scheduler_name, defaults))


def holder(info: PodInfo | None, entry: Entry) -> Holder | None:
    """A ledger entry as preemption weighs it: the entry's placement (assumed or
    confirmed) with its pod's priority, labels, start and deletion. None when the pod is
    not the entry's (not in the cache yet, or any more, or replaced): never a victim."""
    if info is None or info.uid != entry.uid:
        return None
    return Holder(entry.uid, info.namespace, info.name, info.priority, entry.placement,
                  info.labels, info.start_time, info.deleting)
