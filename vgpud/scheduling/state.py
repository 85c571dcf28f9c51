"""Keeps the allocator in step with the API server: the ledger's rebuild.

Informer events (of :mod:`vgpud.scheduling.projections`' values) become ledger
operations:

* a node's ``vgpud.io/node-devices`` annotation sets its inventory (missing or
  malformed: the node has no vGPUs, with one warning per change);
* a pod that is bound (``spec.nodeName``) and carries a ``vgpud.io/assignment`` for
  that node is *confirmed*; a terminated or deleted pod is *forgotten*;
* an annotated pod that is not bound yet is a bind in flight (or one that failed
  after its patch): it stays assumed until bound, or expires;
* a ResourceQuota's limits on vGPU memory and cores (:mod:`vgpud.core.quota`) are kept
  by namespace, so a changed quota counts from the next filter on;
* vgpud's ResourceSlices and the ResourceClaims allocated from them (when DRA is on) are
  kept in :class:`DraNodes`, for the status page to show the DRA nodes beside the
  others; kube-scheduler places on those nodes, so they never enter the ledger.

The scheduler feeds it from its informers (:mod:`vgpud.scheduling.informers`);
``vgpud inspect`` from one list of nodes and pods (:func:`rebuild`), so both lay out
the same ledger. Pods are projected to :class:`PodInfo` so the scheduler holds 50,000
pods in a few tens of MiB. Decoding is the projections'; this module only routes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from vgpud.core.allocate import Allocator
from vgpud.core.dra_report import DraRows, dra_rows
from vgpud.core.model import Node, PodRequest
from vgpud.core.quota import Quota
from vgpud.kube.cache import Added, Deleted, Event, Modified, Synced
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.scheduling.projections import TERMINAL, NodeInfo, PodInfo

log = structlog.get_logger()


class Warn(Protocol):
    """Where the state reports what it cannot use (structlog's ``log.warning`` shape)."""

    def __call__(self, event: str, /, **fields: Any) -> Any: ...


def _log_warning(event: str, /, **fields: Any) -> None:
    log.warning(event, **fields)  # looked up at each call: the log's configuration then


@dataclass(frozen=True, slots=True)
class Refused:
    """A GPU pod the last filter found no node for, and why (for the status page)."""

    uid: str
    key: str
    reason: str
    since: str  # RFC 3339: when filter first refused it
    priority: int  # nvidia.com/vgpu-priority


class DraNodes:
    """The DRA nodes' GPUs and the pods their claims are reserved for, as the API shows
    them: read from a ResourceSlice and a ResourceClaim informer's own caches (``slices``
    and ``claims``, projected by :func:`~vgpud.core.dra_report.slice_projection` and
    :func:`~vgpud.core.dra_report.claim_projection`, so nothing is held twice), laid into
    rows when asked and only again after a change (:meth:`changed`, their events)."""

    def __init__(self, slices: Callable[[], Iterable[Mapping[str, Any]]] = tuple,
                 claims: Callable[[], Iterable[Mapping[str, Any]]] = tuple) -> None:
        self.slices = slices
        self.claims = claims
        self._rows: DraRows | None = None

    def changed(self, event: Event[Mapping[str, Any]]) -> None:
        self._rows = None  # a resync too: the cache it replaced may differ

    def rows(self) -> DraRows:
        if self._rows is None:
            self._rows = dra_rows(list(self.slices()), list(self.claims()))
        return self._rows


class SchedulerState:
    """The allocator, fed by node, pod and quota events; an adapter's verbs (the
    extender's routes) read it and remember what filter saw for bind."""

    def __init__(self, alloc: Allocator, *, request_cache: int = 20_000,
                 pod_lookup: Callable[[str], PodInfo | None] = lambda key: None,
                 clock: Clock = SYSTEM_CLOCK, warn: Warn | None = None,
                 dra: DraNodes | None = None) -> None:
        """``pod_lookup`` finds a pod's projection by ``namespace/name``: the pod
        informer's own cache (``Informer.get``), so pods are not indexed twice;
        ``clock`` dates the pods that carry no creation time; ``warn`` is told of each
        malformed inventory, assignment or quota (the log, by default)."""
        self.alloc = alloc
        self.warn: Warn = warn if warn is not None else _log_warning
        self.clock = clock
        self.pod_lookup = pod_lookup
        self.bad_assignments: set[str] = set()
        self.bad_nodes: dict[str, str] = {}
        # nodes whose GPUs DRA manages (vgpud.io/node-mode=dra): never placed on here
        self.dra_nodes: set[str] = set()
        self.dra = dra or DraNodes()  # their GPUs and claims (none unless DRA is on)
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
            self.dra_nodes.discard(event.key)
            return
        info = event.obj if isinstance(event, Added) else event.new
        if info.dra:  # kube-scheduler allocates its GPUs from ResourceSlices, not we
            self.dra_nodes.add(info.name)
            self.bad_nodes.pop(info.name, None)
            self.alloc.remove_node(info.name)
            return
        self.dra_nodes.discard(info.name)
        if info.error is not None:
            if self.bad_nodes.get(info.name) != info.error:
                self.warn("node_inventory_invalid", node=info.name, error=info.error)
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
                    self.warn("quota_invalid", quota=q.key, error=e)
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
                self.warn("pod_assignment_invalid", pod=info.key, error=info.assignment_error)
            self.bad_assignments.add(info.uid)
            return
        self.bad_assignments.discard(info.uid)
        placement = info.placement
        if placement is None or not info.node:
            return
        if placement.node != info.node:
            self.warn("pod_assignment_other_node", pod=info.key, bound=info.node,
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


def rebuild(state: SchedulerState, nodes: Iterable[tuple[str, NodeInfo]],
            pods: Iterable[tuple[str, PodInfo]]) -> None:
    """Lay listed nodes and pods (``(key, projection)``, keyed as the informers key
    them) into ``state``'s ledger, as the informers' first list does."""
    for key, node in nodes:
        state.on_node(Added(key, node))
    for key, pod in pods:
        state.on_pod(Added(key, pod))
