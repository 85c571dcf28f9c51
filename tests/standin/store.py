"""The in-memory object store of the API stand-in: objects, resourceVersions, history.

Objects are stored as JSON-ready dicts next to their serialised bytes (``Entry``),
both built once per write. Stored dicts are never mutated: every write builds a new
dict, copying only what changes (patches share untouched sub-trees), so lists,
gets and watch events hand out the stored bytes without copies.

resourceVersion is one global counter (like etcd's revision). Each resource keeps a
bounded history of changes; a watch from a resourceVersion older than the history
(``Collection.compacted``) gets ``410 Gone``, as on the real server. ``compact()``
empties a history on demand so tests can force that path.

Everything here is synchronous: the HTTP layer (``apiserver.py``) calls it from the
event loop, so each write is atomic with respect to watches and lists.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.standin import objects, patches
from tests.standin.errors import StoreError, status_body
from tests.standin.selectors import Predicate, field_selector, label_selector

__all__ = ["KINDS", "Collection", "Entry", "Kind", "Store", "StoreError", "status_body"]

Obj = dict[str, Any]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    return _rfc3339(datetime.now(UTC))


@dataclass(frozen=True)
class Kind:
    """One resource type served by the stand-in."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    # an update (PUT) without metadata.resourceVersion is allowed (AllowUnconditionalUpdate)
    unconditional_update: bool = True
    # DELETE answers with the object (pods, namespaces) rather than a Status
    returns_deleted: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How kube-apiserver names the resource in messages: ``pods``,
        ``leases.coordination.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str, **extra: str) -> dict[str, str]:
        """A ``Status``'s ``details`` about one object of this resource."""
        out = {"name": name}
        if self.group:
            out["group"] = self.group
        out["kind"] = self.plural
        out.update(extra)
        return out

    @property
    def name(self) -> str:
        """The name used in counters and fault rules: ``plural``, except for the
        second events API, which is ``events.events.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group == "events.k8s.io" else self.plural


KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True,
         returns_deleted=True),
    Kind("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    Kind("", "v1", "pods", "Pod", namespaced=True, has_status=True, returns_deleted=True),
    Kind("", "v1", "events", "Event", namespaced=True),
    Kind("", "v1", "configmaps", "ConfigMap", namespaced=True),
    Kind("", "v1", "secrets", "Secret", namespaced=True),
    Kind("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
         "MutatingWebhookConfiguration", namespaced=False),
    Kind("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
         "ValidatingWebhookConfiguration", namespaced=False),
    Kind("events.k8s.io", "v1", "events", "Event", namespaced=True),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True,
         unconditional_update=False),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True,
         has_status=True),
    Kind("", "v1", "resourcequotas", "ResourceQuota", namespaced=True, has_status=True),
    Kind("apps", "v1", "replicasets", "ReplicaSet", namespaced=True, has_status=True),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
         namespaced=True),
    Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True,
         has_status=True),
)


class Entry:
    """One stored object version: the dict and its JSON bytes."""

    __slots__ = ("name", "namespace", "obj", "raw", "rv")

    def __init__(self, obj: Obj) -> None:
        meta = obj["metadata"]
        self.obj = obj
        self.namespace: str = meta.get("namespace", "")
        self.name: str = meta["name"]
        self.rv = int(meta["resourceVersion"])
        self.raw = _dumps(obj)


def storage_key(entry: Entry) -> str:
    """The order of kube-apiserver's storage (etcd keys, the watch cache's store)."""
    return f"{entry.namespace}/{entry.name}" if entry.namespace else entry.name


@dataclass(frozen=True, slots=True)
class Change:
    rv: int
    type: bytes  # b"ADDED" | b"MODIFIED" | b"DELETED"
    entry: Entry
    old: Entry | None


class Watcher:
    """One open watch: a filter and a queue of encoded event lines."""

    __slots__ = (
        "closed",
        "fields",
        "filtered",
        "kind",
        "labels",
        "lines",
        "max_pending",
        "namespace",
        "wake",
    )

    def __init__(
        self,
        kind: Kind,
        namespace: str | None,
        labels: Callable[[Mapping[str, str]], bool],
        fields: Predicate,
        *,
        filtered: bool,
        max_pending: int,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.filtered = filtered
        self.lines: list[bytes] = []
        self.wake = asyncio.Event()
        self.closed = False
        self.max_pending = max_pending

    def matches(self, entry: Entry) -> bool:
        if self.namespace is not None and entry.namespace != self.namespace:
            return False
        if not self.filtered:
            return True
        return self.labels(entry.obj["metadata"].get("labels") or {}) and self.fields(entry.obj)

    def push(self, type_: bytes, entry: Entry) -> None:
        if self.closed:
            return
        self.lines.append(b'{"type":"' + type_ + b'","object":' + entry.raw + b"}\n")
        if len(self.lines) > self.max_pending:
            # A consumer this far behind is cut off, as the real server does.
            self.close()
        self.wake.set()

    def offer(self, change: Change) -> None:
        new_match = self.matches(change.entry)
        if change.type != b"MODIFIED" or change.old is None:
            if new_match:
                self.push(change.type, change.entry)
            return
        old_match = self.matches(change.old)
        if new_match and old_match:
            self.push(b"MODIFIED", change.entry)
        elif new_match:
            self.push(b"ADDED", change.entry)
        elif old_match:
            self.push(b"DELETED", change.entry)

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class Collection:
    """The objects, history and watchers of one resource type."""

    def __init__(self, kind: Kind, history_size: int) -> None:
        self.kind = kind
        self.objects: dict[tuple[str, str], Entry] = {}
        self.history: deque[Change] = deque()
        self.history_size = history_size
        self.compacted = 0
        self.watchers: set[Watcher] = set()

    def changes_since(self, rv: int) -> list[Change] | None:
        """The changes after ``rv``, oldest first; ``None`` when ``rv`` is too old."""
        if rv < self.compacted:
            return None
        out: list[Change] = []
        for change in reversed(self.history):
            if change.rv <= rv:
                break
            out.append(change)
        out.reverse()
        return out


class Store:
    """All collections, the global resourceVersion and list snapshots for paging.

    ``kubelets``: whether a kubelet on every node confirms a graceful pod deletion at
    once (see :meth:`delete`); False is a control plane without kubelets, where a bound
    pod deleted with a grace period stays, being deleted, until it is deleted with 0.
    """

    def __init__(
        self, *, history_size: int = 10_000, max_pending: int = 200_000, kubelets: bool = True
    ) -> None:
        self.rv = 1
        self.max_pending = max_pending
        self.kubelets = kubelets
        self.collections: dict[tuple[str, str, str], Collection] = {
            (k.group, k.version, k.plural): Collection(k, history_size) for k in KINDS
        }
        self._snapshots: OrderedDict[int, tuple[int, list[Entry]]] = OrderedDict()
        self._snapshot_ids = itertools.count(1)

    # -- lookup ---------------------------------------------------------------------

    def collection(self, group: str, version: str, plural: str) -> Collection:
        try:
            return self.collections[(group, version, plural)]
        except KeyError:
            gv = f"{group}/{version}" if group else version
            raise StoreError(
                404, "NotFound", f"the server could not find the requested resource ({gv} {plural})"
            ) from None

    def by_name(self, resource: str) -> Collection:
        """A collection by its counter name (``pods``, ``leases``, ``events.events.k8s.io``)."""
        for col in self.collections.values():
            if col.kind.name == resource:
                return col
        raise KeyError(resource)

    def _get(self, col: Collection, namespace: str, name: str) -> Entry:
        entry = col.objects.get((namespace, name))
        if entry is None:
            raise StoreError(
                404, "NotFound", f'{col.kind.qualified} "{name}" not found', col.kind.details(name)
            )
        return entry

    def get(self, col: Collection, namespace: str, name: str) -> Entry:
        return self._get(col, namespace if col.kind.namespaced else "", name)

    # -- writes ---------------------------------------------------------------------

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _commit(self, col: Collection, type_: bytes, entry: Entry, old: Entry | None) -> None:
        change = Change(entry.rv, type_, entry, old)
        col.history.append(change)
        if len(col.history) > col.history_size:
            col.compacted = col.history.popleft().rv
        for watcher in col.watchers:
            watcher.offer(change)

    def _store(self, col: Collection, obj: Obj, old: Entry) -> Entry:
        """Store ``obj`` (its metadata already a copy) as the next version of ``old``."""
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        entry = Entry(obj)
        col.objects[(old.namespace, old.name)] = entry
        self._commit(col, b"MODIFIED", entry, old)
        return entry

    def _remove(self, col: Collection, old: Entry) -> Entry:
        """Delete ``old`` from storage; the DELETED event carries the object as last
        stored, at a new resourceVersion (as kube-apiserver's does)."""
        obj = dict(old.obj)
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = str(self._next_rv())
        obj["metadata"] = meta
        entry = Entry(obj)
        del col.objects[(old.namespace, old.name)]
        self._commit(col, b"DELETED", entry, old)
        return entry

    @staticmethod
    def _conflict(col: Collection, name: str, message: str, *, on: str | None = None,
                  kind: str | None = None) -> StoreError:
        """409 ``Conflict``: ``Operation cannot be fulfilled on <on> "<name>": <message>``;
        ``on`` and the details' ``kind`` are the resource's qualified name unless given."""
        details = col.kind.details(name)
        if kind is not None:
            details = {"name": name, "kind": kind}
        return StoreError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {on or col.kind.qualified} "{name}": {message}',
            details,
        )

    @staticmethod
    def _normalise(kind: Kind, obj: Obj, *, creating: bool, validate: bool = True) -> Obj:
        """kube-apiserver's defaults and checks for the kinds vgpud writes
        (``objects.py``)."""
        if kind.group == "":
            if kind.plural == "pods":
                return objects.pod(obj, creating=creating, validate=validate)
            if kind.plural == "nodes":
                return objects.node(obj, validate=validate)
        elif kind.plural == "leases" and validate:
            objects.check_lease(obj)
        return obj

    def create(
        self, col: Collection, namespace: str | None, body: Any, *, validate: bool = True
    ) -> Entry:
        """``POST``: an object, with kube-apiserver's defaults and, with ``validate``,
        its checks. The control API creates without them (``validate=False``): the
        test's hand, which may store what a real server refuses (a hostile name, a
        malformed quantity) to see what vgpud makes of it."""
        kind = col.kind
        if not isinstance(body, dict):
            raise StoreError(400, "BadRequest", "the request body must be a JSON object")
        meta = dict(body.get("metadata") or {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = objects.generate_name(str(meta["generateName"]))
            else:
                raise StoreError(
                    422,
                    "Invalid",
                    f'{kind.kind} "" is invalid: metadata.name: Required value: name or '
                    "generateName is required",
                    {"kind": kind.kind, "causes": [{
                        "reason": "FieldValueRequired", "field": "metadata.name",
                        "message": "Required value: name or generateName is required"}]},
                )
        if kind.namespaced:
            ns = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise StoreError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace "
                    "sent on the request",
                )
            meta["namespace"] = ns
        else:
            ns = ""
            meta.pop("namespace", None)
        if validate:
            objects.check_name(kind.kind, kind.plural, meta)
        key = (ns, meta["name"])
        if key in col.objects:
            raise StoreError(
                409,
                "AlreadyExists",
                f'{kind.qualified} "{meta["name"]}" already exists',
                kind.details(meta["name"]),
            )
        obj = dict(body)
        obj["metadata"] = meta
        obj = self._normalise(kind, obj, creating=True, validate=validate)
        if validate and kind.plural == "events" and kind.group == "":
            objects.check_event(obj, ns)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta.setdefault("generation", 1)
        meta.pop("deletionTimestamp", None)
        meta.pop("deletionGracePeriodSeconds", None)
        meta["resourceVersion"] = str(self._next_rv())
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        obj["metadata"] = meta
        entry = Entry(obj)
        col.objects[key] = entry
        self._commit(col, b"ADDED", entry, None)
        return entry

    def _replace(
        self,
        col: Collection,
        old: Entry,
        new_obj: Any,
        subresource: str | None,
        *,
        put: bool = False,
    ) -> Entry:
        """Store ``new_obj`` as the next version of ``old``, enforcing preconditions."""
        kind = col.kind
        if not isinstance(new_obj, dict):
            raise StoreError(400, "BadRequest", "the object must be a JSON object")
        new_meta = new_obj.get("metadata")
        if not isinstance(new_meta, dict):
            new_meta = {}
        wanted_rv = new_meta.get("resourceVersion")
        if wanted_rv in (None, "") and put and not kind.unconditional_update:
            raise StoreError(
                422,
                "Invalid",
                f'{kind.qualified} "{old.name}" is invalid: metadata.resourceVersion: Invalid '
                "value: 0: must be specified for an update",
                {**kind.details(old.name), "causes": [{
                    "reason": "FieldValueInvalid", "field": "metadata.resourceVersion",
                    "message": "Invalid value: 0: must be specified for an update"}]},
            )
        if wanted_rv not in (None, "") and str(wanted_rv) != str(old.rv):
            raise self._conflict(
                col,
                old.name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        if new_meta.get("name", old.name) != old.name:
            raise StoreError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        old_meta = old.obj["metadata"]
        meta = dict(new_meta)
        server_fields = ["uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                         "deletionGracePeriodSeconds"]
        if subresource == "status":
            # As kube-apiserver's status strategies (pods, nodes, PodDisruptionBudgets):
            # the status and the metadata change, the rest stays; a pod's owners too.
            obj = dict(old.obj)
            if "status" in new_obj:
                obj["status"] = new_obj["status"]
            else:
                obj.pop("status", None)
            server_fields += ["generation"] + (["ownerReferences"] if kind.kind == "Pod" else [])
        else:
            obj = dict(new_obj)
            if kind.has_status:
                # As on the real server, the main resource ignores status changes.
                if "status" in old.obj:
                    obj["status"] = old.obj["status"]
                else:
                    obj.pop("status", None)
            if obj.get("spec") != old.obj.get("spec"):
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        for server_field in server_fields:
            if server_field in old_meta:
                meta[server_field] = old_meta[server_field]
            else:
                meta.pop(server_field, None)
        obj["metadata"] = meta
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        if obj.get("spec") is not old.obj.get("spec") or obj.get("status") is not old.obj.get(
                "status"):  # (a patch shares what it leaves alone: that was checked before)
            obj = self._normalise(kind, obj, creating=False)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and (
                int(meta.get("deletionGracePeriodSeconds") or 0) == 0):
            # the last finalizer of an object being deleted went: it goes, as it was
            return self._remove(col, old)
        return self._store(col, obj, old)

    def update(
        self,
        col: Collection,
        namespace: str,
        name: str,
        body: Any,
        subresource: str | None = None,
    ) -> Entry:
        old = self.get(col, namespace, name)
        return self._replace(col, old, body, subresource, put=True)

    def patch(
        self,
        col: Collection,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> tuple[Entry, bool]:
        """Apply a patch; returns the new entry and whether it was created (apply only)."""
        if content_type == patches.APPLY:
            if not field_manager:
                raise StoreError(
                    400, "BadRequest", "PATCH with apply requires the fieldManager parameter"
                )
            if not isinstance(patch, dict):
                raise StoreError(400, "BadRequest", "the applied configuration must be an object")
            key = (namespace if col.kind.namespaced else "", name)
            if key not in col.objects:
                body = dict(patch)
                meta = dict(body.get("metadata") or {})
                meta["name"] = name
                body["metadata"] = meta
                return self.create(col, namespace or None, body), True
        old = self.get(col, namespace, name)
        try:
            if content_type == patches.JSON_PATCH:
                new_obj = patches.json_patch(old.obj, patch)
            elif content_type == patches.STRATEGIC:
                new_obj = patches.strategic_merge_patch(old.obj, patch)
            elif content_type in (patches.MERGE, patches.APPLY):
                new_obj = patches.merge_patch(old.obj, patch)
            else:
                raise StoreError(
                    415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported"
                )
        except patches.PatchError as exc:
            if exc.code == 400:
                raise StoreError(400, "BadRequest", str(exc)) from None
            # kube-apiserver loses the reason: jsonpatch's error becomes a bare 422
            raise StoreError(422, "Invalid", patches.REJECTED, {}) from None
        return self._replace(col, old, new_obj, subresource), False

    def delete(
        self, col: Collection, namespace: str, name: str, options: Mapping[str, Any] | None = None
    ) -> tuple[Entry, bool]:
        """``DELETE``, as kube-apiserver does it; returns the object as last written and
        whether it is gone from storage.

        An object with finalizers is only marked (``deletionTimestamp``; its DELETED
        comes when an update removes the last finalizer). A pod is deleted gracefully:
        the grace period is ``gracePeriodSeconds`` if given, else the pod's
        ``terminationGracePeriodSeconds``, and 0 for a pod not bound to a node or in a
        terminal phase. With 0 the pod is marked (MODIFIED) and then deleted (DELETED);
        with more it is marked, and it is the kubelet that deletes it once its
        containers stopped — at once here when ``kubelets`` (MODIFIED, then DELETED),
        never without (it stays, being deleted, until a DELETE with 0). A second DELETE
        of a pod being deleted only shortens its grace period.
        """
        old = self.get(col, namespace, name)
        options = options or {}
        pre = options.get("preconditions") or {}
        old_meta = old.obj["metadata"]
        if pre.get("uid") and pre["uid"] != old_meta.get("uid"):
            raise self._conflict(
                col, name,
                f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                f"({old_meta.get('uid')}). The object might have been deleted and then "
                "recreated", on=col.kind.kind, kind=col.kind.kind)
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != str(old.rv):
            raise self._conflict(
                col, name,
                f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not "
                f"match the ResourceVersion in record ({old.rv}). The object might have been "
                "modified", on=col.kind.kind, kind=col.kind.kind)
        grace = 0
        if col.kind.plural == "pods" and col.kind.group == "":
            spec, status = old.obj.get("spec") or {}, old.obj.get("status") or {}
            asked = options.get("gracePeriodSeconds")
            grace = int(asked if asked is not None
                        else spec.get("terminationGracePeriodSeconds", 30) or 0)
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0
        current = old_meta.get("deletionGracePeriodSeconds")
        if old_meta.get("deletionTimestamp") and (current is None or grace >= int(current)):
            return old, False  # already being deleted, no sooner than asked
        meta = dict(old_meta)
        meta["deletionTimestamp"] = _rfc3339(datetime.now(UTC) + timedelta(seconds=grace))
        meta["deletionGracePeriodSeconds"] = grace
        if not meta.get("finalizers") and not (col.kind.plural == "pods" and grace > 0):
            if col.kind.plural != "pods":
                return self._remove(col, old), True
            marked = self._store(col, {**old.obj, "metadata": meta}, old)
            return self._remove(col, marked), True
        marked = self._store(col, {**old.obj, "metadata": meta}, old)
        if grace > 0 and self.kubelets and not meta.get("finalizers"):
            self._remove(col, marked)  # the kubelet confirms: its containers stopped
        return marked, False

    def remove(self, col: Collection, namespace: str, name: str) -> Entry:
        """Delete an object from storage at once: one DELETED event, no grace, no
        finalizers (the in-process control API's hand, not an HTTP behaviour)."""
        return self._remove(col, self.get(col, namespace, name))

    def bind(self, namespace: str, name: str, body: Any) -> None:
        """``POST pods/{name}/binding``: set ``spec.nodeName`` once, and copy the Binding's
        ``metadata.annotations`` onto the pod in the same update, as kube-apiserver does
        (``BindingREST.Create`` and ``setPodNodeAndMetadata``,
        pkg/registry/core/pod/storage/storage.go): the Binding's name must be the pod's
        (400); its target must name a node (500, as there); its UID and resourceVersion
        are preconditions; a pod being deleted or already assigned is refused (409 on
        ``pods/binding``); each annotation overwrites the pod's."""
        col = self.collections[("", "v1", "pods")]
        if not isinstance(body, dict):
            raise StoreError(400, "BadRequest", "the Binding must be a JSON object")
        meta_in = body.get("metadata") or {}
        if not isinstance(meta_in, dict) or meta_in.get("name") != name:
            raise StoreError(400, "BadRequest", "name in URL does not match name in Binding object")
        annotations = meta_in.get("annotations")
        if annotations is not None and not (
                isinstance(annotations, dict)
                and all(isinstance(k, str) and isinstance(v, str)
                        for k, v in annotations.items())):
            raise StoreError(
                400, "BadRequest", 'Binding in version "v1" cannot be handled as a Binding: '
                "json: cannot unmarshal into Go struct field ObjectMeta.metadata.annotations "
                "of type string")
        target = body.get("target") or {}
        node = target.get("name") if isinstance(target, dict) else None
        if not node:
            raise StoreError(500, "", "target.name: Required value")
        problem = objects.name_problem(str(node))
        if problem is not None:
            raise StoreError(500, "", f'target.name: Invalid value: "{node}": {problem}')
        old = self.get(col, namespace, name)
        uid = meta_in.get("uid")
        storage = (f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/"
                   f"{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: ")
        if uid and uid != old.obj["metadata"].get("uid"):
            raise self._conflict(
                col, name, f"{storage}UID in precondition: {uid}, "
                f"UID in object meta: {old.obj['metadata'].get('uid')}")
        rv = meta_in.get("resourceVersion")
        if rv and rv != old.obj["metadata"].get("resourceVersion"):
            raise self._conflict(
                col, name, f"{storage}ResourceVersion in precondition: {rv}, "
                f"ResourceVersion in object meta: {old.obj['metadata'].get('resourceVersion')}")
        binding = {"on": "pods/binding", "kind": "pods/binding"}
        if old.obj["metadata"].get("deletionTimestamp"):
            raise self._conflict(col, name, f"pod {name} is being deleted, cannot be assigned "
                                 "to a host", **binding)
        current = (old.obj.get("spec") or {}).get("nodeName")
        if current:
            raise self._conflict(col, name, f'pod {name} is already assigned to node "{current}"',
                                 **binding)
        obj = dict(old.obj)
        spec = dict(obj.get("spec") or {})
        spec["nodeName"] = node
        obj["spec"] = spec
        status = dict(obj.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": now_rfc3339()})
        status["conditions"] = conditions
        obj["status"] = status
        meta = dict(obj["metadata"])
        if annotations:
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        obj["metadata"] = meta
        self._store(col, obj, old)

    # -- reads ----------------------------------------------------------------------

    def matching(
        self,
        col: Collection,
        namespace: str | None,
        labels: str | None,
        fields: str | None,
    ) -> list[Entry]:
        entries: Iterable[Entry] = col.objects.values()
        if namespace is not None and col.kind.namespaced:
            entries = (e for e in entries if e.namespace == namespace)
        if labels or fields:
            lp = label_selector(labels)
            fp = field_selector(fields, col.kind.plural, col.kind.namespaced)
            entries = (
                e for e in entries if lp(e.obj["metadata"].get("labels") or {}) and fp(e.obj)
            )
        # in storage key order (``namespace/name``), as kube-apiserver lists
        return sorted(entries, key=storage_key)

    def list_page(
        self,
        col: Collection,
        namespace: str | None,
        labels: str | None,
        fields: str | None,
        limit: int | None,
        continue_token: str | None,
    ) -> tuple[int, list[Entry], str | None, int | None]:
        """A consistent page: (resourceVersion, entries, continue token, remaining)."""
        if continue_token:
            try:
                token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                snap_id, offset = int(token["id"]), int(token["offset"])
            except (ValueError, KeyError, TypeError):
                raise StoreError(400, "BadRequest", "invalid continue token") from None
            snap = self._snapshots.get(snap_id)
            if snap is None or snap[0] < col.compacted:
                raise StoreError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter.",
                )
            rv, entries = snap
        else:
            rv, entries, offset = self.rv, self.matching(col, namespace, labels, fields), 0
        if not limit or offset + limit >= len(entries):
            return rv, entries[offset:], None, None
        if not continue_token:
            snap_id = next(self._snapshot_ids)
            self._snapshots[snap_id] = (rv, entries)
            while len(self._snapshots) > 32:
                self._snapshots.popitem(last=False)
        token = base64.urlsafe_b64encode(_dumps({"id": snap_id, "offset": offset + limit})).decode()
        return rv, entries[offset : offset + limit], token, len(entries) - offset - limit

    # -- watches and faults -----------------------------------------------------------

    def open_watch(
        self,
        col: Collection,
        namespace: str | None,
        labels: str | None,
        fields: str | None,
        since: int | None,
        *,
        initial_events: bool | None = None,
    ) -> tuple[Watcher, bool]:
        """Register a watcher; returns it and False when ``since`` is too old (410).

        ``initial_events`` is the request's ``sendInitialEvents`` (after defaulting):
        ``None`` is the legacy watch (``since`` None: an ADDED for every current
        object first; else the changes after ``since``). ``True``: an ADDED for every
        current object in key order (``namespace/name``, the order of kube-apiserver's
        watch cache store), whatever ``since`` is — "not older than" it, so never
        410. ``False``: no initial events; from now (``since`` None) or from ``since``.
        """
        watcher = Watcher(
            col.kind,
            namespace if col.kind.namespaced else None,
            label_selector(labels),
            field_selector(fields, col.kind.plural, col.kind.namespaced),
            filtered=bool(labels or fields),
            max_pending=self.max_pending,
        )
        if initial_events:
            matching = sorted((e for e in col.objects.values() if watcher.matches(e)),
                              key=storage_key)
            for entry in matching:
                watcher.push(b"ADDED", entry)
        elif since is None:
            if initial_events is None:
                for entry in sorted(col.objects.values(), key=storage_key):
                    if watcher.matches(entry):
                        watcher.push(b"ADDED", entry)
        else:
            changes = col.changes_since(since)
            if changes is None:
                return watcher, False
            for change in changes:
                watcher.offer(change)
        col.watchers.add(watcher)
        return watcher, True

    def close_watch(self, watcher: Watcher) -> None:
        for col in self.collections.values():
            col.watchers.discard(watcher)

    def drop_watches(self, resource: str | None = None) -> int:
        dropped = 0
        for col in self.collections.values():
            if resource is None or col.kind.name == resource:
                for watcher in list(col.watchers):
                    watcher.close()
                    dropped += 1
                col.watchers.clear()
        return dropped

    def compact(self, resource: str | None = None) -> int:
        """Forget history so that every resourceVersion handed out so far is too old."""
        rv = self._next_rv()
        for col in self.collections.values():
            if resource is None or col.kind.name == resource:
                col.history.clear()
                col.compacted = rv
        return rv
