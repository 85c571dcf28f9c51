"""The Kubernetes API calls the plugin makes, behind one small interface.

:class:`ClusterApi` is what the rest of the plugin uses: read a pod, list the pods
bound to this node, rewrite a pod's assignment with a resourceVersion precondition,
read and write the node's inventory annotation and extended resources, and post
events. :class:`KubeCluster` implements it with ``vgpud.kube``; pods and nodes
come back as :class:`PodView` values, never as client models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from vgpud.kube.client import Json, KubeClient
from vgpud.kube.errors import Conflict, KubeError, NotFound
from vgpud.kube.writes import MERGE_PATCH

log = structlog.get_logger(__name__)


class ClusterError(RuntimeError):
    """The API server refused or could not be reached; the message says which call."""


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


class ClusterApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> PodView | None: ...

    async def pods_on_node(self, node: str) -> list[PodView]: ...

    async def patch_pod_annotation(self, pod: PodView, key: str, value: str) -> bool:
        """Set one annotation if the pod is still at ``pod.resource_version``; False on 409."""
        ...

    async def node_annotation(self, node: str, key: str) -> str | None: ...

    async def set_node_annotation(self, node: str, key: str, value: str) -> None: ...

    async def set_node_resources(self, node: str, resources: Mapping[str, str]) -> None: ...

    async def pod_event(self, pod: PodView, reason: str, message: str,
                        warning: bool = True) -> None: ...


def _view(obj: Mapping[str, Any]) -> PodView:
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
    )


class KubeCluster:
    """:class:`ClusterApi` over :class:`vgpud.kube.client.KubeClient` (budget, mapped errors)."""

    def __init__(self, kube: KubeClient, *, component: str = "vgpud-plugin") -> None:
        self.kube = kube
        self.core: Any = kube.core
        self.component = component

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Json:
        try:
            return await self.kube.call(fn, *args, **kwargs)
        except (NotFound, Conflict):
            raise
        except KubeError as e:
            raise ClusterError(f"{what}: {e}") from None

    async def get_pod(self, namespace: str, name: str) -> PodView | None:
        try:
            return _view(await self._call(f"reading pod {namespace}/{name}",
                                          self.core.read_namespaced_pod, name, namespace))
        except NotFound:
            return None
        except Conflict as e:
            raise ClusterError(f"reading pod {namespace}/{name}: {e}") from None

    async def pods_on_node(self, node: str) -> list[PodView]:
        try:
            body = await self._call(f"listing pods on {node}",
                                    self.core.list_pod_for_all_namespaces,
                                    field_selector=f"spec.nodeName={node}")
        except (NotFound, Conflict) as e:
            raise ClusterError(f"listing pods on {node}: {e}") from None
        return [_view(p) for p in body.get("items") or []]

    async def patch_pod_annotation(self, pod: PodView, key: str, value: str) -> bool:
        body = {"metadata": {"resourceVersion": pod.resource_version,
                             "annotations": {key: value}}}
        try:
            await self._call(f"patching pod {pod.namespace}/{pod.name}",
                             self.core.patch_namespaced_pod, pod.name, pod.namespace, body,
                             _content_type=MERGE_PATCH)
        except Conflict:
            return False
        except NotFound:
            raise ClusterError(f"patching pod {pod.namespace}/{pod.name}: "
                               "the pod no longer exists") from None
        return True

    async def node_annotation(self, node: str, key: str) -> str | None:
        try:
            obj = await self._call(f"reading node {node}", self.core.read_node, node)
        except (NotFound, Conflict) as e:
            raise ClusterError(f"reading node {node}: {e}") from None
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
        return value if isinstance(value, str) else None

    async def set_node_annotation(self, node: str, key: str, value: str) -> None:
        body = {"metadata": {"annotations": {key: value}}}
        try:
            await self._call(f"annotating node {node}", self.core.patch_node, node, body,
                             _content_type=MERGE_PATCH)
        except (NotFound, Conflict) as e:
            raise ClusterError(f"annotating node {node}: {e}") from None

    async def set_node_resources(self, node: str, resources: Mapping[str, str]) -> None:
        body = {"status": {"capacity": dict(resources)}}
        try:
            await self._call(f"setting extended resources of node {node}",
                             self.core.patch_node_status, node, body, _content_type=MERGE_PATCH)
        except (NotFound, Conflict) as e:
            raise ClusterError(f"setting extended resources of node {node}: {e}") from None

    async def pod_event(self, pod: PodView, reason: str, message: str,
                        warning: bool = True) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                               "namespace": pod.namespace, "uid": pod.uid},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:  # events are best effort
            await self.kube.call(self.core.create_namespaced_event, pod.namespace, body)
        except KubeError as e:
            log.warning("event_failed", pod=f"{pod.namespace}/{pod.name}", error=str(e))
