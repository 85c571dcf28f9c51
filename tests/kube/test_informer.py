"""Informer: list + watch into a cache, bookmarks, 410 → re-list, reconnects."""

from __future__ import annotations

import functools

import anyio
import pytest

from tests.kube.informers import fast_backoff, node_of, pod, recording
from tests.kube.waiting import eventually
from tests.standin import ApiServer
from vgpud.kube.cache import Added, Deleted, Event, Informer, Modified, Synced
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.resources import NODES, PODS
from vgpud.kube.watch import Selector

pytestmark = pytest.mark.anyio


def _metadata(pod: Json) -> Json:
    return dict(pod["metadata"])


async def test_lists_then_follows_changes(api: ApiServer, kube: KubeClient) -> None:
    api.create("pods", pod("a"))
    api.create("pods", pod("b", node="n1"))
    informer: Informer[str] = Informer(kube, PODS, project=node_of, page_size=1)
    events: list[Event[str]] = []
    informer.subscribe(events.append)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert informer.has_synced
        assert informer.snapshot() == {"default/a": "", "default/b": "n1"}
        assert api.count("list", "pods") == 2  # page_size=1: two pages
        assert events[-1] == Synced(informer.resource_version, 2, 1)
        api.patch("pods", "a", {"spec": {"nodeName": "n2"}})
        api.create("pods", pod("c"))
        api.delete("pods", "b")
        await eventually(lambda: len(events) == 6, what="three watch events")
        tg.cancel_scope.cancel()
    assert events[3:] == [
        Modified("default/a", "", "n2"),
        Added("default/c", ""),
        Deleted("default/b", "n1"),
    ]
    assert informer.snapshot() == {"default/a": "n2", "default/c": ""}
    # The stand-in notices the cancelled informer's connection is gone.
    await eventually(lambda: api.open_watches("pods") == 0, what="the server to drop the watch")


async def test_bookmarks_advance_the_resource_version(api: ApiServer, kube: KubeClient) -> None:
    api.create("pods", pod("a"))
    informer: Informer[Json] = Informer(kube, PODS)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        listed = int(informer.resource_version)
        api.create("nodes", {"metadata": {"name": "n1"}})  # moves the global RV, not pods
        await eventually(
            lambda: int(informer.resource_version) > listed, what="a bookmark to arrive"
        )
        assert int(informer.resource_version) == api.store.rv
        tg.cancel_scope.cancel()


async def test_gone_relists_and_reports_what_vanished(api: ApiServer, kube: KubeClient) -> None:
    for name in ("a", "b", "c"):
        api.create("pods", pod(name))
    informer, events = recording(kube)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        del events[:]
        await eventually(lambda: api.open_watches("pods") == 1, what="the watch to open")
        # In one step (no await, so the informer cannot reconnect in between): drop
        # the watch, change things, forget the history.
        api.drop_watches("pods")
        api.delete("pods", "a")
        api.patch("pods", "b", {"spec": {"nodeName": "n9"}})
        api.create("pods", pod("d"))
        api.compact("pods")
        await eventually(lambda: informer.lists == 2, what="a re-list after 410")
        await eventually(lambda: any(isinstance(e, Synced) for e in events), what="synced")
        tg.cancel_scope.cancel()
    assert sorted(events[:-1], key=repr) == sorted(
        [
            Added("default/d", ""),
            Modified("default/b", "", "n9"),
            Deleted("default/a", "", final_state_unknown=True),
        ],
        key=repr,
    )
    assert isinstance(events[-1], Synced) and events[-1].lists == 2
    assert informer.snapshot() == {"default/b": "n9", "default/c": "", "default/d": ""}


async def test_a_change_the_projection_does_not_keep_is_not_an_event(
    api: ApiServer, kube: KubeClient
) -> None:
    """A label change (a node's heartbeat, to a projection without status) moves the
    resourceVersion but not the projection: no Modified, on the watch or at a re-sync."""
    api.create("pods", pod("a"))
    api.create("pods", pod("b"))
    informer, events = recording(kube)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        del events[:]
        await eventually(lambda: api.open_watches("pods") == 1, what="the watch to open")
        api.patch("pods", "a", {"metadata": {"labels": {"beat": "1"}}})
        api.patch("pods", "b", {"spec": {"nodeName": "n1"}})
        await eventually(lambda: len(events) == 1, what="b's change")
        api.drop_watches("pods")
        api.patch("pods", "a", {"metadata": {"labels": {"beat": "2"}}})
        api.patch("pods", "b", {"spec": {"nodeName": "n2"}})
        api.compact("pods")
        await eventually(lambda: any(isinstance(e, Synced) for e in events), what="a re-sync")
        api.patch("pods", "a", {"metadata": {"labels": {"beat": "3"}}})
        api.patch("pods", "a", {"spec": {"nodeName": "n3"}})
        await eventually(lambda: len(events) == 4, what="a's change after the re-sync")
        tg.cancel_scope.cancel()
    assert events[0] == Modified("default/b", "", "n1")
    assert events[1] == Modified("default/b", "n1", "n2")
    assert isinstance(events[2], Synced) and events[2].lists == 2
    assert events[3] == Modified("default/a", "", "n3")
    assert informer.snapshot() == {"default/a": "n3", "default/b": "n2"}


async def test_dropped_watch_reconnects_without_relisting(api: ApiServer, kube: KubeClient) -> None:
    informer: Informer[Json] = Informer(kube, NODES, backoff=fast_backoff())
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        for round_ in range(3):
            await eventually(lambda: api.open_watches("nodes") == 1, what="the watch")
            assert api.drop_watches("nodes") == 1
            name = f"n{round_}"
            api.create("nodes", {"metadata": {"name": name}})
            await eventually(functools.partial(informer.__contains__, name), what="the node")
        tg.cancel_scope.cancel()
    assert informer.lists == 1 and api.count("list", "nodes") == 1
    assert informer.watches >= 4 and api.count("watch", "nodes") >= 4


async def test_server_errors_back_off_and_recover(api: ApiServer, kube: KubeClient) -> None:
    api.create("nodes", {"metadata": {"name": "n1"}})
    api.fail("list", "nodes", 500, times=3)
    informer: Informer[Json] = Informer(kube, NODES, backoff=fast_backoff())
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(informer.run)
        assert "n1" in informer and api.count("list", "nodes") == 4
        await eventually(lambda: api.open_watches("nodes") == 1, what="the watch")
        api.fail("watch", "nodes", 503, times=2)
        api.drop_watches("nodes")
        api.create("nodes", {"metadata": {"name": "n2"}})
        await eventually(lambda: "n2" in informer, what="recovery after watch errors")
        tg.cancel_scope.cancel()
    assert api.count("watch", "nodes") >= 4


async def test_selector_and_stream_subscription(api: ApiServer, kube: KubeClient) -> None:
    api.create("pods", pod("mine", node="n1"))
    api.create("pods", pod("other", node="n2"))
    informer: Informer[Json] = Informer(
        kube, PODS, selector=Selector(fields="spec.nodeName=n1"), project=_metadata
    )
    stream = informer.open_stream()
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        assert list(informer) == ["default/mine"]
        api.create("pods", pod("new", node="n1"))
        received: list[Event[Json]] = []
        with anyio.fail_after(5):
            async for event in stream:
                received.append(event)
                if isinstance(event, Added) and event.key == "default/new":
                    break
        tg.cancel_scope.cancel()
    assert [type(e).__name__ for e in received] == ["Added", "Synced", "Added"]
    assert informer.get("default/new") is not None and informer.get("default/other") is None
