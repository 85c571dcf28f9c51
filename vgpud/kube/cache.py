"""A list+watch informer: a local cache of one resource and a stream of changes.

``Informer`` fills its cache with a streaming list (KEP-3157 "WatchList", see
``watch.open_watch_list``): one watch request on which the server sends a synthetic
``ADDED`` per object, then a bookmark annotated ``k8s.io/initial-events-end`` that
carries the list's resourceVersion, then ordinary events on the same stream — the
objects are projected as they arrive into a temporary map, which replaces the cache
at that bookmark, so no whole list response is ever held. Objects from an unfinished
stream are dropped: nothing is emitted and no ``Synced`` is reported before the cache
is complete. ``streaming=False`` always lists.

It falls back to a paged list (``limit``/``continue``) and a watch from the list's
resourceVersion, and sticks to that for ``streaming_retry_after`` seconds (later
re-syncs try streaming again), when:

- the server **refuses** the streaming list: an error status (422 from a server
  without the WatchList feature — kube-apiserver 1.27-1.31 and 1.33 by default — and
  from one older than 1.27, which forbids ``resourceVersionMatch`` on a watch; 403,
  410, 5xx, ...). A throttled (429) or unreachable server is retried after a backoff
  instead, as a list would be;
- the stream ends or breaks before the end bookmark;
- the server **ignores** the request and serves a plain watch (a proxy that drops
  ``sendInitialEvents``/``resourceVersionMatch``, in front of a server without the
  feature): a ``BOOKMARK`` *without* the annotation arrives before the end bookmark.
  The informer falls back at that bookmark, not when the watch times out, and records
  it on the client (``KubeClient.watch_list_ignored_until``), so every other informer
  sharing the client lists at once rather than wait for a bookmark of its own. A stream
  that ran (nearly) to its ``timeoutSeconds`` without the end bookmark tells the same,
  for a resource so quiet that no plain bookmark came (see below);
- the server's version (``KubeClient.server_version``, asked once per client) is older
  than 1.27, which has no streaming lists: it is not asked at all.

Why a plain bookmark is a sure sign (k8s.io/apiserver v0.37.2,
pkg/storage/cacher): a streaming-list watcher is registered with a
``bookmarkAfterResourceVersion`` (``getBookmarkAfterResourceVersionLockedFunc``);
``nonblockingAdd`` drops every periodic bookmark older than it, ``processInterval``
sends the initial events and then the interval's ``initialEventsEndBookmark`` before
it reads any queued event, and ``convertToWatchEvent`` annotates the first bookmark a
watcher sends while ``wasBookmarkAfterRvSent`` is false. So the first bookmark of a
real streaming list is always the annotated one; the uncached path (storage/etcd3
``startWatching``) queues its end bookmark right after the initial events, and API
clients cannot ask etcd for other progress notifications. A plain watch (a watcher
with no such resourceVersion) is due a bookmark ``defaultBookmarkFrequency`` (1 minute)
after it starts, every minute after, and 2 s before its deadline (``nextBookmarkTime``),
but ``process`` sends one only once the resource's watch cache has moved past the
watch's starting resourceVersion (an event of that resource, or etcd's progress
notification): on a live resource (nodes that kubelets update, pods) an ignoring server
is found out a minute after the request, on a quiet one when the stream times out
(kube-apiserver 1.37.2 with WatchList off, behind such a proxy: ready 61 s after the
start with the node's status reported every 5 s, 121 s in a run where nothing moved;
tests/realkube/test_informers.py) — and a second informer on the same client at once. Note also that
kube-apiserver 1.34+ (WatchList on) defaults a legacy watch from ``""`` with no
``sendInitialEvents``/``resourceVersionMatch`` to a streaming list
(``SetListOptionsDefaults``): a proxy that drops the parameters is harmless in front
of it, and only matters in front of a server with the feature off.

When a watch ends it reconnects from the last resourceVersion it saw (bookmarks
included); on ``410 Gone`` it re-syncs (streaming or list, as above) and diffs the
new state against its cache, so objects that vanished while it was not watching are
reported as ``Deleted(final_state_unknown=True)``. Connection and server errors back
off (capped, exponential, on the injected clock) and retry forever.

The cache maps ``namespace/name`` (or ``name``) to ``project(raw_object)``: pass a
``project`` that keeps only what you need to hold 50,000 pods in a few tens of MiB;
without one the raw dicts are kept. A change is what changes the projection: an event
whose projection equals the cached one (a node's status heartbeat, to a projection
without status; a replayed event) updates nothing and emits nothing, and a re-sync
reports ``Modified`` only for objects whose projection differs. So the cache holds
the projections alone, not their resourceVersions beside them.

Subscribers get, in order: ``Added``/``Modified``/``Deleted`` per change, and
``Synced`` after every (re)sync, whichever way it was made. Synchronous callbacks
(``subscribe``) run inline after the cache is updated — an exception from one stops
the informer (it is a bug); memory streams (``open_stream``) apply backpressure.

Run it in the caller's task group; readiness is the first completed sync::

    informer = Informer(kube, PODS, project=pod_summary)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)      # returns once the cache is synced
        ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, ItemsView, Iterator, KeysView
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar, cast

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from vgpud.kube.backoff import Backoff
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import ConnectionFailed, Gone, KubeError, TooManyRequests
from vgpud.kube.resources import Resource, object_key
from vgpud.kube.watch import (
    EVERYTHING,
    Selector,
    WatchEvent,
    list_pages,
    open_watch,
    open_watch_list,
)

T = TypeVar("T")
log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Added(Generic[T]):
    key: str
    obj: T


@dataclass(frozen=True, slots=True)
class Modified(Generic[T]):
    key: str
    old: T
    new: T


@dataclass(frozen=True, slots=True)
class Deleted(Generic[T]):
    """``obj`` is the final state, or the last known one when ``final_state_unknown``
    (the object vanished while the informer was not watching)."""

    key: str
    obj: T
    final_state_unknown: bool = False


@dataclass(frozen=True, slots=True)
class Synced:
    """The cache now mirrors the server as of ``resource_version``."""

    resource_version: str
    size: int
    lists: int  # 1 after the initial sync, 2 after the first re-sync, ...


Event = Added[T] | Modified[T] | Deleted[T] | Synced


def _keep(obj: Json) -> Any:
    return obj


STREAMING = "watch-list"
LISTING = "list"
# kube-apiserver serves streaming lists from 1.27 (alpha; beta and on in 1.32, off in
# 1.33, on again from 1.34): an older one is not asked.
WATCH_LIST_SINCE = (1, 27)
# A streaming list that lasted this share of its timeoutSeconds without the end bookmark
# was a plain watch: a real one sends that bookmark right after the initial events.
RAN_ITS_COURSE = 0.9


class _SyncFailed(Exception):
    """A (re)sync failed before the cache was replaced: back off and sync again."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(str(error))
        self.error = error


class Informer(Generic[T]):
    """Cache and change feed of one resource (see the module docstring)."""

    # After a refused or broken streaming list, sync by listing for this long.
    streaming_retry_after: float = 600.0

    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        *,
        selector: Selector = EVERYTHING,
        project: Callable[[Json], T] | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        clock: Clock = SYSTEM_CLOCK,
        name: str | None = None,
        streaming: bool = True,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.selector = selector
        self.project: Callable[[Json], T] = project or cast(Callable[[Json], T], _keep)
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.clock = clock
        self.backoff = backoff or Backoff(clock=clock)
        self.name = name or resource.plural
        self._cache: dict[str, T] = {}
        self._callbacks: list[Callable[[Event[T]], None]] = []
        self._streams: list[MemoryObjectSendStream[Event[T]]] = []
        self._synced = anyio.Event()
        self.resource_version = ""
        self.lists = 0  # completed syncs, either way
        self.watches = 0  # watch requests, streaming lists included
        self.streaming = streaming
        self.sync_mode = ""  # how the last sync was made: STREAMING or LISTING
        self._list_until: float | None = None  # no streaming list before this time

    # -- reading the cache --------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self._cache.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def keys(self) -> KeysView[str]:
        return self._cache.keys()

    def items(self) -> ItemsView[str, T]:
        return self._cache.items()

    def snapshot(self) -> dict[str, T]:
        """A shallow copy of the cache (the projected values are shared)."""
        return dict(self._cache)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # -- subscribing -------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Event[T]], None]) -> Callable[[], None]:
        """Call ``callback`` for every event from now on; returns an unsubscribe."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def open_stream(self, max_buffer_size: float = math.inf) -> MemoryObjectReceiveStream[Event[T]]:
        """A memory stream of every event from now on; close it to unsubscribe."""
        send, receive = anyio.create_memory_object_stream[Event[T]](max_buffer_size)
        self._streams.append(send)
        return receive

    async def _emit(self, event: Event[T]) -> None:
        for callback in self._callbacks:
            callback(event)
        for stream in list(self._streams):
            try:
                await stream.send(event)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._streams.remove(stream)

    # -- running -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> NoReturn:
        """Sync, then watch forever; ``task_status.started()`` after the first sync."""
        started = False
        need_sync = True

        def synced() -> None:
            nonlocal started, need_sync
            need_sync = False
            self.backoff.reset()
            if not started:
                started = True
                task_status.started()

        try:
            while True:
                try:
                    if need_sync:
                        await self._sync(synced)
                    else:
                        await self._watch()
                except _SyncFailed as failure:
                    delay = await self._back_off(failure.error)
                    log.warning(
                        "informer_list_failed",
                        informer=self.name,
                        error=str(failure.error),
                        retry_in=round(delay, 3),
                    )
                except Gone:
                    log.info(
                        "informer_watch_expired",
                        informer=self.name,
                        resource_version=self.resource_version,
                    )
                    need_sync = True
                except KubeError as exc:
                    delay = await self._back_off(exc)
                    log.warning(
                        "informer_watch_failed",
                        informer=self.name,
                        error=str(exc),
                        retry_in=round(delay, 3),
                    )
        finally:
            for stream in self._streams:
                stream.close()

    async def _back_off(self, exc: KubeError) -> float:
        retry_after = getattr(exc, "retry_after", None) or 0.0
        return await self.backoff.sleep(at_least=retry_after)

    # -- syncing -------------------------------------------------------------------------

    async def _streaming_allowed(self) -> bool:
        if not self.streaming:
            return False
        now = self.clock.now()
        if self._list_until is not None and now < self._list_until:
            return False
        self._list_until = None
        ignored_until = self.kube.watch_list_ignored_until
        if ignored_until is not None and now < ignored_until:
            return False  # another informer on this client found the server ignores it
        version = await self.kube.server_version()
        if version is not None and not version.at_least(*WATCH_LIST_SINCE):
            self._stop_streaming(
                f"kube-apiserver {version} has no streaming lists (1.27+)", refused=True
            )
            return False
        return True

    async def _sync(self, synced: Callable[[], None]) -> None:
        """Fill the cache, streaming if allowed (then follow that same stream until it
        ends), else or on the server's refusal by a paged list; ``synced()`` once the
        cache is replaced. Raises ``_SyncFailed`` when the cache was not replaced."""
        if await self._streaming_allowed() and await self._stream(synced):
            return
        try:
            await self._relist()
        except KubeError as exc:
            raise _SyncFailed(exc) from exc
        synced()

    def _stop_streaming(self, why: str, *, refused: bool) -> None:
        self._list_until = self.clock.now() + self.streaming_retry_after
        # A refusal is what every server without the feature answers (kube-apiserver
        # 1.27-1.31 and 1.33 by default): not worth a warning, as in client-go.
        (log.info if refused else log.warning)(
            "informer_watch_list_unavailable",
            informer=self.name,
            error=why,
            fallback=LISTING,
            list_for=self.streaming_retry_after,
        )

    async def _stream(self, synced: Callable[[], None]) -> bool:
        """A streaming list, then the watch on the same stream until it ends.

        Returns False, having replaced nothing, when the server refused the request,
        answered it with a plain watch (a bookmark before the initial-events-end one), or
        the stream ended (or broke) before that bookmark: the caller lists instead.
        Raises ``_SyncFailed`` for a throttled or unreachable server (try again after a
        backoff); once synced, the watch's errors as ``_watch``.
        """
        fresh: dict[str, T] = {}
        opened = is_synced = False
        ignored = ""  # why the server is known to have served a plain watch
        received = 0
        started = self.clock.now()
        self.watches += 1
        try:
            async with open_watch_list(
                self.kube, self.resource, self.selector, timeout_seconds=self.watch_timeout
            ) as events:
                opened = True
                async for event in events:
                    received += 1
                    if received % 8 == 0:
                        await anyio.lowlevel.checkpoint()  # as in _watch
                    if is_synced:
                        await self._follow(event)
                    elif event.initial_events_end:
                        rv = event.resource_version or self.resource_version
                        await self._replace(fresh, rv, STREAMING)
                        fresh = {}
                        is_synced = True
                        synced()
                    elif event.type == "BOOKMARK":
                        # A real streaming list's first bookmark is the end one (see the
                        # module docstring): this is a plain watch.
                        ignored = (f"a bookmark without the initial-events-end mark came "
                                   f"after {received - 1} events")
                        break
                    elif event.type == "DELETED":
                        fresh.pop(object_key(event.object), None)
                    else:  # ADDED (MODIFIED only from a server that interleaves changes)
                        fresh[object_key(event.object)] = self.project(event.object)
        except KubeError as exc:
            if is_synced:
                raise
            if not opened and isinstance(exc, TooManyRequests | ConnectionFailed):
                raise _SyncFailed(exc) from exc
            self._stop_streaming(str(exc), refused=not opened)
            return False
        ran = self.clock.now() - started
        if not is_synced and not ignored and ran >= RAN_ITS_COURSE * self.watch_timeout:
            ignored = f"the stream ran its {ran:.0f} s without the initial-events-end mark"
        if ignored:
            self._stop_streaming(
                f"the server ignored sendInitialEvents (a plain watch): {ignored}",
                refused=False,
            )
            self.kube.watch_list_ignored_until = max(
                self._list_until or -math.inf, self.kube.watch_list_ignored_until or -math.inf
            )
            return False
        if not is_synced:
            self._stop_streaming(
                f"the stream ended after {received} events, before the initial-events-end bookmark",
                refused=False,
            )
            return False
        self.backoff.reset()
        return True

    async def _relist(self) -> None:
        fresh: dict[str, T] = {}
        resource_version = ""
        async for page in list_pages(
            self.kube, self.resource, self.selector, page_size=self.page_size
        ):
            resource_version = page.resource_version
            for obj in page.items:
                fresh[object_key(obj)] = self.project(obj)
        await self._replace(fresh, resource_version, LISTING)

    async def _replace(
        self, fresh: dict[str, T], resource_version: str, mode: str
    ) -> None:
        """Make ``fresh`` the cache; emit the differences, then ``Synced``."""
        old, self._cache = self._cache, fresh
        self.resource_version = resource_version
        self.lists += 1
        self.sync_mode = mode
        log.info(
            "informer_synced",
            informer=self.name,
            mode=mode,
            size=len(fresh),
            resource_version=resource_version,
            lists=self.lists,
        )
        for key, value in fresh.items():
            previous = old.get(key)
            if previous is None:
                await self._emit(Added(key, value))
            elif previous != value:
                await self._emit(Modified(key, previous, value))
        for key in old.keys() - fresh.keys():
            await self._emit(Deleted(key, old[key], final_state_unknown=True))
        self._synced.set()
        await self._emit(Synced(resource_version, len(fresh), self.lists))

    # -- watching ------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Watch until the server ends the stream; backs off if it ended at once."""
        opened = self.clock.now()
        received = 0
        self.watches += 1
        async with open_watch(
            self.kube,
            self.resource,
            self.resource_version,
            self.selector,
            timeout_seconds=self.watch_timeout,
        ) as events:
            async for event in events:
                received += 1
                if received % 8 == 0:
                    # Buffered lines are read without a task switch; a burst of events
                    # must not hold the loop (the extender's latency) for its whole length.
                    await anyio.lowlevel.checkpoint()
                await self._follow(event)
        if received == 0 and self.clock.now() - opened < 1.0:
            await self.backoff.sleep()  # a server that closes at once must not make us spin
        else:
            self.backoff.reset()

    async def _follow(self, event: WatchEvent) -> None:
        rv = event.resource_version
        if event.type != "BOOKMARK":
            await self._apply(event.type, event.object)
        self.resource_version = rv or self.resource_version

    async def _apply(self, type_: str, obj: Json) -> None:
        key = object_key(obj)
        previous = self._cache.get(key)
        if type_ in ("ADDED", "MODIFIED"):
            value = self.project(obj)
            if previous is not None and previous == value:
                return  # nothing we keep changed (or a replay of what we have)
            self._cache[key] = value
            if previous is None:
                await self._emit(Added(key, value))
            else:
                await self._emit(Modified(key, previous, value))
        elif type_ == "DELETED":
            if previous is None:
                return
            del self._cache[key]
            await self._emit(Deleted(key, self.project(obj)))
