"""Raw list and watch of one resource, as plain dicts.

``list_pages`` pages through a list (``limit``/``continue``) and yields each page
with the list's resourceVersion. ``open_watch`` streams ``WatchEvent`` values from
a resourceVersion with bookmarks; an ERROR event becomes the mapped exception
(``Gone`` for 410: the caller re-lists — unlike kubernetes_asyncio's ``Watch``,
which silently retries once with the same stale resourceVersion).

Objects stay JSON dicts: parsing 50,000 pods into generated models would cost
seconds; callers project what they need (see ``cache.Informer``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: Json

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion", ""))


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


@asynccontextmanager
async def open_watch(
    kube: KubeClient,
    resource: Resource,
    resource_version: str,
    selector: Selector = EVERYTHING,
    *,
    timeout_seconds: int = 300,
    bookmarks: bool = True,
) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    """Open a watch from ``resource_version``; yields an iterator of events.

    The iterator ends when the server closes the stream (``timeoutSeconds``, a
    server restart); raises ``Gone`` when the resourceVersion is too old.
    """
    query = selector.query()
    query["watch"] = "true"
    query["resourceVersion"] = resource_version
    query["timeoutSeconds"] = str(timeout_seconds)
    if bookmarks:
        query["allowWatchBookmarks"] = "true"
    async with kube.watch_lines(
        resource.collection_path(selector.namespace),
        query=query,
        max_seconds=timeout_seconds + 30.0,
    ) as lines:
        yield _events(lines)


async def _events(lines: AsyncIterator[bytes]) -> AsyncIterator[WatchEvent]:
    async for line in lines:
        yield _decode(line)
