"""The API stand-in itself, driven by the real kubernetes_asyncio client over HTTP."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.builders import gpu_pod
from tests.standin import ApiServer

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return gpu_pod(name, annotations=None, labels=labels, scheduler=None, image="busybox",
                   typed=False)


@pytest.fixture
async def v1(api: ApiServer) -> Any:
    async with client.ApiClient(client.Configuration(host=api.url)) as api_client:
        yield client.CoreV1Api(api_client)


async def test_create_assigns_server_fields_and_rejects_duplicates(v1: Any) -> None:
    pod = await v1.create_namespaced_pod("default", _pod("a"))
    assert pod.metadata.uid and pod.metadata.creation_timestamp
    assert pod.spec.scheduler_name == "default-scheduler"
    assert pod.status.phase == "Pending"
    other = await v1.create_namespaced_pod("default", _pod("b"))
    assert int(other.metadata.resource_version) > int(pod.metadata.resource_version)
    with pytest.raises(ApiException) as err:
        await v1.create_namespaced_pod("default", _pod("a"))
    assert err.value.status == 409
    assert json.loads(err.value.body or b"")["reason"] == "AlreadyExists"


async def test_list_selectors_and_consistent_pages(api: ApiServer, v1: Any) -> None:
    for i in range(7):
        api.create("pods", _pod(f"p{i}", tier="gpu" if i % 2 else "cpu"))
    api.patch("pods", "p1", {"spec": {"nodeName": "n1"}})
    gpu = await v1.list_namespaced_pod("default", label_selector="tier in (gpu)")
    assert sorted(p.metadata.name for p in gpu.items) == ["p1", "p3", "p5"]
    unbound = await v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=")
    assert "p1" not in {p.metadata.name for p in unbound.items} and len(unbound.items) == 6
    not_cpu = await v1.list_namespaced_pod("default", label_selector="tier!=cpu,tier")
    assert len(not_cpu.items) == 3
    with pytest.raises(ApiException) as err:
        await v1.list_namespaced_pod("default", field_selector="spec.bogus=x")
    assert err.value.status == 400

    first = await v1.list_namespaced_pod("default", limit=3)
    assert len(first.items) == 3 and first.metadata._continue
    api.create("pods", _pod("late"))  # not part of the snapshot being paged
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = await v1.list_namespaced_pod("default", limit=3, _continue=token)
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert sorted(names) == [f"p{i}" for i in range(7)]


async def test_patch_types(api: ApiServer, v1: Any) -> None:
    api.create("pods", _pod("p", a="1", b="2"))
    merged = await v1.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"labels": {"a": None, "c": "3"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"b": "2", "c": "3"}
    strategic = await v1.patch_namespaced_pod(  # dict body: strategic merge patch
        "p", "default", {"spec": {"tolerations": [{"key": "x", "operator": "Exists"}]}}
    )
    assert [t.key for t in strategic.spec.tolerations] == ["x"]
    patched = await v1.patch_namespaced_pod(  # list body: JSON patch
        "p",
        "default",
        [
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "add", "path": "/metadata/annotations", "value": {"k/x~y": "v"}},
        ],
    )
    assert patched.metadata.annotations == {"k/x~y": "v"}
    with pytest.raises(ApiException) as err:
        await v1.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/labels/b", "value": "nope"}]
        )
    assert err.value.status == 422
    applied = await v1.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"name": "p", "labels": {"applied": "yes"}}},
        _content_type="application/apply-patch+yaml",
        field_manager="test",
    )
    assert applied.metadata.labels["applied"] == "yes" and applied.metadata.labels["b"] == "2"
    with pytest.raises(ApiException) as err:
        await v1.patch_namespaced_pod(
            "p", "default", {"metadata": {}}, _content_type="application/apply-patch+yaml"
        )
    assert err.value.status == 400  # apply needs a fieldManager


async def test_resource_version_preconditions(api: ApiServer, v1: Any) -> None:
    pod = await v1.create_namespaced_pod("default", _pod("p"))
    stale = pod.metadata.resource_version
    await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as err:
        await v1.patch_namespaced_pod(
            "p",
            "default",
            {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}},
            _content_type="application/merge-patch+json",
        )
    status = json.loads(err.value.body or b"")
    assert err.value.status == 409
    assert status["kind"] == "Status" and status["reason"] == "Conflict"
    assert "has been modified" in status["message"]
    pod.metadata.resource_version = stale
    with pytest.raises(ApiException) as err:
        await v1.replace_namespaced_pod("p", "default", pod)
    assert err.value.status == 409
    assert api.get("pods", "p")["metadata"]["labels"] == {"x": "1"}


async def test_status_changes_through_the_main_resource_are_ignored(v1: Any) -> None:
    await v1.create_namespaced_pod("default", _pod("p"))
    await v1.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    assert (await v1.read_namespaced_pod("p", "default")).status.phase == "Pending"
    await v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert (await v1.read_namespaced_pod("p", "default")).status.phase == "Running"


async def test_binding_sets_node_once_and_reproduces_the_client_bug(
    api: ApiServer, v1: Any
) -> None:
    api.create("pods", _pod("p"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name="n1"),
    )
    # The real server answers 201 + Status; the generated client chokes on it.
    with pytest.raises(ValueError, match="target"):
        await v1.create_namespaced_pod_binding("p", "default", body)
    pod = api.get("pods", "p")
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["status"]["conditions"][-1]["type"] == "PodScheduled"
    with pytest.raises(ApiException) as err:
        await v1.create_namespaced_pod_binding("p", "default", body)
    assert err.value.status == 409 and "already assigned" in str(err.value.body)


async def test_watch_from_resource_version_with_bookmarks(api: ApiServer, v1: Any) -> None:
    api.create("pods", _pod("p0"))
    listed = await v1.list_namespaced_pod("default")
    api.create("pods", _pod("p1"))
    api.patch("pods", "p0", {"metadata": {"labels": {"x": "y"}}})
    api.delete("pods", "p1")
    seen: list[tuple[str, str]] = []
    bookmarks = 0
    async with watch.Watch() as w:
        stream = w.stream(
            v1.list_namespaced_pod,
            "default",
            resource_version=listed.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
        async for event in stream:
            if event["type"] == "BOOKMARK":
                bookmarks += 1
            else:
                seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
    assert seen == [("ADDED", "p1"), ("MODIFIED", "p0"), ("DELETED", "p1")]
    assert bookmarks >= 3  # every 0.1 s for one second
    assert w.resource_version == str(api.store.rv)


async def test_watch_without_resource_version_starts_with_current_objects(
    api: ApiServer, v1: Any
) -> None:
    api.create("pods", _pod("p0"))
    async with watch.Watch() as w:
        events = [e async for e in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=1)]
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "p0")]


async def test_filtered_watch_sees_objects_leave_and_enter(api: ApiServer, v1: Any) -> None:
    api.create("pods", _pod("p"))
    rv = str(api.store.rv)
    api.patch("pods", "p", {"spec": {"nodeName": "n1"}})
    api.create("pods", _pod("q"))
    async with watch.Watch() as w:
        events = [
            (e["type"], e["raw_object"]["metadata"]["name"])
            async for e in w.stream(
                v1.list_pod_for_all_namespaces,
                field_selector="spec.nodeName=",
                resource_version=rv,
                timeout_seconds=1,
            )
        ]
    assert events == [("DELETED", "p"), ("ADDED", "q")]


async def test_compaction_makes_old_resource_versions_gone(api: ApiServer, v1: Any) -> None:
    api.create("pods", _pod("p"))
    rv = str(api.store.rv)
    api.compact()
    with pytest.raises(ApiException) as err:
        async with watch.Watch() as w:
            async for _ in w.stream(
                v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1
            ):
                pass
    assert err.value.status == 410
    fresh = await v1.list_namespaced_pod("default")
    assert int(fresh.metadata.resource_version) > int(rv)


async def test_bounded_history_expires_old_resource_versions() -> None:
    async with ApiServer(history_size=3) as api:
        api.create("pods", _pod("p"))
        rv = str(api.store.rv)
        for i in range(5):
            api.patch("pods", "p", {"metadata": {"labels": {"i": str(i)}}})
        async with aiohttp.ClientSession() as http:
            url = f"{api.url}/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}"
            async with http.get(url) as resp:
                line = json.loads(await resp.content.readline())
    assert line["type"] == "ERROR" and line["object"]["code"] == 410


async def test_faults_counts_and_latency(api: ApiServer, v1: Any) -> None:
    api.create("nodes", {"metadata": {"name": "n1"}})
    api.fail("get", "nodes", 500, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await v1.read_node("n1")
        assert err.value.status == 500
    assert (await v1.read_node("n1")).metadata.name == "n1"
    assert api.count("get", "nodes") == 3
    api.fail("list", "nodes", 429, retry_after=7, times=1)
    with pytest.raises(ApiException) as err:
        await v1.list_node()
    assert err.value.status == 429
    assert err.value.headers is not None and err.value.headers["Retry-After"] == "7"
    api.slow("list", "nodes", 0.2, times=1)
    started = anyio.current_time()
    await v1.list_node()
    assert anyio.current_time() - started >= 0.2


async def test_http_control_api(api: ApiServer) -> None:
    async with aiohttp.ClientSession(api.url) as http:
        items = [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}} for i in range(3)
        ]
        async with http.post("/_standin/objects", json={"items": items}) as resp:
            assert (await resp.json())["created"] == 3
        async with http.post(
            "/_standin/faults", json={"verb": "get", "resource": "nodes", "status": 503, "times": 1}
        ) as resp:
            assert resp.status == 200
        async with http.get("/api/v1/nodes/n1") as resp:
            assert resp.status == 503 and (await resp.json())["reason"] == "ServiceUnavailable"
        async with http.get("/api/v1/nodes/n1") as resp:
            assert resp.status == 200
        async with http.post("/_standin/faults", json={"verb": "get", "bogus": 1}) as resp:
            assert resp.status == 400
        async with http.post("/_standin/compact", json={}) as resp:
            assert (await resp.json())["resourceVersion"] == api.store.rv
        async with http.get("/_standin/counts") as resp:
            assert (await resp.json())["counts"]["get nodes"] == 2
        async with http.get("/_standin/state") as resp:
            assert len((await resp.json())["items"]) == 3
        async with http.get("/apis/coordination.k8s.io/v1") as resp:
            assert {r["name"] for r in (await resp.json())["resources"]} == {"leases"}
        async with http.get("/api/v1/namespaces/default/pods/x/exec") as resp:
            assert resp.status == 404


@pytest.mark.parametrize("kubelets", [True, False])
async def test_a_bound_pods_deletion_waits_for_its_kubelet(kubelets: bool) -> None:
    """Graceful deletion (checked against kube-apiserver in tests/realkube/
    test_standin_agrees.py): the bound pod is marked for its grace period; a kubelet on
    the node deletes it at once, and without one it stays until deleted with 0."""
    async with ApiServer(kubelets=kubelets) as api, aiohttp.ClientSession(api.url) as http:
        api.create("pods", {**_pod("p"), "spec": {**_pod("p")["spec"], "nodeName": "n1"}})
        pods = api.store.by_name("pods")
        start = api.store.rv
        async with http.delete("/api/v1/namespaces/default/pods/p") as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["metadata"]["deletionGracePeriodSeconds"] == 30
        changes = [(c.type, c.entry.obj["metadata"].get("deletionGracePeriodSeconds"))
                   for c in pods.history if c.rv > start]
        if kubelets:
            assert changes == [(b"MODIFIED", 30), (b"DELETED", 30)]
            assert api.get("pods", "p") is None
            return
        assert changes == [(b"MODIFIED", 30)]
        assert api.get("pods", "p")["metadata"]["deletionTimestamp"]
        async with http.delete("/api/v1/namespaces/default/pods/p",
                               json={"gracePeriodSeconds": 0}) as resp:
            assert resp.status == 200
        assert api.get("pods", "p") is None


async def test_runs_as_a_process_with_a_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: ns}\n"
        "spec: {containers: [{name: c, image: busybox}]}\n"
    )
    command = [sys.executable, "-m", "tests.standin", "--port", "0", "--state", str(state)]
    async with await anyio.open_process(command, cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None
            with anyio.fail_after(30):
                line = await BufferedByteReceiveStream(proc.stdout).receive_until(b"\n", 200)
            text = line.decode()
            assert text.startswith("listening on http://"), text
            url = text.split()[-1]
            async with client.ApiClient(client.Configuration(host=url)) as api_client:
                v1 = client.CoreV1Api(api_client)
                assert [n.metadata.name for n in (await v1.list_node()).items] == ["n1"]
                assert (await v1.read_namespaced_pod("p1", "ns")).status.phase == "Pending"
        finally:
            proc.terminate()
            with anyio.fail_after(10):
                assert await proc.wait() == 0


# -- streaming lists (WatchList) ----------------------------------------------------------

WATCH_LIST = {
    "send_initial_events": True,
    "resource_version_match": "NotOlderThan",
    "allow_watch_bookmarks": True,
}
FEATURE_OFF = (
    'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents '
    "is forbidden for watch unless the WatchList feature gate is enabled"
)


async def _lines(
    http: aiohttp.ClientSession,
    url: str,
    count: int | None = None,
    then: Callable[[], object] | None = None,
) -> tuple[int, list[Any]]:
    """Status and the JSON lines of a (watch) response: ``count`` of them, or all until
    the server ends it; ``then()`` runs once the server has answered (the watch is
    registered by then)."""
    async with http.get(url) as resp:
        if resp.status != 200:
            return resp.status, [await resp.json()]
        if then is not None:
            then()
        lines: list[Any] = []
        while count is None or len(lines) < count:
            line = await resp.content.readline()
            if not line:
                break
            lines.append(json.loads(line))
        return 200, lines


async def test_streaming_list_sends_initial_events_then_the_end_bookmark() -> None:
    async with (
        ApiServer(watch_list=True) as api,
        client.ApiClient(client.Configuration(host=api.url)) as api_client,
    ):
        v1 = client.CoreV1Api(api_client)
        for name in ("b", "a", "c"):
            api.create("pods", _pod(name, tier="gpu"))
        api.create("pods", _pod("other", tier="cpu"))
        api.patch("pods", "b", {"metadata": {"annotations": {"x": "1"}}})
        state = str(api.store.rv)
        seen: list[tuple[str, str]] = []
        async with watch.Watch() as w:
            async for event in w.stream(
                v1.list_namespaced_pod, "default", label_selector="tier=gpu", **WATCH_LIST
            ):
                meta = event["raw_object"]["metadata"]
                if event["type"] == "BOOKMARK":
                    seen.append(("BOOKMARK", meta["resourceVersion"]))
                    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
                    api.create("pods", _pod("d", tier="gpu"))  # a live event follows
                    continue
                seen.append((event["type"], meta["name"]))
                if meta["name"] == "d":
                    w.stop()
    # Key order (kube-apiserver's watch cache), the bookmark at the state's RV, then live.
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("ADDED", "c"),
        ("BOOKMARK", state),
        ("ADDED", "d"),
    ]
    assert api.count_watch_lists("pods") == 1 and api.count("list", "pods") == 0


async def test_list_options_are_defaulted_and_validated_as_kube_apiserver_does() -> None:
    async with (
        ApiServer(watch_list=True, bookmark_interval=60) as api,
        aiohttp.ClientSession(api.url) as http,
    ):
        api.create("pods", _pod("p"))
        pods = "/api/v1/namespaces/default/pods?"
        status, body = await _lines(http, pods + "watch=1&sendInitialEvents=true")
        assert status == 422 and body[0]["reason"] == "Invalid"
        assert body[0]["message"] == (
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        )
        assert body[0]["details"] == {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [
                {
                    "reason": "FieldValueForbidden",
                    "message": "Forbidden: sendInitialEvents requires setting "
                    "resourceVersionMatch to NotOlderThan",
                    "field": "resourceVersionMatch",
                }
            ],
        }
        status, body = await _lines(
            http, pods + "watch=1&sendInitialEvents=true&resourceVersionMatch=Exact"
        )
        assert status == 422 and body[0]["message"] == (
            'ListOptions.meta.k8s.io "" is invalid: [resourceVersionMatch: Forbidden: '
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, "
            'resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"]'
        )
        status, body = await _lines(http, pods + "watch=1&resourceVersionMatch=NotOlderThan")
        assert status == 422 and body[0]["message"].endswith(
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        )
        status, body = await _lines(http, pods + "sendInitialEvents=true")
        assert status == 422 and body[0]["message"].endswith(
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
        )
        # Without allowWatchBookmarks the real server accepts it: initial events, no
        # end bookmark — the next line is the next change.
        names = iter(f"live{i}" for i in range(3))
        status, events = await _lines(
            http,
            pods + "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            count=2,
            then=lambda: api.create("pods", _pod(next(names))),
        )
        assert status == 200
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "p"),
            ("ADDED", "live0"),
        ]
        # A plain watch from "" is defaulted to a streaming list (SetListOptionsDefaults):
        # with bookmarks allowed it ends its initial events with the bookmark too.
        status, events = await _lines(http, pods + "watch=1&allowWatchBookmarks=1", count=3)
        assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
        assert events[2]["object"]["metadata"] == {
            "resourceVersion": str(api.store.rv),
            "annotations": {"k8s.io/initial-events-end": "true"},
        }
        # sendInitialEvents=false from "": no initial events, just what happens next.
        status, events = await _lines(
            http,
            pods + "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan",
            count=1,
            then=lambda: api.create("pods", _pod(next(names))),
        )
        assert status == 200 and events[0]["object"]["metadata"]["name"] == "live1"
    assert api.count_watch_lists("pods") == 1


async def test_watch_list_switch_refuses_as_a_server_without_the_feature(
    api: ApiServer, v1: Any
) -> None:
    api.create("pods", _pod("p"))
    assert not api.watch_list  # as kube-apiserver 1.33, which the stand-in reports
    with pytest.raises(ApiException) as err:
        await v1.list_namespaced_pod("default", watch=True, **WATCH_LIST)
    assert err.value.status == 422
    status = json.loads(err.value.body or b"")
    assert status["reason"] == "Invalid" and status["message"] == FEATURE_OFF
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: sendInitialEvents is forbidden for watch unless the "
            "WatchList feature gate is enabled",
            "field": "sendInitialEvents",
        }
    ]
    # A legacy watch is what it always was: initial ADDEDs, no end bookmark.
    async with aiohttp.ClientSession(api.url) as http:
        url = "/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=1"
        _, events = await _lines(http, url, count=2)  # the first bookmark: a periodic one
        assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
        assert "annotations" not in events[1]["object"]["metadata"]
        # Switched on over HTTP (the out-of-process mode), then cut short once.
        async with http.put("/_standin/watch-list", json={"enabled": True}) as resp:
            assert (await resp.json()) == {"enabled": True, "ignored": False}
        async with http.post(
            "/_standin/cut-watch-lists", json={"resource": "pods", "after": 0}
        ) as resp:
            assert resp.status == 200
        streaming = (
            "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true"
            "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        )
        assert await _lines(http, streaming) == (200, [])  # ended before anything
        async with http.get("/_standin/counts") as resp:
            assert (await resp.json())["watchLists"] == {"pods": 1}
        async with http.put("/_standin/watch-list", json={"enabled": "yes"}) as resp:
            assert resp.status == 400
    assert api.watch_list


async def test_a_server_that_ignores_send_initial_events_serves_a_plain_watch() -> None:
    """What kube-apiserver 1.37 with WatchList off serves behind a proxy that drops
    ``sendInitialEvents`` and ``resourceVersionMatch`` (tests/realkube/test_informers.py
    runs the informer against exactly that): the legacy watch from "" — initial ADDEDs,
    then periodic bookmarks without the end annotation, whether the feature is on or off."""
    async with (
        ApiServer(watch_list=True, ignore_send_initial_events=True, bookmark_interval=0.05)
        as api,
        aiohttp.ClientSession(api.url) as http,
    ):
        api.create("pods", _pod("p"))
        api.create("pods", _pod("q"))
        streaming = (
            "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true"
            "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        )
        for enabled in (True, False):
            api.watch_list = enabled
            status, events = await _lines(http, streaming, count=4)
            assert status == 200
            assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK", "BOOKMARK"]
            assert all("annotations" not in e["object"]["metadata"] for e in events[2:])
        # Even parameters the real server would refuse are never seen.
        status, events = await _lines(http, streaming.replace("NotOlderThan", "Exact"), count=1)
        assert status == 200 and events[0]["type"] == "ADDED"
        async with http.put("/_standin/watch-list", json={"ignored": False}) as resp:
            assert (await resp.json()) == {"enabled": False, "ignored": False}
        status, _ = await _lines(http, streaming)
        assert status == 422  # the feature is off, and now the parameters arrive
        async with http.put("/_standin/watch-list", json={"ignored": 1}) as resp:
            assert resp.status == 400
        async with http.put("/_standin/watch-list", json={"enabled": True, "x": 1}) as resp:
            assert resp.status == 400
    assert api.count_watch_lists("pods") == 0


async def test_version_reports_what_it_is_told_and_fails_by_a_rule_naming_it() -> None:
    async with ApiServer(version="v1.26.15") as api, aiohttp.ClientSession(api.url) as http:
        async with http.get("/version") as resp:
            body = await resp.json()
        assert (body["major"], body["minor"], body["gitVersion"]) == ("1", "26", "v1.26.15")
        api.fail("*", "*", 500)  # a rule for every resource leaves /version alone
        async with http.get("/version") as resp:
            assert resp.status == 200
        api.clear_faults()
        api.fail("get", "version", 503, times=1)
        async with http.get("/version") as resp:
            assert resp.status == 503
        async with http.get("/version") as resp:
            assert resp.status == 200
    assert api.count("get", "version") == 4
