"""The Kubernetes API calls the plugin makes, behind one small interface.

:class:`ClusterApi` is what the rest of the plugin uses: read a pod, list (or watch:
:mod:`vgpud.node.pods`) the pods bound to this node, rewrite a pod's assignment, read
and write the node's inventory annotation and extended resources, and post events.
:class:`KubeCluster` implements it with ``vgpud.kube``: writes go through
:class:`~vgpud.kube.writes.PodWriter` (merge patch with a resourceVersion precondition,
conflict re-reads, retries) and :class:`~vgpud.kube.writes.EventRecorder` (aggregated,
rate-limited events), the same code the scheduler uses. Failures are the
:mod:`vgpud.kube.errors` tree. Pods come back as :class:`PodView` values, never as
client models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from vgpud.core.codec import ASSIGNMENT, Unreadable, assignment_of
from vgpud.core.model import Placement
from vgpud.kube.cache import Informer
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.errors import NotFound
from vgpud.kube.resources import PODS
from vgpud.kube.watch import Selector
from vgpud.kube.writes import MERGE_PATCH, EventRecorder, ObjectRef, PodWriter

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    resource_version: str
    node_name: str
    phase: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    # per container (init containers too), the resource names its requests and limits
    # name; a container that names none is absent
    asks: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # the init containers the pod's status shows terminated with exit code 0
    init_done: frozenset[str] = frozenset()
    # the status shows some container (kubelet has admitted the pod and reported it)
    reported: bool = False
    scheduler: str = ""  # spec.schedulerName
    # the pod as a request is parsed from (metadata's names and annotations, the spec)
    source: Mapping[str, Any] = field(default_factory=dict)
    # its vgpud.io/assignment, decoded once when the view is made (None: it has none)
    assignment: Placement | Unreadable | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignment", assignment_of(self.annotations))

    def may_ask(self, container: str, resource: str) -> bool:
        """Whether ``container`` may be waiting for devices of ``resource``: it names
        that resource, or no resource at all (a pod the API did not show in full)."""
        names = self.asks.get(container)
        return names is None or resource in names


class ClusterApi(Protocol):
    """Every method but :meth:`pod_event` raises :class:`~vgpud.kube.errors.KubeError`."""

    async def get_pod(self, namespace: str, name: str) -> PodView | None: ...

    async def pods_on_node(self, node: str) -> list[PodView]: ...

    def watch_node_pods(self, node: str) -> Informer[PodView]:
        """An informer of the pods :meth:`pods_on_node` lists (not started)."""
        ...

    async def rewrite_assignment(self, pod: PodView, value: str) -> PodView:
        """Set the pod's assignment to ``value`` if it still holds the assignment ``pod``
        shows, and return the pod as written; :class:`~vgpud.kube.errors.Conflict` if it
        changed meanwhile."""
        ...

    async def node_annotation(self, node: str, key: str) -> str | None: ...

    async def set_node_annotation(self, node: str, key: str, value: str) -> None: ...

    async def set_node_resources(self, node: str, resources: Mapping[str, str]) -> None: ...

    async def pod_event(self, pod: PodView, reason: str, message: str,
                        warning: bool = True) -> None:
        """Best effort: never raises."""
        ...

    async def run(self) -> None:
        """Background work (writing aggregated events) until cancelled."""
        ...


def _asks(spec: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                continue
            res = c.get("resources") or {}
            names = {str(n) for part in ("requests", "limits")
                     for n in (res.get(part) or {} if isinstance(res, Mapping) else {})}
            if names:
                out[c["name"]] = frozenset(names)
    return out


def _init_done(status: Mapping[str, Any]) -> frozenset[str]:
    """The init containers the status shows terminated with exit code 0."""
    out = set()
    for c in status.get("initContainerStatuses") or []:
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            continue
        state = c.get("state")
        done = state.get("terminated") if isinstance(state, Mapping) else None
        if isinstance(done, Mapping) and done.get("exitCode") == 0:
            out.add(c["name"])
    return frozenset(out)


def view(obj: Mapping[str, Any]) -> PodView:
    meta = obj.get("metadata") or {}
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        node_name=(obj.get("spec") or {}).get("nodeName") or "",
        phase=(obj.get("status") or {}).get("phase") or "",
        annotations=dict(meta.get("annotations") or {}),
        deleting=bool(meta.get("deletionTimestamp")),
        asks=_asks(obj.get("spec") or {}),
        init_done=_init_done(obj.get("status") or {}),
        reported=bool((obj.get("status") or {}).get("initContainerStatuses")
                      or (obj.get("status") or {}).get("containerStatuses")),
        scheduler=str((obj.get("spec") or {}).get("schedulerName") or "default-scheduler"),
        source={"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid",
                                                       "annotations")},
                "spec": obj.get("spec") or {}},
    )


class KubeCluster:
    """:class:`ClusterApi` over :class:`vgpud.kube.client.KubeClient` (budget, mapped errors)."""

    def __init__(self, kube: KubeClient, *, component: str = "vgpud-plugin") -> None:
        self.kube = kube
        self.core: Any = kube.core
        self.writer = PodWriter(kube)
        self.events = EventRecorder(kube, component=component)

    async def get_pod(self, namespace: str, name: str) -> PodView | None:
        try:
            return view(await self.writer.read_pod(namespace, name))
        except NotFound:
            return None

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Json:
        return await self.writer.retry.run(lambda: self.kube.call(fn, *args, **kwargs),
                                           clock=self.writer.clock, what=what)

    async def pods_on_node(self, node: str) -> list[PodView]:
        body = await self._call("list_pods", self.core.list_pod_for_all_namespaces,
                                field_selector=f"spec.nodeName={node}")
        return [view(p) for p in body.get("items") or []]

    def watch_node_pods(self, node: str) -> Informer[PodView]:
        return Informer(self.kube, PODS, selector=Selector(fields=f"spec.nodeName={node}"),
                        project=view, name="node-pods")

    async def rewrite_assignment(self, pod: PodView, value: str) -> PodView:
        based_on = pod.annotations.get(ASSIGNMENT)

        def unchanged(current: Json) -> bool:
            meta = current.get("metadata") or {}
            return (not meta.get("deletionTimestamp")
                    and (meta.get("annotations") or {}).get(ASSIGNMENT) == based_on)

        return view(await self.writer.patch_annotations(
            pod.namespace, pod.name, {ASSIGNMENT: value}, resource_version=pod.resource_version,
            uid=pod.uid, still_valid=unchanged))

    async def node_annotation(self, node: str, key: str) -> str | None:
        obj = await self._call("read_node", self.core.read_node, node)
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
        return value if isinstance(value, str) else None

    async def set_node_annotation(self, node: str, key: str, value: str) -> None:
        await self._call("annotate_node", self.core.patch_node, node,
                         {"metadata": {"annotations": {key: value}}}, _content_type=MERGE_PATCH)

    async def set_node_resources(self, node: str, resources: Mapping[str, str]) -> None:
        await self._call("patch_node_status", self.core.patch_node_status, node,
                         {"status": {"capacity": dict(resources)}}, _content_type=MERGE_PATCH)

    async def pod_event(self, pod: PodView, reason: str, message: str,
                        warning: bool = True) -> None:
        ref = ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
        await self.events.record(ref, reason, message, type="Warning" if warning else "Normal")

    async def run(self) -> None:
        await self.events.run()
