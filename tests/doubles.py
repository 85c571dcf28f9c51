"""In-memory doubles of the API ports: the scheduler's binder and the node's API client.

The stand-in (:mod:`tests.standin`) is an API server over HTTP; these are objects in the
test's own process, with no socket, that keep pods and nodes in dicts and answer as
kube-apiserver does, in the :mod:`vgpud.kube.errors` it is mapped to:

- :class:`MemoryBinder` is :class:`vgpud.kube.writes.PodBinder` (``bind``, ``read_pod``):
  the extender's writer.
- :class:`MemoryCluster` is :class:`vgpud.node.cluster.ClusterApi`: the plugin's and the
  node's reads and writes.
- :class:`LivePods` is the informer's reads over a :class:`MemoryCluster`'s pods, with no
  lag (wrap it in :class:`vgpud.node.pods.NodePods`).
- :class:`MemoryKube` is the one method of :class:`vgpud.kube.client.KubeClient` the pod
  writers use (``request``: GET and merge-PATCH a pod, POST its binding), so that the real
  ``PodBinder``, ``PodWriter`` and ``KubeCluster`` run over the same pods.

What each does unasked is what the API server does: binding a pod already bound, or
being deleted, is 409 "already assigned"; binding or patching a pod that is not there is
404; a Binding whose uid is not the pod's, or a patch whose resourceVersion is not the
pod's, is 409. Anything else is told: :meth:`Faults.fail` makes the next calls of one
operation raise (the error factories below word them as the server does), *before*
the call takes effect or, ``applied=True``, *after* it (the answer lost: a connection
reset or a timeout once the server had written). :meth:`Faults.hold` parks calls of an
operation until the test lets them go, to see what a write in flight holds.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from vgpud.core.codec import ASSIGNMENT
from vgpud.kube.errors import (
    Conflict,
    ConnectionFailed,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
)
from vgpud.node.cluster import PodView, view

Json = dict[str, Any]
R = TypeVar("R")

# -- the errors, as kube-apiserver words them -------------------------------------------------


def already_assigned(name: str, node: str) -> Conflict:
    return Conflict(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                                     f'pod {name} is already assigned to node "{node}"')


def being_deleted(name: str) -> Conflict:
    return Conflict(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                                     f"pod {name} is being deleted, cannot be assigned to a host")


def pod_not_found(name: str) -> NotFound:
    return NotFound(404, "NotFound", f'pods "{name}" not found')


def uid_precondition(wanted: str, actual: str) -> Conflict:
    return Conflict(409, "Conflict", f"Precondition failed: UID in precondition: {wanted}, "
                                     f"UID in object meta: {actual}")


def modified(name: str) -> Conflict:
    """A resourceVersion precondition that no longer holds."""
    return Conflict(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the '
                                     "object has been modified; please apply your changes to "
                                     "the latest version and try again")


def forbidden(verb: str, resource: str, name: str) -> Forbidden:
    return Forbidden(403, "Forbidden", f'{resource} "{name}" is forbidden: User '
                                       '"system:serviceaccount:vgpu:vgpud" cannot '
                                       f'{verb} resource "{resource}" in API group ""')


def invalid(name: str, why: str = "Invalid value: must be no more than 63 characters") -> Invalid:
    return Invalid(422, "Invalid", f'Binding "{name}" is invalid: metadata.annotations: {why}')


def timeout() -> ServerError:
    """The server gave up on the request (504, a transient failure)."""
    return ServerError(504, "Timeout", "the server was unable to return a response in the "
                                       "time allotted, but may still be processing the request")


def reset() -> ConnectionFailed:
    """No answer: the connection was reset mid-call (what the client maps it to)."""
    return ConnectionFailed("connection reset by peer")


# -- scripted faults -------------------------------------------------------------------------


@dataclass
class _Fault:
    error: Callable[[], KubeError]
    times: int
    applied: bool


@dataclass
class Faults:
    """What the next calls of each operation do, beyond what the API server would."""

    _queued: dict[str, list[_Fault]] = field(default_factory=dict)
    _holds: dict[str, anyio.Event] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)  # by operation, failed ones too
    arrived: dict[str, anyio.Event] = field(default_factory=dict)

    def fail(self, op: str, error: KubeError | Callable[[], KubeError], *, times: int = 1,
             applied: bool = False) -> None:
        """The next ``times`` calls of ``op`` raise ``error`` (a factory: a fresh one
        each); ``applied``: after the call took effect (its answer lost)."""
        if isinstance(error, KubeError):
            fixed = error
            self._queued.setdefault(op, []).append(_Fault(lambda: fixed, times, applied))
        else:
            self._queued.setdefault(op, []).append(_Fault(error, times, applied))

    def hold(self, op: str) -> Callable[[], None]:
        """Park calls of ``op`` until the returned function is called; ``arrived[op]``
        is set once one is parked."""
        gate = self._holds[op] = anyio.Event()
        self.arrived[op] = anyio.Event()
        return gate.set

    def clear(self) -> None:
        self._queued.clear()
        for gate in self._holds.values():
            gate.set()
        self._holds.clear()

    def _next(self, op: str) -> _Fault | None:
        queue = self._queued.get(op) or []
        if not queue:
            return None
        fault = queue[0]
        fault.times -= 1
        if fault.times <= 0:
            queue.pop(0)
        return fault

    async def around(self, op: str, apply: Callable[[], R]) -> R:
        """Run ``apply`` (the API server's own answer) as scripted for ``op``."""
        self.calls[op] += 1
        gate = self._holds.get(op)
        if gate is not None:
            self.arrived[op].set()
            await gate.wait()
        await anyio.lowlevel.checkpoint()
        fault = self._next(op)
        if fault is not None and not fault.applied:
            raise fault.error()
        out = apply()
        if fault is not None:
            raise fault.error()
        return out


# -- the objects -----------------------------------------------------------------------------


class Objects:
    """Pods by ``namespace/name`` and nodes by name, with resourceVersions, as the API
    server keeps them; the rules of its writes."""

    def __init__(self) -> None:
        self.pods: dict[str, Json] = {}
        self.nodes: dict[str, Json] = {}
        self._rv = 100
        self._uids = 0

    def _bump(self, obj: Json) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def add_pod(self, manifest: Mapping[str, Any]) -> Json:
        """Create (or replace) a pod; a uid is made if it has none."""
        pod = copy.deepcopy(dict(manifest))
        meta = pod.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        if not meta.get("uid"):
            self._uids += 1
            meta["uid"] = f"uid-{self._uids:04d}"
        self._bump(pod)
        self.pods[f"{meta['namespace']}/{meta['name']}"] = pod
        return copy.deepcopy(pod)

    def add_node(self, name: str, annotations: Mapping[str, str] | None = None) -> Json:
        node: Json = {"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "annotations": dict(annotations or {})},
                      "status": {"capacity": {}}}
        self._bump(node)
        self.nodes[name] = node
        return copy.deepcopy(node)

    def pod(self, namespace: str, name: str) -> Json:
        try:
            return self.pods[f"{namespace}/{name}"]
        except KeyError:
            raise pod_not_found(name) from None

    def node(self, name: str) -> Json:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(404, "NotFound", f'nodes "{name}" not found') from None

    def delete_pod(self, namespace: str, name: str) -> None:
        self.pods.pop(f"{namespace}/{name}", None)

    def change_pod(self, namespace: str, name: str, **annotations: str) -> Json:
        """Someone else's write: set annotations (a new resourceVersion)."""
        pod = self.pod(namespace, name)
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        self._bump(pod)
        return copy.deepcopy(pod)

    def mark_deleting(self, namespace: str, name: str) -> None:
        pod = self.pod(namespace, name)
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self._bump(pod)

    # the API server's writes

    def bind(self, namespace: str, name: str, node: str, uid: str | None,
             annotations: Mapping[str, str] | None) -> None:
        pod = self.pod(namespace, name)
        meta, spec = pod["metadata"], pod.setdefault("spec", {})
        if uid and meta.get("uid") != uid:
            raise uid_precondition(uid, str(meta.get("uid")))
        if spec.get("nodeName"):
            raise already_assigned(name, spec["nodeName"])
        if meta.get("deletionTimestamp"):
            raise being_deleted(name)
        spec["nodeName"] = node
        if annotations:
            meta.setdefault("annotations", {}).update(annotations)
        self._bump(pod)

    def merge_patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Json:
        pod = self.pod(namespace, name)
        meta = patch.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv is not None and rv != pod["metadata"].get("resourceVersion"):
            raise modified(name)
        uid = meta.get("uid")
        if uid is not None and uid != pod["metadata"].get("uid"):
            raise uid_precondition(uid, pod["metadata"].get("uid"))
        annotations = pod["metadata"].setdefault("annotations", {})
        for k, v in (meta.get("annotations") or {}).items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        self._bump(pod)
        return copy.deepcopy(pod)


# -- the ports -------------------------------------------------------------------------------


class MemoryBinder:
    """:class:`vgpud.kube.writes.PodBinder` in memory: the extender's writer.

    Operations (for :class:`Faults`): ``bind``, ``read_pod``. No retries of its own: a
    scripted fault is what ``PodBinder`` raises once its retries are spent."""

    def __init__(self, objects: Objects | None = None, faults: Faults | None = None) -> None:
        self.objects = objects or Objects()
        self.faults = faults or Faults()
        self.bound: list[tuple[str, str, str]] = []  # (namespace, name, node), as written

    async def bind(self, namespace: str, name: str, node: str, *, uid: str | None = None,
                   annotations: Mapping[str, str] | None = None) -> None:
        def apply() -> None:
            self.objects.bind(namespace, name, node, uid, annotations)
            self.bound.append((namespace, name, node))

        await self.faults.around("bind", apply)

    async def read_pod(self, namespace: str, name: str) -> Json:
        return await self.faults.around(
            "read_pod", lambda: copy.deepcopy(self.objects.pod(namespace, name)))


class MemoryCluster:
    """:class:`vgpud.node.cluster.ClusterApi` in memory.

    Operations (for :class:`Faults`): the method names. ``rewrite_assignment`` answers
    as ``KubeCluster`` does once its resourceVersion re-reads are done: it writes if the
    pod is the same pod, not being deleted, and still holds the assignment ``pod`` shows
    (whatever else changed), else :class:`Conflict`; :class:`NotFound` if it is gone.
    ``watch_node_pods`` is not modelled (give the service its ``NodePods``)."""

    def __init__(self, objects: Objects | None = None, faults: Faults | None = None) -> None:
        self.objects = objects or Objects()
        self.faults = faults or Faults()
        self.events: list[tuple[str, str, str, bool]] = []  # (pod key, reason, message, warning)
        self._wrote = anyio.Event()

    async def next_write(self) -> None:
        """Wait for the next node write that took effect."""
        await self._wrote.wait()

    def _written(self) -> None:
        self._wrote.set()
        self._wrote = anyio.Event()

    async def get_pod(self, namespace: str, name: str) -> PodView | None:
        def apply() -> PodView | None:
            pod = self.objects.pods.get(f"{namespace}/{name}")
            return None if pod is None else view(copy.deepcopy(pod))

        return await self.faults.around("get_pod", apply)

    async def pods_on_node(self, node: str) -> list[PodView]:
        return await self.faults.around("pods_on_node", lambda: [
            view(copy.deepcopy(p)) for p in self.objects.pods.values()
            if (p.get("spec") or {}).get("nodeName") == node])

    def watch_node_pods(self, node: str) -> Any:
        raise NotImplementedError("MemoryCluster has no watch: pass the service its NodePods")

    async def rewrite_assignment(self, pod: PodView, value: str) -> PodView:
        def apply() -> PodView:
            current = self.objects.pod(pod.namespace, pod.name)
            meta = current["metadata"]
            if meta.get("uid") != pod.uid:
                raise Conflict(409, "Conflict", f"pod {pod.namespace}/{pod.name} was replaced")
            if meta.get("deletionTimestamp") or (
                    (meta.get("annotations") or {}).get(ASSIGNMENT)
                    != pod.annotations.get(ASSIGNMENT)):
                raise Conflict(409, "Conflict", f"pod {pod.namespace}/{pod.name} changed; "
                                                "the write no longer applies")
            return view(self.objects.merge_patch_pod(
                pod.namespace, pod.name, {"metadata": {"annotations": {ASSIGNMENT: value}}}))

        return await self.faults.around("rewrite_assignment", apply)

    async def node_annotation(self, node: str, key: str) -> str | None:
        def apply() -> str | None:
            value = (self.objects.node(node)["metadata"].get("annotations") or {}).get(key)
            return value if isinstance(value, str) else None

        return await self.faults.around("node_annotation", apply)

    async def set_node_annotation(self, node: str, key: str, value: str) -> None:
        def apply() -> None:
            obj = self.objects.node(node)
            obj["metadata"].setdefault("annotations", {})[key] = value
            self.objects._bump(obj)
            self._written()

        await self.faults.around("set_node_annotation", apply)

    async def set_node_resources(self, node: str, resources: Mapping[str, str]) -> None:
        def apply() -> None:
            obj = self.objects.node(node)
            obj.setdefault("status", {}).setdefault("capacity", {}).update(resources)
            self.objects._bump(obj)
            self._written()

        await self.faults.around("set_node_resources", apply)

    async def pod_event(self, pod: PodView, reason: str, message: str,
                        warning: bool = True) -> None:
        self.events.append((f"{pod.namespace}/{pod.name}", reason, message, warning))

    async def run(self) -> None:
        await anyio.sleep_forever()


class MemoryKube:
    """``KubeClient.request`` in memory, for pods: ``GET`` one, ``PATCH`` it (a merge
    patch), ``POST`` its binding. The operation (for :class:`Faults`) is
    ``"<METHOD> pods"`` or ``"POST pods/binding"``: a fault here is one HTTP attempt's,
    which the real writers' retries see."""

    core: Any = None  # the generated API (KubeCluster's node calls): not modelled

    def __init__(self, objects: Objects | None = None, faults: Faults | None = None) -> None:
        self.objects = objects or Objects()
        self.faults = faults or Faults()

    async def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str | None = None) -> Json:
        parts = path.strip("/").split("/")
        # api/v1/namespaces/{ns}/pods/{name}[/binding]
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 6 or parts[4] != "pods":
            raise NotImplementedError(f"MemoryKube does not serve {method} {path}")
        namespace, name, sub = parts[3], parts[5], "/".join(parts[6:])
        body = json.loads(json.dumps(body)) if body is not None else None  # as sent

        def apply() -> Json:
            if method == "GET" and not sub:
                return copy.deepcopy(self.objects.pod(namespace, name))
            if method == "PATCH" and not sub:
                return self.objects.merge_patch_pod(namespace, name, body)
            if method == "POST" and sub == "binding":
                meta = body.get("metadata") or {}
                self.objects.bind(namespace, name, body["target"]["name"], meta.get("uid"),
                                  meta.get("annotations"))
                return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            raise NotImplementedError(f"MemoryKube does not serve {method} {path}")

        op = f"{method} pods" + (f"/{sub}" if sub else "")
        return await self.faults.around(op, apply)


class LivePods:
    """The node-pods informer's reads (``get``, ``snapshot``, ``subscribe``), always up to
    date with ``api``'s pods bound to ``node`` (a watch with no lag: the plugin's wait for
    its own rewrite to show returns at once)."""

    def __init__(self, api: MemoryCluster, node: str) -> None:
        self.api = api
        self.node = node

    def get(self, key: str) -> PodView | None:
        pod = self.api.objects.pods.get(key)
        return None if pod is None else view(pod)

    def snapshot(self) -> dict[str, PodView]:
        return {k: view(p) for k, p in self.api.objects.pods.items()
                if (p.get("spec") or {}).get("nodeName") == self.node}

    def subscribe(self, callback: Any) -> Any:
        return lambda: None
