"""Writes to the API server: pod annotation patches, bindings, events.

``PodWriter.patch_annotations`` sends one JSON merge patch carrying
``metadata.resourceVersion``, so the server refuses it (409) if the pod changed
since the caller decided. On a conflict it re-reads the pod and re-applies the same
annotations if the pod is still the same pod (uid) and ``still_valid(pod)`` holds
(default: not bound, not being deleted), at most ``max_conflicts`` times. (A
JSON-patch ``test`` op would answer 422, not 409, so the merge patch is used.)

``PodBinder.bind`` POSTs ``pods/{name}/binding``. The server answers 201 with a
``Status``, which kubernetes_asyncio's generated method deserialises as a
``V1Binding`` and fails with ``ValueError`` *after the binding succeeded*; we ask
for the raw response (``_preload_content=False``) and check the status instead. A
409 "already assigned" on a retried attempt is success if the pod is bound to the
node we asked for.

``EventRecorder`` posts core/v1 Events and aggregates repeats client-side: the same
(object, type, reason, message) within ``window`` seconds bumps ``count`` on the
existing Event, written at most once per ``min_interval`` (``flush``/``run`` write
the rest); new Events beyond ``max_per_second`` are dropped and counted. Event
failures are logged, never raised: an event must not fail a bind.

Every request goes through the client's budget; 429/5xx/connection failures are
retried with capped exponential backoff (``RetryPolicy``), honouring Retry-After.
"""

from __future__ import annotations

import functools
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.kube.backoff import Backoff
from vgpud.kube.budget import RequestBudget
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import Conflict, KubeError, NotFound, Unavailable
from vgpud.kube.resources import EVENTS, PODS
from vgpud.kube.timestamps import rfc3339

R = TypeVar("R")
log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (``Unavailable``: 429, 5xx, no answer) are retried."""

    attempts: int = 5
    initial: float = 0.05
    cap: float = 2.0
    jitter: float = 0.2

    async def run(self, op: Callable[[], Awaitable[R]], *, clock: Clock, what: str) -> R:
        backoff = Backoff(self.initial, self.cap, jitter=self.jitter, clock=clock)
        attempt = 1
        while True:
            try:
                return await op()
            except Unavailable as exc:
                if attempt >= self.attempts:
                    raise
                retry_after = getattr(exc, "retry_after", None) or 0.0
                delay = await backoff.sleep(at_least=min(retry_after, self.cap * 4))
                log.info(
                    "kube_retry", what=what, attempt=attempt, error=str(exc), waited=round(delay, 3)
                )
                attempt += 1


def _unbound_and_alive(pod: Json) -> bool:
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    return not spec.get("nodeName") and not meta.get("deletionTimestamp")


class PodReader:
    """Reads a pod, with the retry policy the writers share."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        retry: RetryPolicy | None = None,
        max_conflicts: int = 5,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.retry = retry or RetryPolicy()
        self.max_conflicts = max_conflicts
        self.clock = clock

    async def read_pod(self, namespace: str, name: str) -> Json:
        return await self.retry.run(
            lambda: self.kube.request("GET", PODS.object_path(name, namespace)),
            clock=self.clock,
            what="read_pod",
        )


class PodWriter(PodReader):
    """The device plugin's pod write: an annotation patch (a reassignment)."""

    async def patch_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
        uid: str | None = None,
        still_valid: Callable[[Json], bool] = _unbound_and_alive,
    ) -> Json:
        """Set (``None``: remove) annotations, preconditioned on ``resource_version``.

        Returns the patched pod. Raises ``Conflict`` when the pod was replaced (uid),
        is no longer ``still_valid``, or kept changing for ``max_conflicts`` re-reads;
        ``NotFound`` when it is gone; ``Unavailable`` after the retries.
        """
        rv = resource_version
        conflicts = 0
        while True:
            body = {"metadata": {"resourceVersion": rv, "annotations": dict(annotations)}}
            try:
                return await self.retry.run(
                    functools.partial(self.kube.request, "PATCH",
                                      PODS.object_path(name, namespace), body=body,
                                      content_type=MERGE_PATCH),
                    clock=self.clock,
                    what="patch_pod",
                )
            except Conflict:
                conflicts += 1
                if conflicts > self.max_conflicts:
                    raise
            pod = await self.read_pod(namespace, name)
            meta = pod.get("metadata") or {}
            if uid is not None and meta.get("uid") != uid:
                raise Conflict(409, "Conflict", f"pod {namespace}/{name} was replaced")
            if not still_valid(pod):
                raise Conflict(
                    409, "Conflict", f"pod {namespace}/{name} changed; the write no longer applies"
                )
            rv = str(meta.get("resourceVersion", ""))
            log.debug("pod_patch_conflict_retry", pod=f"{namespace}/{name}", conflicts=conflicts)



class PodBinder(PodReader):
    """The scheduler's pod write: the Binding, which carries the assignment. (Apart from
    :class:`PodWriter` so that each role is granted only its own write: the scheduler
    no pod patch, the device plugin no binding.)"""

    async def bind(self, namespace: str, name: str, node: str, *, uid: str | None = None,
                   annotations: Mapping[str, str] | None = None) -> None:
        """Bind the pod to ``node``, setting ``annotations`` on it in the same update (see
        the module docstring for the client bug).

        kube-apiserver copies a Binding's ``metadata.annotations`` onto the pod in the
        update that sets ``spec.nodeName`` (``BindingREST.setPodNodeAndMetadata`` in
        kubernetes ``pkg/registry/core/pod/storage/storage.go``, since 1.0): one write,
        and no moment in which the pod has a node but no assignment, or the reverse.
        The uid is a precondition (a pod replaced under the same name is not bound)."""
        metadata: Json = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        attempts = 0

        async def post() -> Json:
            nonlocal attempts
            attempts += 1
            return await self.kube.request(
                "POST", PODS.object_path(name, namespace) + "/binding", body=body
            )

        try:
            await self.retry.run(post, clock=self.clock, what="bind_pod")
        except Conflict:
            if attempts == 1:
                raise
            # An earlier attempt may have bound the pod before its answer was lost.
            pod = await self.read_pod(namespace, name)
            if (pod.get("spec") or {}).get("nodeName") != node:
                raise


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            kind=str(obj.get("kind") or "Pod"),
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            api_version=str(obj.get("apiVersion") or "v1"),
        )


@dataclass
class _Aggregate:
    event_name: str
    namespace: str
    count: int
    first_seen: float
    last_seen: float
    last_write: float
    last_wall: datetime
    dirty: bool = False


class EventRecorder:
    """Posts Events with client-side aggregation (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        component: str = "vgpud",
        instance: str | None = None,
        window: float = 600.0,
        min_interval: float = 10.0,
        max_per_second: float = 10.0,
        max_keys: int = 4096,
        retry: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance or socket.gethostname()
        self.window = window
        self.min_interval = min_interval
        self.max_keys = max_keys
        self.retry = retry or RetryPolicy(attempts=3)
        self.clock = clock
        self._budget = RequestBudget(max_per_second, max(1, int(max_per_second)), clock=clock)
        self._seen: OrderedDict[tuple[str, ...], _Aggregate] = OrderedDict()
        self.created = 0
        self.updated = 0
        self.aggregated = 0
        self.dropped = 0
        self.failed = 0

    async def record(
        self, ref: ObjectRef, reason: str, message: str, *, type: str = "Normal"
    ) -> None:
        """Record one occurrence; never raises for API failures."""
        namespace = ref.namespace or "default"
        key = (namespace, ref.kind, ref.name, ref.uid, type, reason, message)
        now = self.clock.now()
        agg = self._seen.get(key)
        if agg is not None and now - agg.last_seen <= self.window:
            agg.count += 1
            agg.last_seen = now
            agg.last_wall = self.clock.wall()
            agg.dirty = True
            self._seen.move_to_end(key)
            self.aggregated += 1
            if now - agg.last_write >= self.min_interval:
                await self._write_count(agg)
            return
        if not self._budget.try_acquire():
            self.dropped += 1
            return
        wall = self.clock.wall()
        name = f"{ref.name}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "name": ref.name,
                "namespace": ref.namespace or None,
                "uid": ref.uid or None,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "count": 1,
            "firstTimestamp": rfc3339(wall),
            "lastTimestamp": rfc3339(wall),
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        try:
            await self.retry.run(
                lambda: self.kube.request("POST", EVENTS.collection_path(namespace), body=body),
                clock=self.clock,
                what="create_event",
            )
        except KubeError as exc:
            self.failed += 1
            log.warning("event_write_failed", reason=reason, object=ref.name, error=str(exc))
            return
        self.created += 1
        self._seen[key] = _Aggregate(name, namespace, 1, now, now, now, wall)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)

    async def _write_count(self, agg: _Aggregate) -> None:
        if not self._budget.try_acquire():
            return  # stays dirty; flush() writes it
        patch = {"count": agg.count, "lastTimestamp": rfc3339(agg.last_wall)}
        try:
            await self.retry.run(
                lambda: self.kube.request(
                    "PATCH",
                    EVENTS.object_path(agg.event_name, agg.namespace),
                    body=patch,
                    content_type=MERGE_PATCH,
                ),
                clock=self.clock,
                what="update_event",
            )
        except NotFound:
            agg.dirty = False  # the Event expired on the server; the next repeat starts anew
            agg.last_seen = -float("inf")
            return
        except KubeError as exc:
            self.failed += 1
            log.warning("event_write_failed", event=agg.event_name, error=str(exc))
            return
        agg.dirty = False
        agg.last_write = self.clock.now()
        self.updated += 1

    async def flush(self) -> None:
        """Write every pending count now."""
        for agg in list(self._seen.values()):
            if agg.dirty:
                await self._write_count(agg)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> NoReturn:
        """Flush pending counts every ``min_interval`` (and once more on cancellation)."""
        task_status.started()
        try:
            while True:
                await self.clock.sleep(self.min_interval)
                await self.flush()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await self.flush()
