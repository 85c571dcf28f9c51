"""A list+watch informer: a local cache of one resource and a stream of changes.

``Informer`` lists the resource (paged), then watches from the list's
resourceVersion with bookmarks. When the watch ends it reconnects from the last
resourceVersion it saw; on ``410 Gone`` it re-lists and diffs the new list against
its cache, so objects that vanished while it was not watching are reported as
``Deleted(final_state_unknown=True)``. Connection and server errors back off
(capped, exponential, on the injected clock) and retry forever.

The cache maps ``namespace/name`` (or ``name``) to ``project(raw_object)``: pass a
``project`` that keeps only what you need to hold 50,000 pods in a few tens of MiB;
without one the raw dicts are kept.

Subscribers get, in order: ``Added``/``Modified``/``Deleted`` per change, and
``Synced`` after every (re)list. Synchronous callbacks (``subscribe``) run inline
after the cache is updated — an exception from one stops the informer (it is a
bug); memory streams (``open_stream``) apply backpressure.

Run it in the caller's task group; readiness is the first completed list::

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
from vgpud.kube.errors import Gone, KubeError
from vgpud.kube.resources import Resource, object_key
from vgpud.kube.watch import EVERYTHING, Selector, list_pages, open_watch

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
    lists: int  # 1 after the initial list, 2 after the first re-list, ...


Event = Added[T] | Modified[T] | Deleted[T] | Synced


def _keep(obj: Json) -> Any:
    return obj


class Informer(Generic[T]):
    """Cache and change feed of one resource (see the module docstring)."""

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
        self._cache: dict[str, tuple[str, T]] = {}
        self._callbacks: list[Callable[[Event[T]], None]] = []
        self._streams: list[MemoryObjectSendStream[Event[T]]] = []
        self._synced = anyio.Event()
        self.resource_version = ""
        self.lists = 0
        self.watches = 0

    # -- reading the cache --------------------------------------------------------------

    def get(self, key: str) -> T | None:
        entry = self._cache.get(key)
        return None if entry is None else entry[1]

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def keys(self) -> KeysView[str]:
        return self._cache.keys()

    def items(self) -> Iterator[tuple[str, T]]:
        return ((key, entry[1]) for key, entry in self._cache.items())

    def snapshot(self) -> dict[str, T]:
        """A shallow copy of the cache (the projected values are shared)."""
        return {key: entry[1] for key, entry in self._cache.items()}

    def _raw_items(self) -> ItemsView[str, tuple[str, T]]:
        return self._cache.items()

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
        """List, then watch forever; ``task_status.started()`` after the first list."""
        started = False
        need_list = True
        try:
            while True:
                if need_list:
                    try:
                        await self._relist()
                    except KubeError as exc:
                        delay = await self._back_off(exc)
                        log.warning(
                            "informer_list_failed",
                            informer=self.name,
                            error=str(exc),
                            retry_in=round(delay, 3),
                        )
                        continue
                    need_list = False
                    self.backoff.reset()
                    if not started:
                        started = True
                        task_status.started()
                try:
                    await self._watch()
                except Gone:
                    log.info(
                        "informer_watch_expired",
                        informer=self.name,
                        resource_version=self.resource_version,
                    )
                    need_list = True
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

    async def _relist(self) -> None:
        fresh: dict[str, tuple[str, T]] = {}
        resource_version = ""
        async for page in list_pages(
            self.kube, self.resource, self.selector, page_size=self.page_size
        ):
            resource_version = page.resource_version
            for obj in page.items:
                meta = obj.get("metadata") or {}
                fresh[object_key(obj)] = (str(meta.get("resourceVersion", "")), self.project(obj))
        old, self._cache = self._cache, fresh
        self.resource_version = resource_version
        self.lists += 1
        log.debug(
            "informer_listed",
            informer=self.name,
            size=len(fresh),
            resource_version=resource_version,
            lists=self.lists,
        )
        for key, (rv, value) in fresh.items():
            previous = old.get(key)
            if previous is None:
                await self._emit(Added(key, value))
            elif previous[0] != rv:
                await self._emit(Modified(key, previous[1], value))
        for key in old.keys() - fresh.keys():
            await self._emit(Deleted(key, old[key][1], final_state_unknown=True))
        self._synced.set()
        await self._emit(Synced(resource_version, len(fresh), self.lists))

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
                rv = event.resource_version
                if event.type == "BOOKMARK":
                    self.resource_version = rv or self.resource_version
                    continue
                await self._apply(event.type, event.object, rv)
                self.resource_version = rv or self.resource_version
        if received == 0 and self.clock.now() - opened < 1.0:
            await self.backoff.sleep()  # a server that closes at once must not make us spin
        else:
            self.backoff.reset()

    async def _apply(self, type_: str, obj: Json, rv: str) -> None:
        key = object_key(obj)
        previous = self._cache.get(key)
        if type_ in ("ADDED", "MODIFIED"):
            if previous is not None and previous[0] == rv:
                return  # a replay of what we already have
            value = self.project(obj)
            self._cache[key] = (rv, value)
            if previous is None:
                await self._emit(Added(key, value))
            else:
                await self._emit(Modified(key, previous[1], value))
        elif type_ == "DELETED":
            if previous is None:
                return
            del self._cache[key]
            await self._emit(Deleted(key, self.project(obj)))
