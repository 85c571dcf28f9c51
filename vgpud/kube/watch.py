"""Raw list and watch of one resource, as plain dicts.

``list_pages`` pages through a list (``limit``/``continue``) and yields each page
with the list's resourceVersion. ``open_watch`` streams ``WatchEvent`` values from
a resourceVersion with bookmarks; an ERROR event becomes the mapped exception
(``Gone`` for 410: the caller re-lists — unlike kubernetes_asyncio's ``Watch``,
which silently retries once with the same stale resourceVersion).

``open_watch_list`` opens a streaming list (KEP-3157 "WatchList"; beta and on by
default in kube-apiserver since 1.32): the same request client-go's reflector sends
(``watchList`` in tools/cache/reflector.go) —
``watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true``
with ``resourceVersion`` left out for "the most recent" (a consistent read). The
server first sends a synthetic ``ADDED`` for every object, then a ``BOOKMARK`` whose
``metadata.annotations["k8s.io/initial-events-end"]`` is ``"true"`` and whose
``metadata.resourceVersion`` is the resourceVersion of that state
(``WatchEvent.initial_events_end``), then ordinary watch events. No other bookmark
comes before that one on kube-apiserver (k8s.io/apiserver v0.37.2: the cacher drops
periodic bookmarks older than the list's resourceVersion and annotates the first
bookmark it sends such a watcher; see ``cache``). A plain watch gets a bookmark about
once a minute (``defaultBookmarkFrequency``) and 2 s before ``timeoutSeconds`` ends.

A server without the feature answers ``422 Invalid`` (``sendInitialEvents:
Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate
is enabled``); one older than 1.27 does not know ``sendInitialEvents`` but refuses
``resourceVersionMatch`` on a watch (``resourceVersionMatch: Forbidden:
resourceVersionMatch is forbidden for watch``, apimachinery 1.26
``ValidateListOptions``), a 422 as well. Only something that drops both parameters
(a proxy) turns the request into a plain watch from ``""``, and only in front of a
server with the feature off: one with it on (1.34+ by default) defaults such a watch
back into a streaming list (``SetListOptionsDefaults``).

Objects stay JSON dicts: parsing 50,000 pods into generated models would cost
seconds; callers project what they need (see ``cache.Informer``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from vgpud.kube.client import Json, KubeClient
from vgpud.kube.errors import ConnectionFailed, error_for_status
from vgpud.kube.resources import Resource


@dataclass(frozen=True, slots=True)
class Selector:
    """Which objects of a resource: a namespace (None: all) and selectors."""

    namespace: str | None = None
    labels: str | None = None
    fields: str | None = None

    def query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.labels:
            out["labelSelector"] = self.labels
        if self.fields:
            out["fieldSelector"] = self.fields
        return out


EVERYTHING = Selector()


# metav1.InitialEventsAnnotationKey: marks the bookmark that ends a streaming list's
# synthetic ADDED events (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: Json

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion", ""))

    @property
    def initial_events_end(self) -> bool:
        """The bookmark that ends a streaming list's initial events."""
        if self.type != "BOOKMARK":
            return False
        annotations = (self.object.get("metadata") or {}).get("annotations") or {}
        return isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true"


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Json]
    resource_version: str


async def list_pages(
    kube: KubeClient, resource: Resource, selector: Selector = EVERYTHING, *, page_size: int = 500
) -> AsyncIterator[Page]:
    """Yield the pages of a consistent list (each carries the list's resourceVersion)."""
    path = resource.collection_path(selector.namespace)
    token = ""
    while True:
        query = selector.query()
        if page_size:
            query["limit"] = str(page_size)
        if token:
            query["continue"] = token
        body = await kube.request("GET", path, query=query)
        meta = body.get("metadata") or {}
        items = body.get("items") or []
        yield Page(items, str(meta.get("resourceVersion", "")))
        token = str(meta.get("continue") or "")
        if not token:
            return


def _decode(line: bytes) -> WatchEvent:
    try:
        data: Any = json.loads(line)
    except ValueError as exc:
        raise ConnectionFailed(f"malformed watch event: {line[:200]!r}") from exc
    if not isinstance(data, dict) or "type" not in data or not isinstance(data.get("object"), dict):
        raise ConnectionFailed(f"malformed watch event: {line[:200]!r}")
    if data["type"] == "ERROR":
        status = data["object"]
        raise error_for_status(int(status.get("code") or 500), status)
    return WatchEvent(str(data["type"]), data["object"])


def open_watch(
    kube: KubeClient,
    resource: Resource,
    resource_version: str,
    selector: Selector = EVERYTHING,
    *,
    timeout_seconds: int = 300,
    bookmarks: bool = True,
) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
    """Open a watch from ``resource_version``; yields an iterator of events.

    The iterator ends when the server closes the stream (``timeoutSeconds``, a
    server restart); raises ``Gone`` when the resourceVersion is too old.
    """
    query = selector.query()
    query["resourceVersion"] = resource_version
    if bookmarks:
        query["allowWatchBookmarks"] = "true"
    return _stream(kube, resource, selector, query, timeout_seconds)


def open_watch_list(
    kube: KubeClient,
    resource: Resource,
    selector: Selector = EVERYTHING,
    *,
    resource_version: str = "",
    timeout_seconds: int = 300,
) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
    """Open a streaming list (see the module docstring); yields an iterator of events.

    ``resource_version`` empty: the state is at least as new as the request (a
    consistent read, as client-go asks for it); otherwise at least as new as that
    resourceVersion. A refusing server raises the mapped error (``Invalid``,
    ``Forbidden``, ...) before anything is yielded.
    """
    query = selector.query()
    query["sendInitialEvents"] = "true"
    query["resourceVersionMatch"] = "NotOlderThan"
    query["allowWatchBookmarks"] = "true"
    if resource_version:
        query["resourceVersion"] = resource_version
    return _stream(kube, resource, selector, query, timeout_seconds)


@asynccontextmanager
async def _stream(kube: KubeClient, resource: Resource, selector: Selector,
                  query: dict[str, str], timeout_seconds: int,
                  ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    """One watch request (``query`` plus ``watch`` and ``timeoutSeconds``)."""
    query["watch"] = "true"
    query["timeoutSeconds"] = str(timeout_seconds)
    async with kube.watch_lines(
        resource.collection_path(selector.namespace),
        query=query,
        max_seconds=timeout_seconds + 30.0,
    ) as lines:
        yield _events(lines)


async def _events(lines: AsyncIterator[bytes]) -> AsyncIterator[WatchEvent]:
    async for line in lines:
        yield _decode(line)
