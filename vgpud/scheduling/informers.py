"""The scheduler's informers, wired to its state.

Four informers: nodes (:class:`NodeInfo`), pods (:class:`PodInfo`, the one pod
projection of the process: :func:`pod_projection`), PodDisruptionBudgets (for
preemption) and ResourceQuotas (:mod:`vgpud.core.quota`). Node, pod and quota events
feed one :class:`SchedulerState`, whose pod lookups read the pod informer's own cache.
With DRA on (``dra.enabled``), two more: vgpud's ResourceSlices and the ResourceClaims
allocated from them, feeding the state's :class:`~vgpud.scheduling.state.DraNodes` (what
the status page shows of the DRA nodes; no decision reads them).
Whoever else reacts to the events (the reschedule controller, an adapter's metrics)
subscribes before :meth:`SchedulerInformers.start`.

The state is ready, its ledger rebuilt from every pod's ``vgpud.io/assignment``, once
the node, pod and quota informers have listed (:meth:`SchedulerInformers.ready`); what
it shows, once the DRA ones have too (:meth:`SchedulerInformers.views_ready`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from anyio.abc import TaskGroup

from vgpud.core.allocate import Allocator
from vgpud.core.dra_report import claim_projection, slice_projection
from vgpud.core.preempt import Budget
from vgpud.core.quota import Quota, quota_keys, read_quota
from vgpud.kube.cache import Informer
from vgpud.kube.client import KubeClient
from vgpud.kube.resources import (
    NODES,
    PDBS,
    PODS,
    RESOURCECLAIMS,
    RESOURCEQUOTAS,
    RESOURCESLICES,
)
from vgpud.scheduling.projections import (
    NodeInfo,
    PodInfo,
    pod_projection,
    project_budget,
    project_node,
)
from vgpud.scheduling.state import DraNodes, SchedulerState


class SchedulerInformers:
    """The informers of one scheduler named ``scheduler_name``, and the state they feed."""

    def __init__(self, kube: KubeClient, alloc: Allocator, scheduler_name: str, *,
                 dra: bool = False) -> None:
        self.nodes: Informer[NodeInfo] = Informer(kube, NODES, project=project_node)
        self.pods: Informer[PodInfo] = Informer(
            kube, PODS, project=pod_projection(scheduler_name, alloc.defaults))
        self.budgets: Informer[Budget] = Informer(kube, PDBS, project=project_budget)
        self.quotas: Informer[Quota] = Informer(kube, RESOURCEQUOTAS, project=partial(
            read_quota, keys=quota_keys(alloc.defaults)))
        self.dra: tuple[Informer[Mapping[str, Any]], ...] = ()
        dra_nodes = None
        if dra:
            slices: Informer[Mapping[str, Any]] = Informer(kube, RESOURCESLICES,
                                                           project=slice_projection)
            claims: Informer[Mapping[str, Any]] = Informer(kube, RESOURCECLAIMS,
                                                           project=claim_projection)
            dra_nodes = DraNodes(slices=lambda: (v for _, v in slices.items()),
                                 claims=lambda: (v for _, v in claims.items()))
            for informer in (slices, claims):
                informer.subscribe(dra_nodes.changed)
            self.dra = (slices, claims)
        self.state = SchedulerState(alloc, pod_lookup=self.pods.get, dra=dra_nodes)
        self.nodes.subscribe(self.state.on_node)
        self.pods.subscribe(self.state.on_pod)
        self.quotas.subscribe(self.state.on_quota)

    @property
    def all(self) -> tuple[Informer[Any], ...]:
        return (self.nodes, self.pods, self.budgets, self.quotas, *self.dra)

    def ready(self) -> bool:
        """The ledger is rebuilt and the quotas are known: decisions may be made."""
        return self.nodes.has_synced and self.pods.has_synced and self.quotas.has_synced

    def views_ready(self) -> bool:
        """What the status page shows is complete: :meth:`ready`, and the DRA nodes'
        slices and claims listed (when DRA is on)."""
        return self.ready() and all(i.has_synced for i in self.dra)

    def budget_list(self) -> list[Budget]:
        """The PodDisruptionBudgets as of now (preemption reads them)."""
        return [b for _, b in self.budgets.items()]

    async def start(self, tg: TaskGroup) -> None:
        """Run every informer in ``tg`` (each started: its watch is being set up)."""
        for informer in self.all:
            await tg.start(informer.run)

    async def wait_synced(self) -> None:
        """Until the node and pod informers have listed (the ledger is rebuilt)."""
        await self.nodes.wait_synced()
        await self.pods.wait_synced()
