"""A stand-in Kubernetes API server (aiohttp) for tests, e2e runs and benchmarks.

Serves core/v1 ``namespaces``, ``nodes``, ``pods`` (+ ``pods/binding``,
``pods/status``), ``events``, ``configmaps``; ``events.k8s.io/v1`` ``events``;
``coordination.k8s.io/v1`` ``leases``; plus ``/api``, ``/apis``, ``/version`` and
``/healthz``. Semantics follow the real server where our code depends on them, each
checked against kube-apiserver 1.37.2 by tests/realkube/test_standin_agrees.py (the same
test on both servers; the real server's answers, messages included, are its
expectations):

- list: ``resourceVersion`` in the list metadata, ``labelSelector``,
  ``fieldSelector`` (the per-resource fields the real server allows, see
  ``selectors.py``), ``limit``/``continue`` over a consistent snapshot (410 once it is
  evicted), items in storage key order (``namespace/name``);
- watch: ``watch=true`` from ``resourceVersion`` (unset or ``0``: synthetic ADDED
  for every current object first), ``allowWatchBookmarks`` (a BOOKMARK every
  ``bookmark_interval`` s), ``timeoutSeconds``; a resourceVersion older than the
  bounded history answers 200 with one ERROR event carrying a 410 ``Status``;
  objects leaving a filtered watch arrive as DELETED, entering ones as ADDED;
- streaming lists (KEP-3157 "WatchList"), when ``watch_list`` is on:
  ``sendInitialEvents=true`` (with ``resourceVersionMatch=NotOlderThan``) sends an
  ADDED for every matching object in key order, then — with
  ``allowWatchBookmarks=true`` — a BOOKMARK annotated
  ``k8s.io/initial-events-end: "true"`` at the current resourceVersion, then live
  events. The list options are defaulted and validated as kube-apiserver does
  (``SetListOptionsDefaults``/``ValidateListOptions``, k8s.io/apimachinery
  pkg/apis/meta/internalversion): with the feature on, a watch from ``""``/``0``
  without those parameters becomes a streaming list; invalid combinations answer
  422 ``Invalid`` with the real message (``ListOptions.meta.k8s.io "" is invalid:
  ...``). With ``watch_list`` off (the default: kube-apiserver 1.33, which the
  stand-in reports, ships WatchList beta but *off*; 1.32 and 1.34+ have it on) any
  ``sendInitialEvents`` on a watch answers 422 ``sendInitialEvents: Forbidden:
  sendInitialEvents is forbidden for watch unless the WatchList feature gate is
  enabled``, as such a server does. ``sendInitialEvents`` without
  ``allowWatchBookmarks`` is not an error on the real server: the initial events
  come, the end bookmark does not. With ``ignore_send_initial_events`` the server
  acts as one that never sees those parameters — kube-apiserver with the feature off
  behind a proxy that drops ``sendInitialEvents`` and ``resourceVersionMatch`` (what
  tests/realkube checks it against): the watch is served as a legacy one from
  ``""``, initial ADDEDs and then only periodic bookmarks, never the end one;
- ``/version`` reports ``version`` (``v1.33.0-standin`` by default: major, minor and
  gitVersion, as kube-apiserver does), counts as ``get version``, and fails by a fault
  rule that names the resource ``version``;
- get / create (``generateName``, uid, creationTimestamp, 409 AlreadyExists, names
  validated; kube-apiserver's defaults and canonical quantities, see ``objects.py``
  and ``quantity.py``) / replace (a Lease's needs its resourceVersion) / delete;
- delete as kube-apiserver does it (``Store.delete``): DeleteOptions preconditions
  (uid, resourceVersion); finalizers hold an object, marked with a
  ``deletionTimestamp``, until an update removes the last; a pod is deleted
  gracefully — one not bound to a node, or done, is marked and deleted at once
  (MODIFIED, DELETED), a bound one is marked for its grace period and deleted by its
  kubelet: with ``kubelets`` (the default) a kubelet on every node confirms at once
  (MODIFIED, DELETED), without (``kubelets=False``, ``--no-kubelets``: a control plane
  with none, like tests/realkube's) the pod stays until deleted with grace 0. A pod or
  namespace DELETE answers the object, any other kind a ``Status`` (or the object,
  while a finalizer holds it). The in-process ``ApiServer.delete`` removes at once;
- the four patch types (see ``patches.py`` for what strategic merge and apply do);
  ``metadata.resourceVersion`` in a replace or patch is a precondition → 409
  Conflict; status changes through the main resource of pods/nodes are ignored, and
  the status subresource takes the metadata and status, never the spec;
- ``pods/binding`` sets ``spec.nodeName`` and copies the Binding's annotations onto
  the pod in one update (400 if its name is not the pod's; 409 on ``pods/binding`` if
  already bound or being deleted, on ``pods`` if the Binding's uid or resourceVersion
  precondition fails; 500 without a valid target, as there) and answers 201 with a
  ``Status`` (which is what trips kubernetes_asyncio's Binding model);
- error bodies: a ``Status`` with kube-apiserver's ``reason``, ``message`` and
  ``details`` (name, group, kind; a JSON patch that does not apply gets its bare
  ``422`` with empty details); an injected fault carries the rule's message and
  those details (a 429's ``retryAfterSeconds`` too).

Differences kept, on purpose (none reaches what vgpud reads or writes; the test above
would show one that did):

- no admission (ServiceAccount, Priority, DefaultTolerationSeconds, TaintNodesByCondition,
  webhooks), no RBAC, no namespace lifecycle (a namespace need not exist; deleting
  one deletes nothing else), and only the validation listed in ``objects.py`` — tests
  set ``spec.priority`` themselves and move pods between nodes by patching the spec;
- fields a client sends as ``null`` are kept (kube-apiserver drops them while
  decoding): dropping them means walking every object written, too slow for the
  50,000-pod runs, and vgpud reads none back;
- ``managedFields``, ``status.qosClass`` and server-side apply's field ownership are
  not kept; strategic merge patches replace lists (``patches.py``);
- the watch history is a count of changes per resource (``history_size``), not
  kube-apiserver's time-bounded watch cache; bookmarks come every
  ``bookmark_interval`` s (a minute there) — tests/realkube/test_informers.py has
  the real cadence.

Control API, in-process (methods of ``ApiServer``) and over HTTP for the
out-of-process mode (``python -m tests.standin``)::

    POST   /_standin/faults        {"verb","resource","status","times","fraction",
                                     "latency","message","retryAfter","after"} -> {"id": n}
    DELETE /_standin/faults        remove all rules
    POST   /_standin/drop-watches  {"resource": optional}  -> {"dropped": n}
    POST   /_standin/compact       {"resource": optional}  -> {"resourceVersion": rv}
    GET    /_standin/counts        -> {"counts": {"patch pods": n, ...}, "watches": k,
                                       "watchLists": {"pods": n, ...},
                                       "peaks": {"create pods/binding": most at once, ...}}
    DELETE /_standin/counts        reset the counters (and the peaks)
    GET    /_standin/watch-list    -> {"enabled": bool, "ignored": bool}
    PUT    /_standin/watch-list    {"enabled": bool, "ignored": bool} (either) -> the same
    POST   /_standin/cut-watch-lists {"resource", "after", "times"} -> {}
    POST   /_standin/objects       {"items": [...]} bulk create -> {"created": n}
    GET    /_standin/state         -> {"items": [...]} every stored object

Usage in a test::

    async with ApiServer() as api:
        api.create("nodes", {"metadata": {"name": "n1"}})
        api.fail("patch", "pods", 409, times=1)
        ... api.url ...
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from tests.standin import patches
from tests.standin.faults import FaultRule, Faults, RequestCounter, reason_for
from tests.standin.selectors import SelectorError
from tests.standin.store import KINDS, Collection, Entry, Store, StoreError, status_body

_JSON = "application/json"
_TRUE = ("true", "1", "True")
NOT_OLDER_THAN = "NotOlderThan"
# metav1.InitialEventsAnnotationKey
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type=_JSON
    )


def _raw_response(raw: bytes, status: int = 200) -> web.Response:
    return web.Response(body=raw, status=status, content_type=_JSON)


def _flag(value: str | None) -> bool | None:
    """A boolean query parameter as kube-apiserver decodes it into a ``*bool``
    (``Convert_Slice_string_To_Pointer_bool``, k8s.io/apimachinery pkg/runtime/
    conversion.go): absent is None; ``0`` or ``false`` (any case) is False; anything
    else, the empty string included, is True."""
    if value is None:
        return None
    return not (value == "0" or value.lower() == "false")


@dataclass(frozen=True)
class _FieldError:
    """One ``field.Error``: its cause type, path and ``ErrorBody()``."""

    type: str
    field: str
    body: str

    @classmethod
    def forbidden(cls, field: str, detail: str) -> _FieldError:
        return cls("FieldValueForbidden", field, f"Forbidden: {detail}")

    @classmethod
    def not_supported(cls, field: str, value: str, supported: list[str]) -> _FieldError:
        quoted = ", ".join(json.dumps(v) for v in supported)
        return cls(
            "FieldValueNotSupported",
            field,
            f"Unsupported value: {json.dumps(value)}: supported values: {quoted}",
        )


def _invalid_list_options(errors: list[_FieldError]) -> StoreError:
    """``errors.NewInvalid(meta.k8s.io/ListOptions, "", errs)`` as kube-apiserver's
    list/watch handler returns it (the aggregate message drops repeats; one error
    stands alone, several are bracketed)."""
    messages = list(dict.fromkeys(f"{e.field}: {e.body}" for e in errors))
    text = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    return StoreError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {text}',
        {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": e.type, "message": e.body, "field": e.field} for e in errors],
        },
    )


def list_options(query: Mapping[str, str], *, watch: bool, watch_list: bool) -> bool | None:
    """Default and validate the list options of a list or watch request as
    kube-apiserver does; returns ``sendInitialEvents`` after defaulting, raises the
    422 ``StoreError`` otherwise.

    ``SetListOptionsDefaults`` (pkg/apis/meta/internalversion/defaults.go): with
    WatchList on, a watch with neither ``sendInitialEvents`` nor
    ``resourceVersionMatch`` from ``""`` or ``"0"`` gets ``sendInitialEvents=true``
    and ``resourceVersionMatch=NotOlderThan``. ``ValidateListOptions`` (validation/
    validation.go): the rules below, in its order."""
    send = _flag(query.get("sendInitialEvents"))
    match = query.get("resourceVersionMatch") or ""
    rv = query.get("resourceVersion") or ""
    if watch_list and watch and send is None and not match and rv in ("", "0"):
        send, match = True, NOT_OLDER_THAN
    errors: list[_FieldError] = []
    rvm = "resourceVersionMatch"

    def forbid(field: str, detail: str) -> None:
        errors.append(_FieldError.forbidden(field, detail))

    if watch:  # validateWatchOptions
        if send is not None:
            if match != NOT_OLDER_THAN:
                forbid(rvm, f"sendInitialEvents requires setting {rvm} to {NOT_OLDER_THAN}")
            if not watch_list:
                forbid(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for watch unless the WatchList feature "
                    "gate is enabled",
                )
        if match:
            if send is None:
                forbid(rvm, f"{rvm} is forbidden for watch unless sendInitialEvents is provided")
            if match != NOT_OLDER_THAN:
                errors.append(_FieldError.not_supported(rvm, match, [NOT_OLDER_THAN]))
            if query.get("continue"):
                forbid(rvm, f"{rvm} is forbidden when continue is provided")
    else:
        if match:
            if not rv:
                forbid(rvm, f"{rvm} is forbidden unless resourceVersion is provided")
            if query.get("continue"):
                forbid(rvm, f"{rvm} is forbidden when continue is provided")
            if match not in ("Exact", NOT_OLDER_THAN):
                errors.append(_FieldError.not_supported(rvm, match, ["Exact", NOT_OLDER_THAN, ""]))
            if match == "Exact" and rv == "0":
                forbid(rvm, f'{rvm} "exact" is forbidden for resourceVersion "0"')
        if send is not None:
            forbid("sendInitialEvents", "sendInitialEvents is forbidden for list")
    if errors:
        raise _invalid_list_options(errors)
    return send


def _error(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> web.Response:
    response = _json_response(status_body(code, reason, message, details), code)
    if code == 429:
        response.headers["Retry-After"] = "1"
    return response


class ApiServer:
    """The stand-in server; ``async with ApiServer() as api`` serves on ``api.url``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        bookmark_interval: float = 1.0,
        history_size: int = 10_000,
        max_watch_seconds: float = 1800.0,
        seed: int = 0,
        watch_list: bool = False,
        ignore_send_initial_events: bool = False,
        version: str = "v1.33.0-standin",
        kubelets: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.store = Store(history_size=history_size, kubelets=kubelets)
        self.faults = Faults(seed)
        self.counts = RequestCounter()
        # Requests being answered now, and the most answered at once, per (verb, resource)
        # (a fault's latency included): whether writes overlapped, without timing them.
        self.in_flight = RequestCounter()
        self.peaks = RequestCounter()
        # The WatchList feature (streaming lists); see the module docstring. Flip it
        # at any time: it applies to the next watch request.
        self.watch_list = watch_list
        # A server that never sees sendInitialEvents/resourceVersionMatch (see the module
        # docstring); like watch_list, it applies to the next watch request.
        self.ignore_send_initial_events = ignore_send_initial_events
        self.version = version  # what /version reports
        self.watch_lists: Counter[str] = Counter()  # streaming lists served, by resource
        self._cuts: dict[str, list[int]] = {}  # resource -> [after, times left]
        self._runner: web.AppRunner | None = None

    # -- lifecycle --------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/version", self._version)
        r.add_get("/healthz", self._healthz)
        r.add_get("/readyz", self._healthz)
        r.add_post("/_standin/faults", self._ctl_add_fault)
        r.add_delete("/_standin/faults", self._ctl_clear_faults)
        r.add_post("/_standin/drop-watches", self._ctl_drop_watches)
        r.add_post("/_standin/compact", self._ctl_compact)
        r.add_get("/_standin/counts", self._ctl_counts)
        r.add_delete("/_standin/counts", self._ctl_reset_counts)
        r.add_get("/_standin/watch-list", self._ctl_watch_list)
        r.add_put("/_standin/watch-list", self._ctl_watch_list)
        r.add_post("/_standin/cut-watch-lists", self._ctl_cut_watch_lists)
        r.add_post("/_standin/objects", self._ctl_objects)
        r.add_get("/_standin/state", self._ctl_state)
        for prefix in ("/api", "/apis"):
            r.add_route("*", prefix, self._dispatch)
            r.add_route("*", prefix + "/{tail:.*}", self._dispatch)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, _: web.Application) -> None:
        self.store.drop_watches()

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=2.0)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            sockets = getattr(server, "sockets", None) or []
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.store.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig that points at this server (token auth, plain HTTP)."""
        user: dict[str, Any] = {"token": self.token or "standin-token"}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": user}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
            "current-context": "standin",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- in-process control API -----------------------------------------------------------

    def _col(self, resource: str) -> Collection:
        try:
            return self.store.by_name(resource)
        except KeyError:
            raise ValueError(f"the stand-in serves no resource {resource!r}") from None

    def create(self, resource: str, obj: Mapping[str, Any], namespace: str | None = None) -> Any:
        """Create an object directly (no faults, not counted, no validation: see
        ``Store.create``); returns the stored dict."""
        col = self._col(resource)
        return self.store.create(col, namespace, dict(obj), validate=False).obj

    def get(self, resource: str, name: str, namespace: str = "default") -> Any:
        """The stored dict, or None. Treat it as read-only."""
        col = self._col(resource)
        entry = col.objects.get((namespace if col.kind.namespaced else "", name))
        return None if entry is None else entry.obj

    def objects(self, resource: str) -> list[Any]:
        return [e.obj for e in self._col(resource).objects.values()]

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        namespace: str = "default",
        content_type: str = patches.MERGE,
        subresource: str | None = None,
    ) -> Any:
        col = self._col(resource)
        return self.store.patch(col, namespace, name, content_type, patch, subresource=subresource)[
            0
        ].obj

    def delete(self, resource: str, name: str, namespace: str = "default") -> None:
        """Remove an object at once (one DELETED event; no grace period, no finalizers),
        as the test's own hand. A ``DELETE`` over HTTP deletes as kube-apiserver does."""
        self.store.remove(self._col(resource), namespace, name)

    def fail(
        self,
        verb: str,
        resource: str,
        status: int,
        *,
        times: int | None = None,
        fraction: float = 1.0,
        retry_after: int = 1,
        message: str = "injected fault",
        after: bool = False,
    ) -> FaultRule:
        """Fail matching requests with ``status`` (see ``faults.FaultRule``)."""
        return self.faults.add(
            FaultRule(
                verb,
                resource,
                status,
                times=times,
                fraction=fraction,
                retry_after=retry_after,
                message=message,
                after=after,
            )
        )

    def slow(
        self, verb: str, resource: str, latency: float, *, times: int | None = None
    ) -> FaultRule:
        """Delay matching requests by ``latency`` seconds."""
        return self.faults.add(FaultRule(verb, resource, None, times=times, latency=latency))

    def clear_faults(self) -> None:
        self.faults.clear()

    def drop_watches(self, resource: str | None = None) -> int:
        """End every open watch (of ``resource``); clients see the stream close."""
        return self.store.drop_watches(resource)

    def compact(self, resource: str | None = None) -> int:
        """Forget the history: every resourceVersion handed out so far now gets 410."""
        return self.store.compact(resource)

    def count(self, verb: str, resource: str) -> int:
        return self.counts[(verb, resource)]

    def count_watch_lists(self, resource: str) -> int:
        """Streaming lists served for ``resource`` (watches that sent initial events
        and the initial-events-end bookmark; also counted as ``watch``)."""
        return self.watch_lists[resource]

    def cut_watch_lists(self, resource: str, *, after: int = 0, times: int = 1) -> None:
        """End the next ``times`` streaming lists of ``resource`` after ``after``
        initial events, before the initial-events-end bookmark (as a proxy's timeout
        or a restarting server would)."""
        self._col(resource)
        if after < 0 or times < 1:
            raise ValueError("cut_watch_lists needs after >= 0 and times >= 1")
        self._cuts[resource] = [after, times]

    def _take_cut(self, resource: str) -> int | None:
        cut = self._cuts.get(resource)
        if cut is None:
            return None
        cut[1] -= 1
        if cut[1] <= 0:
            del self._cuts[resource]
        return cut[0]

    def open_watches(self, resource: str | None = None) -> int:
        return sum(
            len(c.watchers)
            for c in self.store.collections.values()
            if resource is None or c.kind.name == resource
        )

    # -- HTTP: discovery -----------------------------------------------------------------

    async def _version(self, _: web.Request) -> web.Response:
        self.counts[("get", "version")] += 1
        if any(rule.resource == "version" for rule in self.faults.rules):
            # only a rule that names it: "*" rules keep their counts for the resources
            decision = self.faults.decide("get", "version")
            if decision.rule is not None and decision.rule.status is not None:
                status = decision.rule.status
                return _error(status, reason_for(status), decision.rule.message)
        major, _dot, rest = self.version.lstrip("v").partition(".")
        minor = rest.split(".", 1)[0]
        return _json_response(
            {
                "major": major,
                "minor": minor,
                "gitVersion": self.version,
                "platform": "linux/amd64",
            }
        )

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _resource_list(self, group: str, version: str) -> web.Response:
        kinds = [k for k in KINDS if k.group == group and k.version == version]
        if not kinds:
            return _error(404, "NotFound", f"no API group version {group}/{version}")
        resources: list[dict[str, Any]] = []
        for k in kinds:
            resources.append(
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
            )
            if k.has_status:
                resources.append(
                    {
                        "name": f"{k.plural}/status",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "kind": k.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if k.plural == "pods":
                resources.append(
                    {
                        "name": "pods/binding",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
        return _json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": kinds[0].api_version,
                "resources": resources,
            }
        )

    def _group(self, group: str) -> dict[str, Any]:
        versions = sorted({k.version for k in KINDS if k.group == group})
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _discovery(self, prefix: str, parts: list[str]) -> web.Response | None:
        if prefix == "api":
            if not parts:
                return _json_response(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                        ],
                    }
                )
            if len(parts) == 1:
                return self._resource_list("", parts[0])
            return None
        if not parts:
            groups = sorted({k.group for k in KINDS if k.group})
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [self._group(g) for g in groups],
                }
            )
        if len(parts) == 1:
            if not any(k.group == parts[0] for k in KINDS):
                return _error(404, "NotFound", f"no API group {parts[0]}")
            return _json_response({"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[0])})
        if len(parts) == 2:
            return self._resource_list(parts[0], parts[1])
        return None

    # -- HTTP: resources -----------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if self.token is not None and auth != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unauthorized")
        prefix, _, tail = request.path.lstrip("/").partition("/")
        parts = [p for p in tail.split("/") if p]
        discovery = self._discovery(prefix, parts)
        if discovery is not None:
            return discovery if request.method == "GET" else _error(405, "MethodNotAllowed", "")
        if prefix == "api":
            group, version, rest = "", parts[0], parts[1:]
        else:
            group, version, rest = parts[0], parts[1], parts[2:]
        try:
            return await self._serve(request, group, version, rest)
        except StoreError as exc:
            return _error(exc.code, exc.reason, exc.message, exc.details)
        except SelectorError as exc:
            return _error(400, "BadRequest", str(exc))

    async def _serve(
        self, request: web.Request, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        namespace: str | None = None
        if (
            len(rest) >= 3
            and rest[0] == "namespaces"
            and (group, version, rest[2]) in self.store.collections
        ):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise StoreError(404, "NotFound", "the server could not find the requested resource")
        col = self.store.collection(group, version, rest[0])
        if col.kind.namespaced and namespace is None and len(rest) > 1:
            raise StoreError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in ("status", "binding"):
            raise StoreError(404, "NotFound", f"no subresource {sub!r}")
        if sub == "binding" and col.kind.plural != "pods":
            raise StoreError(404, "NotFound", "only pods have a binding subresource")
        if sub == "status" and not col.kind.has_status:
            raise StoreError(404, "NotFound", f"{col.kind.plural} have no status subresource")
        method = request.method
        query = request.query
        if method == "GET":
            verb = "get" if name else ("watch" if query.get("watch") in _TRUE else "list")
        elif method == "POST":
            verb = "create"
            if name and sub != "binding":
                raise StoreError(405, "MethodNotAllowed", "POST to an object is not allowed")
        elif method in ("PUT", "PATCH", "DELETE"):
            verb = {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
            if not name:
                raise StoreError(405, "MethodNotAllowed", f"{method} needs an object name")
        else:
            raise StoreError(405, "MethodNotAllowed", f"method {method} is not supported")
        resource = col.kind.name + (f"/{sub}" if sub else "")
        key = (verb, resource)
        self.counts[key] += 1
        self.in_flight[key] += 1
        self.peaks[key] = max(self.peaks[key], self.in_flight[key])
        try:
            return await self._answer(request, verb, resource, col, namespace, name, sub)
        finally:
            self.in_flight[key] -= 1

    async def _answer(
        self,
        request: web.Request,
        verb: str,
        resource: str,
        col: Collection,
        namespace: str | None,
        name: str | None,
        sub: str | None,
    ) -> web.StreamResponse:
        decision = self.faults.decide(verb, resource)
        if decision.latency:
            await asyncio.sleep(decision.latency)
        rule = decision.rule
        if rule is None or (rule.after and verb != "watch"):
            response = await self._carry_out(request, verb, col, namespace, name, sub)
            if rule is None:
                return response
        assert rule.status is not None
        # details as kube-apiserver gives them (a 403's: the object's name, group, kind)
        details: dict[str, Any] = (col.kind.details(name) if name else
                                   {k: v for k, v in col.kind.details("").items() if k != "name"})
        if rule.status == 429:
            details["retryAfterSeconds"] = rule.retry_after
        failure = _error(rule.status, reason_for(rule.status), rule.message, details)
        if rule.status == 429:
            failure.headers["Retry-After"] = str(rule.retry_after)
        return failure

    async def _carry_out(
        self,
        request: web.Request,
        verb: str,
        col: Collection,
        namespace: str | None,
        name: str | None,
        sub: str | None,
    ) -> web.StreamResponse:
        query = request.query
        ns = namespace or ""
        if verb == "watch":
            return await self._watch(request, col, namespace)
        if verb == "list":
            return self._list(col, namespace, query)
        if verb == "get":
            assert name is not None
            return _raw_response(self.store.get(col, ns, name).raw)
        if verb == "delete":
            assert name is not None
            options = await self._body(request, allow_empty=True)
            entry, gone = self.store.delete(col, ns, name, options or {})
            if col.kind.returns_deleted or not gone:
                return _raw_response(entry.raw)
            uid = str(entry.obj["metadata"].get("uid", ""))
            done = status_body(200, "", "", col.kind.details(name, uid=uid))
            del done["code"]  # as kube-apiserver writes it: a zero code, left out
            return _json_response(done)
        body = await self._body(
            request, content_type=request.content_type if verb == "patch" else None
        )
        if verb == "create":
            if sub == "binding":
                assert name is not None
                self.store.bind(ns, name, body)
                return _json_response(status_body(201, "", ""), 201)
            return _raw_response(self.store.create(col, namespace, body).raw, 201)
        assert name is not None
        if verb == "update":
            return _raw_response(self.store.update(col, ns, name, body, sub).raw)
        entry, created = self.store.patch(
            col,
            ns,
            name,
            request.content_type,
            body,
            subresource=sub,
            field_manager=query.get("fieldManager"),
        )
        return _raw_response(entry.raw, 201 if created else 200)

    async def _body(
        self, request: web.Request, *, content_type: str | None = None, allow_empty: bool = False
    ) -> Any:
        raw = await request.read()
        if not raw:
            if allow_empty:
                return None
            raise StoreError(400, "BadRequest", "the request has no body")
        try:
            if content_type == patches.APPLY:
                return yaml.safe_load(raw)
            if content_type is not None and content_type not in patches.CONTENT_TYPES:
                raise StoreError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format: {content_type}; "
                    f"accepted: {', '.join(patches.CONTENT_TYPES)}",
                )
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise StoreError(400, "BadRequest", f"the request body is not valid: {exc}") from None

    def _list(
        self, col: Collection, namespace: str | None, query: Mapping[str, str]
    ) -> web.Response:
        list_options(query, watch=False, watch_list=self.watch_list)
        limit_param = query.get("limit")
        try:
            limit = int(limit_param) if limit_param else None
        except ValueError:
            raise StoreError(400, "BadRequest", f"invalid limit {limit_param!r}") from None
        rv, entries, token, remaining = self.store.list_page(
            col,
            namespace,
            query.get("labelSelector"),
            query.get("fieldSelector"),
            limit,
            query.get("continue"),
        )
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            meta["continue"] = token
            meta["remainingItemCount"] = remaining
        kind = col.kind
        head = json.dumps(
            {"kind": kind.kind + "List", "apiVersion": kind.api_version, "metadata": meta},
            separators=(",", ":"),
        ).encode()
        body = head[:-1] + b',"items":[' + b",".join(e.raw for e in entries) + b"]}"
        return _raw_response(body)

    async def _watch(
        self, request: web.Request, col: Collection, namespace: str | None
    ) -> web.StreamResponse:
        query: Mapping[str, str] = request.query
        rv_param = query.get("resourceVersion")
        try:
            since = None if rv_param in (None, "", "0") else int(rv_param)
            timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        except ValueError:
            raise StoreError(
                400, "BadRequest", "invalid resourceVersion or timeoutSeconds"
            ) from None
        watch_list = self.watch_list
        if self.ignore_send_initial_events:
            query = {
                k: v
                for k, v in query.items()
                if k not in ("sendInitialEvents", "resourceVersionMatch")
            }
            watch_list = False
        initial_events = list_options(query, watch=True, watch_list=watch_list)
        bookmarks = bool(_flag(query.get("allowWatchBookmarks")))
        watcher, ok = self.store.open_watch(
            col,
            namespace,
            query.get("labelSelector"),
            query.get("fieldSelector"),
            since,
            initial_events=initial_events,
        )
        if ok and initial_events and bookmarks:
            # A streaming list: the end of the initial events, at the resourceVersion
            # of the state they showed, goes out before any live event (nothing ran
            # since open_watch). Without allowWatchBookmarks kube-apiserver sends no
            # such bookmark (isListWatchRequest, endpoints/handlers/get.go).
            self.watch_lists[col.kind.name] += 1
            cut = self._take_cut(col.kind.name)
            if cut is not None:
                del watcher.lines[cut:]
                watcher.close()
            else:
                mark = {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": col.kind.kind,
                        "apiVersion": col.kind.api_version,
                        "metadata": {
                            "resourceVersion": str(self.store.rv),
                            "annotations": {INITIAL_EVENTS_END: "true"},
                        },
                    },
                }
                watcher.lines.append(json.dumps(mark, separators=(",", ":")).encode() + b"\n")
        response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
        await response.prepare(request)
        if not ok:
            error = status_body(
                410, "Expired", f"too old resource version: {since} ({col.compacted})"
            )
            line = json.dumps({"type": "ERROR", "object": error}).encode() + b"\n"
            await response.write(line)
            await response.write_eof()
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout or self.max_watch_seconds, self.max_watch_seconds)
        next_bookmark = loop.time() + self.bookmark_interval
        kind = col.kind
        try:
            while True:
                if watcher.lines:
                    chunk = b"".join(watcher.lines)
                    watcher.lines.clear()
                    await response.write(chunk)
                    continue
                if watcher.closed:
                    break
                now = loop.time()
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    mark = {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind.kind,
                            "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)},
                        },
                    }
                    next_bookmark = now + self.bookmark_interval
                    await response.write(json.dumps(mark).encode() + b"\n")
                    continue
                transport = request.transport
                if transport is None or transport.is_closing():
                    break  # the client went away; stop buffering events for it
                wake_at = min(deadline, next_bookmark) if bookmarks else deadline
                wake_at = min(wake_at, now + 1.0)
                watcher.wake.clear()
                try:
                    async with asyncio.timeout(max(wake_at - now, 0.0)):
                        await watcher.wake.wait()
                except TimeoutError:
                    pass
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            self.store.close_watch(watcher)
        return response

    # -- HTTP: control API ----------------------------------------------------------------

    async def _ctl_json(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("the control request body must be a JSON object")
        return data

    async def _ctl_add_fault(self, request: web.Request) -> web.Response:
        try:
            rule = self.faults.add(FaultRule.from_json(await self._ctl_json(request)))
        except (ValueError, TypeError) as exc:
            return _error(400, "BadRequest", str(exc))
        return _json_response({"id": len(self.faults.rules), "rule": repr(rule)})

    async def _ctl_clear_faults(self, _: web.Request) -> web.Response:
        self.faults.clear()
        return _json_response({})

    async def _ctl_drop_watches(self, request: web.Request) -> web.Response:
        data = await self._ctl_json(request)
        return _json_response({"dropped": self.drop_watches(data.get("resource"))})

    async def _ctl_compact(self, request: web.Request) -> web.Response:
        data = await self._ctl_json(request)
        return _json_response({"resourceVersion": self.compact(data.get("resource"))})

    async def _ctl_counts(self, _: web.Request) -> web.Response:
        return _json_response(
            {
                "counts": self.counts.as_json(),
                "peaks": self.peaks.as_json(),
                "watches": self.open_watches(),
                "watchLists": dict(sorted(self.watch_lists.items())),
            }
        )

    async def _ctl_reset_counts(self, _: web.Request) -> web.Response:
        self.counts.clear()
        self.peaks.clear()
        self.watch_lists.clear()
        return _json_response({})

    async def _ctl_watch_list(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            try:
                body = await self._ctl_json(request)
            except ValueError as exc:
                return _error(400, "BadRequest", str(exc))
            given = {k: body[k] for k in ("enabled", "ignored") if k in body}
            if not given or set(body) - set(given) or not all(
                isinstance(v, bool) for v in given.values()
            ):
                return _error(
                    400, "BadRequest", 'the body must be {"enabled": bool, "ignored": bool}'
                )
            self.watch_list = given.get("enabled", self.watch_list)
            self.ignore_send_initial_events = given.get(
                "ignored", self.ignore_send_initial_events
            )
        return _json_response(
            {"enabled": self.watch_list, "ignored": self.ignore_send_initial_events}
        )

    async def _ctl_cut_watch_lists(self, request: web.Request) -> web.Response:
        try:
            data = await self._ctl_json(request)
            self.cut_watch_lists(
                str(data["resource"]),
                after=int(data.get("after", 0)),
                times=int(data.get("times", 1)),
            )
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, "BadRequest", f"invalid cut-watch-lists request: {exc!r}")
        return _json_response({})

    def load(self, items: list[Any]) -> int:
        """Create each object of ``items`` (``apiVersion``/``kind`` pick the resource)."""
        by_kind = {(k.api_version, k.kind): k for k in KINDS}
        created = 0
        for item in items:
            kind = by_kind.get((item.get("apiVersion", "v1"), item.get("kind", "")))
            if kind is None:
                raise ValueError(
                    f"cannot load {item.get('apiVersion')}/{item.get('kind')}: not served"
                )
            col = self.store.collection(kind.group, kind.version, kind.plural)
            self.store.create(col, (item.get("metadata") or {}).get("namespace"), item,
                              validate=False)
            created += 1
        return created

    async def _ctl_objects(self, request: web.Request) -> web.Response:
        try:
            data = await self._ctl_json(request)
            created = self.load(list(data.get("items") or []))
        except (ValueError, TypeError, AttributeError) as exc:
            return _error(400, "BadRequest", str(exc))
        except StoreError as exc:
            return _error(exc.code, exc.reason, exc.message)
        return _json_response({"created": created})

    def state(self) -> list[Entry]:
        return [e for c in self.store.collections.values() for e in c.objects.values()]

    async def _ctl_state(self, _: web.Request) -> web.Response:
        return _raw_response(b'{"items":[' + b",".join(e.raw for e in self.state()) + b"]}")
