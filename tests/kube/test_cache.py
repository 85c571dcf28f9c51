"""Informer with streaming lists (WatchList), and its fallback to list + watch."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import anyio
import pytest

from tests.kube.informers import fast_backoff, node_of, pod, recording
from tests.kube.waiting import eventually
from tests.standin import ApiServer
from vgpud.kube.cache import LISTING, STREAMING, Added, Deleted, Event, Informer, Modified, Synced
from vgpud.kube.client import Json, KubeClient, ServerVersion
from vgpud.kube.resources import NODES, PODS

pytestmark = pytest.mark.anyio


class _ShiftedClock:
    """The system clock, plus seconds a test adds: only what reads ``now()`` jumps."""

    def __init__(self) -> None:
        self.shift = 0.0

    def now(self) -> float:
        return time.monotonic() + self.shift

    def wall(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.1, watch_list=True) as server:
        yield server


def _expire(api: ApiServer, resource: str) -> None:
    """End the open watches and forget the history, so the next watch gets 410."""
    api.drop_watches(resource)
    api.compact(resource)


async def test_streaming_list_syncs_without_listing_and_keeps_the_stream(
    api: ApiServer, kube: KubeClient
) -> None:
    api.create("pods", pod("b", node="n1"))
    api.create("pods", pod("a"))
    api.create("pods", pod("c", namespace="other"))
    projected: list[str] = []

    def project(pod: Json) -> str:
        projected.append(pod["metadata"]["name"])
        return node_of(pod)

    informer: Informer[str] = Informer(kube, PODS, project=project)
    events: list[Event[str]] = []
    projected_at_sync: list[int] = []

    def record(event: Event[str]) -> None:
        events.append(event)
        if isinstance(event, Synced):
            projected_at_sync.append(len(projected))

    informer.subscribe(record)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert informer.snapshot() == {"default/a": "", "default/b": "n1", "other/c": ""}
        assert informer.sync_mode == STREAMING and informer.lists == 1
        assert api.count("list", "pods") == 0
        assert api.count_watch_lists("pods") == 1 and api.count("watch", "pods") == 1
        assert informer.resource_version == str(api.store.rv)
        # Every object was projected as it arrived, before the cache was replaced.
        assert sorted(events[:3], key=repr) == sorted(
            [Added("default/a", ""), Added("default/b", "n1"), Added("other/c", "")], key=repr
        )
        assert events[3:] == [Synced(informer.resource_version, 3, 1)]
        assert projected_at_sync == [3] and sorted(projected) == ["a", "b", "c"]
        # After the bookmark the same stream carries the live events.
        api.patch("pods", "a", {"spec": {"nodeName": "n2"}})
        api.create("pods", pod("d"))
        api.delete("pods", "b")
        await eventually(lambda: len(events) == 7, what="three live events")
        assert api.count("watch", "pods") == 1 and informer.watches == 1
        tg.cancel_scope.cancel()
    assert events[4:] == [
        Modified("default/a", "", "n2"),
        Added("default/d", ""),
        Deleted("default/b", "n1"),
    ]
    assert informer.snapshot() == {"default/a": "n2", "other/c": "", "default/d": ""}
    assert api.count("list", "pods") == 0


async def test_gone_resyncs_by_streaming_and_reports_what_vanished(
    api: ApiServer, kube: KubeClient
) -> None:
    for name in ("a", "b", "c"):
        api.create("pods", pod(name))
    informer, events = recording(kube)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        del events[:]
        await eventually(lambda: api.open_watches("pods") == 1, what="the stream")
        # In one step (no await): end the stream, change things, forget the history.
        api.drop_watches("pods")
        api.delete("pods", "a")
        api.patch("pods", "b", {"spec": {"nodeName": "n9"}})
        api.create("pods", pod("d"))
        api.compact("pods")
        await eventually(lambda: any(isinstance(e, Synced) for e in events), what="re-sync")
        tg.cancel_scope.cancel()
    assert sorted(events[:-1], key=repr) == sorted(
        [
            Added("default/d", ""),
            Modified("default/b", "", "n9"),
            Deleted("default/a", "", final_state_unknown=True),
        ],
        key=repr,
    )
    assert events[-1] == Synced(informer.resource_version, 3, 2)
    assert informer.snapshot() == {"default/b": "n9", "default/c": "", "default/d": ""}
    assert informer.sync_mode == STREAMING and api.count_watch_lists("pods") == 2
    assert api.count("list", "pods") == 0


@pytest.mark.parametrize("refusal", ["feature off (422)", "forbidden (403)"])
async def test_a_refused_streaming_list_falls_back_to_list_and_watch(
    api: ApiServer, kube: KubeClient, refusal: str
) -> None:
    if refusal.endswith("(422)"):
        api.watch_list = False  # what a server without the WatchList feature answers
    else:
        api.fail("watch", "pods", 403, times=1, message="watch with sendInitialEvents denied")
    api.create("pods", pod("a"))
    api.create("pods", pod("b", node="n1"))
    clock = _ShiftedClock()
    informer: Informer[str] = Informer(
        kube, PODS, project=node_of, backoff=fast_backoff(), clock=clock
    )
    events: list[Event[str]] = []
    informer.subscribe(events.append)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert informer.snapshot() == {"default/a": "", "default/b": "n1"}
        assert informer.sync_mode == LISTING and api.count("list", "pods") == 1
        assert api.count_watch_lists("pods") == 0
        assert [type(e).__name__ for e in events] == ["Added", "Added", "Synced"]
        assert events[-1] == Synced(informer.resource_version, 2, 1)
        api.create("pods", pod("c"))  # arrives on the plain watch from the list's RV
        await eventually(lambda: "default/c" in informer, what="a live event")
        assert api.count("watch", "pods") == 2  # the refused request, then the watch

        # A re-sync soon after still lists, even where streaming would now work...
        api.watch_list = True
        _expire(api, "pods")
        await eventually(lambda: informer.lists == 2, what="the re-sync after 410")
        assert informer.sync_mode == LISTING and api.count("list", "pods") == 2
        assert api.count_watch_lists("pods") == 0
        # ... and a later one tries streaming again.
        clock.shift += informer.streaming_retry_after + 1.0
        await eventually(lambda: api.open_watches("pods") == 1, what="the watch")
        _expire(api, "pods")
        await eventually(lambda: informer.lists == 3, what="the second re-sync")
        assert informer.sync_mode == STREAMING and api.count_watch_lists("pods") == 1
        assert api.count("list", "pods") == 2
        tg.cancel_scope.cancel()
    assert sum(isinstance(e, Synced) for e in events) == 3
    assert informer.snapshot() == {"default/a": "", "default/b": "n1", "default/c": ""}


async def test_a_stream_ending_before_the_bookmark_falls_back_without_a_partial_sync(
    api: ApiServer, kube: KubeClient
) -> None:
    for name in ("a", "b", "c", "d"):
        api.create("pods", pod(name))
    api.cut_watch_lists("pods", after=2)  # two ADDEDs, then the stream ends
    informer: Informer[str] = Informer(kube, PODS, project=node_of, backoff=fast_backoff())
    events: list[tuple[Event[str], int, bool]] = []
    informer.subscribe(lambda e: events.append((e, api.count("list", "pods"), len(informer))))
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert informer.sync_mode == LISTING and informer.lists == 1
        assert api.count_watch_lists("pods") == 1 and api.count("list", "pods") == 1
        tg.cancel_scope.cancel()
    # Nothing was emitted (nor cached) from the cut stream: every event comes after the
    # list, with the whole cache behind it, and Synced once.
    assert [lists for _, lists, _ in events] == [1] * 5
    assert [size for _, _, size in events] == [4] * 5
    assert {e.key for e, _, _ in events[:4] if isinstance(e, Added)} == {
        "default/a",
        "default/b",
        "default/c",
        "default/d",
    }
    assert [e for e, _, _ in events if isinstance(e, Synced)] == [
        Synced(informer.resource_version, 4, 1)
    ]


async def test_streaming_false_always_lists(api: ApiServer, kube: KubeClient) -> None:
    api.create("pods", pod("a"))
    informer: Informer[str] = Informer(kube, PODS, project=node_of, streaming=False)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert informer.snapshot() == {"default/a": ""} and informer.sync_mode == LISTING
        tg.cancel_scope.cancel()
    assert api.count("list", "pods") == 1 and api.count_watch_lists("pods") == 0


async def test_a_server_that_ignores_streaming_lists_is_found_out_at_its_first_bookmark() -> None:
    """A plain watch answers the streaming list (a proxy dropped ``sendInitialEvents``):
    its first bookmark, without the end annotation, ends the attempt there and then — not
    when the watch times out (300 s here) — and every informer on the same client lists
    from then on without asking; later re-syncs try streaming again."""
    async with ApiServer(
        bookmark_interval=0.2, watch_list=True, ignore_send_initial_events=True
    ) as api, KubeClient.for_url(api.url) as kube:
        api.create("pods", pod("a"))
        api.create("pods", pod("b", node="n1"))
        api.create("nodes", {"metadata": {"name": "n1"}})
        clock = _ShiftedClock()
        informer, events = recording(kube, clock=clock)
        nodes: Informer[Json] = Informer(kube, NODES, backoff=fast_backoff(), clock=clock)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(10):
                await tg.start(informer.run)
            assert informer.snapshot() == {"default/a": "", "default/b": "n1"}
            assert informer.sync_mode == LISTING and informer.lists == 1
            # Nothing from the plain watch was kept: the list's events, Synced once.
            assert [type(e).__name__ for e in events] == ["Added", "Added", "Synced"]
            assert api.count("list", "pods") == 1 and api.count_watch_lists("pods") == 0
            assert kube.watch_list_ignored_until is not None
            # Another informer on this client lists at once: no streaming request.
            with anyio.fail_after(10):
                await tg.start(nodes.run)
            assert "n1" in nodes and nodes.sync_mode == LISTING
            await eventually(lambda: api.open_watches("nodes") == 1, what="the nodes watch")
            assert api.count("list", "nodes") == 1 and api.count("watch", "nodes") == 1
            assert api.count("watch", "pods") == 2  # the ignored request, then the watch
            # Once the window has passed, a re-sync asks again (and here it is served).
            api.ignore_send_initial_events = False
            clock.shift += informer.streaming_retry_after + 1.0
            _expire(api, "pods")
            await eventually(lambda: informer.lists == 2, what="the re-sync after 410")
            assert informer.sync_mode == STREAMING and api.count_watch_lists("pods") == 1
            tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("version", "mode"),
    [("v1.26.15", LISTING), ("v1.27.0", STREAMING), ("v1.32.4-eks-1a2b3c", STREAMING)],
)
async def test_a_server_older_than_1_27_is_not_asked_for_a_streaming_list(
    version: str, mode: str
) -> None:
    """/version is asked once per client; 1.26 and older have no streaming lists (a real
    one refuses ours for its resourceVersionMatch): they are listed at once."""
    async with ApiServer(
        bookmark_interval=0.1, watch_list=True, version=version
    ) as api, KubeClient.for_url(api.url) as kube:
        api.create("pods", pod("a"))
        api.create("nodes", {"metadata": {"name": "n1"}})
        pods, _ = recording(kube)
        nodes: Informer[Json] = Informer(kube, NODES)
        async with anyio.create_task_group() as tg:
            await tg.start(pods.run)
            await tg.start(nodes.run)
            assert pods.sync_mode == nodes.sync_mode == mode
            assert "default/a" in pods and "n1" in nodes
            tg.cancel_scope.cancel()
    assert api.count("get", "version") == 1
    streamed = 2 if mode == STREAMING else 0
    assert api.count_watch_lists("pods") + api.count_watch_lists("nodes") == streamed
    assert api.count("list", "pods") + api.count("list", "nodes") == 2 - streamed


async def test_server_version_is_cached_unless_the_failure_may_pass(api: ApiServer) -> None:
    async with KubeClient.for_url(api.url) as kube:
        api.fail("get", "version", 503, times=1)
        assert await kube.server_version() is None  # unavailable: asked again next time
        got = await kube.server_version()
        assert got == ServerVersion(1, 33, "v1.33.0-standin") and str(got) == "v1.33.0-standin"
        assert await kube.server_version() is got
    async with KubeClient.for_url(api.url) as kube:
        api.fail("get", "version", 403)  # refused: unknown for good, streaming still tried
        assert await kube.server_version() is None
        assert await kube.server_version() is None
        pods, _ = recording(kube)
        async with anyio.create_task_group() as tg:
            await tg.start(pods.run)
            assert pods.sync_mode == STREAMING
            tg.cancel_scope.cancel()
    assert api.count("get", "version") == 3  # 503, then 200 (cached); 403 (cached)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"major": "1", "minor": "27+", "gitVersion": "v1.27.3-gke.100"}, (1, 27)),
        ({"major": "", "minor": "", "gitVersion": "v1.26.1"}, (1, 26)),
        ({"gitVersion": "1.30.0"}, (1, 30)),
        ({"major": "1"}, None),
        ({}, None),
    ],
)
def test_server_version_parses_what_providers_report(
    body: Json, expected: tuple[int, int] | None
) -> None:
    got = ServerVersion.parse(body)
    assert (None if got is None else (got.major, got.minor)) == expected


async def test_a_plain_watch_on_a_quiet_resource_is_found_out_when_it_times_out() -> None:
    """kube-apiserver sends a plain watch a bookmark only once the resource has moved on:
    on a quiet one none comes. A stream that runs to its timeout without the end bookmark
    was a plain watch all the same (a real streaming list ends its initial events at
    once), and the other informers on the client are spared the wait."""
    async with ApiServer(
        bookmark_interval=600, watch_list=True, ignore_send_initial_events=True
    ) as api, KubeClient.for_url(api.url) as kube:
        api.create("pods", pod("a"))
        informer, events = recording(kube, watch_timeout=1)
        nodes: Informer[Json] = Informer(kube, NODES)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(10):
                await tg.start(informer.run)
            assert informer.sync_mode == LISTING and [type(e).__name__ for e in events] == [
                "Added", "Synced"]
            assert kube.watch_list_ignored_until is not None
            await tg.start(nodes.run)
            assert nodes.sync_mode == LISTING
            await eventually(lambda: api.open_watches("nodes") == 1, what="the nodes watch")
            assert api.count("watch", "nodes") == 1  # the watch after its list: no attempt
            tg.cancel_scope.cancel()
    assert api.count_watch_lists("pods") == 0
