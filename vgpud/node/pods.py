"""The pods bound to this node, kept by a watch: what the allocation path reads instead
of listing.

:class:`NodePods` runs one :class:`~vgpud.kube.cache.Informer` of pods with the field
selector ``spec.nodeName=<node>`` — exactly what the LIST it replaces returned: pods
bound to the node, in every phase. A pod the scheduler has chosen the node for but not
bound yet is in neither (its ``vgpud.io/assignment`` arrives with its ``nodeName``, in
the Binding's one update). Its values are :class:`~vgpud.node.cluster.PodView`
projections.

The cache may lag the API by the watch's delay. Readers that decide on a pod kubelet
already knows say which views they cannot trust (:meth:`NodePods.views`): a pod the
cache lacks, or one whose cached view a check rejects (no assignment yet, being
deleted), is read again with one GET, so no decision is made on a view older than
kubelet's. After the plugin itself rewrites a pod's assignment it waits for the cache
to show the write (:meth:`NodePods.wait_until`), so the next decision counts it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.kube.cache import Event, Informer, Synced
from vgpud.kube.errors import KubeError
from vgpud.node.cluster import ClusterApi, PodView

log = structlog.get_logger(__name__)

PodKey = tuple[str, str]  # (namespace, name)
GetPod = Callable[[str, str], Awaitable[PodView | None]]


class NodePods:
    """The node's pods from ``informer``; ``get_pod`` reads one pod from the API."""

    def __init__(self, informer: Informer[PodView], get_pod: GetPod) -> None:
        self.informer = informer
        self.get_pod = get_pod
        self.reads = 0  # GETs made because the cache could not be trusted for a pod

    @classmethod
    def of(cls, cluster: ClusterApi, node: str) -> NodePods:
        """The pods bound to ``node``, watched and read through ``cluster``."""
        return cls(cluster.watch_node_pods(node), cluster.get_pod)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> NoReturn:
        """Fill the cache, then follow the watch; ``started`` once it is filled."""
        await self.informer.run(task_status=task_status)

    def cached(self, namespace: str, name: str) -> PodView | None:
        return self.informer.get(f"{namespace}/{name}")

    def all(self) -> dict[PodKey, PodView]:
        """Every cached pod, by ``(namespace, name)``."""
        return {(p.namespace, p.name): p for p in self.informer.snapshot().values()}

    async def views(self, keys: Iterable[PodKey],
                    trusted: Callable[[PodView], bool] = lambda p: True,
                    ) -> dict[PodKey, PodView]:
        """Every cached pod, and each pod of ``keys`` (pods kubelet knows, so bound ones)
        the cache lacks or whose cached view is not ``trusted`` read again by one GET.
        A pod the API no longer has is left out; one the API cannot be asked about
        keeps its cached view, if any, with a warning."""
        out = self.all()
        for key in dict.fromkeys(keys):
            pod = out.get(key)
            if pod is not None and trusted(pod):
                continue
            self.reads += 1
            try:
                fresh = await self.get_pod(*key)
            except KubeError as e:
                log.warning("node_pod_unread", pod="/".join(key), error=str(e))
                continue
            if fresh is None:
                out.pop(key, None)
            else:
                out[key] = fresh
        return out

    async def wait_until(self, namespace: str, name: str,
                         ok: Callable[[PodView | None], bool], within: float) -> bool:
        """Wait, at most ``within`` seconds, for the cached view of the pod to satisfy
        ``ok``; whether it did."""
        key = f"{namespace}/{name}"
        if ok(self.informer.get(key)):
            return True
        seen = anyio.Event()

        def check(event: Event[PodView]) -> None:
            if (isinstance(event, Synced) or event.key == key) and ok(self.informer.get(key)):
                seen.set()

        unsubscribe = self.informer.subscribe(check)
        try:
            with anyio.move_on_after(within):
                await seen.wait()
        finally:
            unsubscribe()
        return seen.is_set()
