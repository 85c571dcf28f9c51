"""The Kubernetes resources vgpud reads and writes, as path builders.

A ``Resource`` names a collection (group, version, plural) and builds its URL paths;
``object_key`` gives the cache key client-go uses: ``namespace/name`` for
namespaced objects, ``name`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        return f"{base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        if self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} are namespaced: a namespace is required")
        return f"{self.collection_path(namespace)}/{quote(name, safe='')}"


PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget",
                namespaced=True)
RESOURCEQUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
RESOURCECLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim",
                          namespaced=True)
CLAIMTEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates",
                          "ResourceClaimTemplate", namespaced=True)
RESOURCESLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice",
                          namespaced=False)


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))
