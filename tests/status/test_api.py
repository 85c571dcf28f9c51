"""The status page's JSON API and HTML, in-process (shape, filters, paging, errors,
escaping, headers), and on a real ``vgpud scheduler`` with a separate ops port: the
page and the API are there and not on the verbs' port."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.builders import node
from tests.e2e.cluster import Scheduler, free_port, standin
from tests.status.cluster import EVIL, placed_cluster
from tests.status.test_query import place
from vgpud.core.allocate import Allocator
from vgpud.core.model import ContainerRequest, PodRequest
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.scheduling.state import DraNodes, SchedulerState

pytestmark = pytest.mark.anyio

GPU_KEYS = {"node", "uuid", "index", "model", "healthy", "mig", "memoryCapacity",
            "memoryAllocated", "coresCapacity", "coresAllocated", "vgpusCapacity",
            "vgpusAllocated", "slices", "profile", "parent", "dra"}
SLICE_KEYS = {"namespace", "pod", "container", "memory", "cores", "priority", "state"}
POD_KEYS = {"namespace", "name", "uid", "node", "state", "priority", "grants", "reason",
            "since"}


@dataclass
class Served:
    url: str
    alloc: Allocator
    ready: list[bool]
    session: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, Any, dict[str, str]]:
        async with self.session.get(self.url + path) as r:
            text = await r.text()
            doc = json.loads(text) if r.content_type == "application/json" else text
            return r.status, doc, dict(r.headers)


def pending_request(name: str, priority: int = 0) -> PodRequest:
    return PodRequest("team-c", name, f"uid-{name}", (ContainerRequest("main", 1, 999_999, 0),),
                      priority=priority)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    alloc = Allocator()
    alloc.set_node(node("gpu-a", 2, 32768))
    alloc.set_node(node("gpu-b", 4, 16384, model="NVIDIA A100-SXM4-80GB",
                        healthy=(True, True, False, True)))
    place(alloc, "team-a/train-1", "gpu-a", (0, 8000, 30), (1, 8000, 30))
    place(alloc, "team-a/infer", "gpu-b", (1, 1000, 10), priority=5)
    place(alloc, "team-b/serve", "gpu-b", (1, 2000, 20), confirmed=False)
    place(alloc, f"evil/{EVIL}", "gpu-b", (3, 100, 0))
    state = SchedulerState(alloc)
    state.refuse(pending_request("huge", priority=7), "no GPU has 999999 MiB free",
                 "2026-11-21T10:00:00Z")
    state.refuse(pending_request(EVIL), f"<b>{EVIL}</b>", "2026-11-21T10:00:01Z")
    ready = [True]
    ext = Extender(state, writer=None, events=None, metrics=Metrics(alloc))
    runner = web.AppRunner(make_app(ext, ready=lambda: ready[0]))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            yield Served(f"http://127.0.0.1:{port}", alloc, ready, s)
    finally:
        await runner.cleanup()


async def test_gpus_api_shape(served: Served) -> None:
    status, doc, headers = await served.get("/api/v1/gpus")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert set(doc) == {"items", "total", "offset", "limit"}
    assert (doc["total"], doc["offset"], doc["limit"]) == (6, 0, 200)
    assert [g["uuid"] for g in doc["items"]] == [
        "GPU-gpu-a-0", "GPU-gpu-a-1", "GPU-gpu-b-0", "GPU-gpu-b-1", "GPU-gpu-b-2", "GPU-gpu-b-3"]
    for g in doc["items"]:
        assert set(g) == GPU_KEYS
        for s in g["slices"]:
            assert set(s) == SLICE_KEYS
    b1 = doc["items"][3]
    assert b1 | {"slices": None} == {
        "node": "gpu-b", "uuid": "GPU-gpu-b-1", "index": 1, "model": "NVIDIA A100-SXM4-80GB",
        "healthy": True, "mig": False, "memoryCapacity": 16384 << 20,
        "memoryAllocated": 3000 << 20, "coresCapacity": 100, "coresAllocated": 30,
        "vgpusCapacity": 10, "vgpusAllocated": 2, "slices": None, "profile": "", "parent": "",
        "dra": False}
    assert b1["slices"] == [
        {"namespace": "team-a", "pod": "infer", "container": "main", "memory": 1000 << 20,
         "cores": 10, "priority": 5, "state": "confirmed"},
        {"namespace": "team-b", "pod": "serve", "container": "main", "memory": 2000 << 20,
         "cores": 20, "priority": 0, "state": "assumed"}]
    assert doc["items"][4]["healthy"] is False


@pytest.mark.parametrize(("query", "uuids", "total"), [
    ("node=gpu-a", ["GPU-gpu-a-0", "GPU-gpu-a-1"], 2),
    ("namespace=team-b", ["GPU-gpu-b-1"], 1),
    ("q=TRAIN", ["GPU-gpu-a-0", "GPU-gpu-a-1"], 2),
    ("q=a100&health=unhealthy", ["GPU-gpu-b-2"], 1),
    ("offset=1&limit=2", ["GPU-gpu-a-1", "GPU-gpu-b-0"], 6),
    ("offset=5&limit=2", ["GPU-gpu-b-3"], 6),
    ("offset=6", [], 6),
    ("node=nope", [], 0),
    ("q=%3Cscript", ["GPU-gpu-b-3"], 1),
])
async def test_gpus_filters_and_pages(served: Served, query: str, uuids: list[str],
                                      total: int) -> None:
    status, doc, _ = await served.get(f"/api/v1/gpus?{query}")
    assert status == 200, doc
    assert [g["uuid"] for g in doc["items"]] == uuids
    assert doc["total"] == total


async def test_pods_api(served: Served) -> None:
    status, doc, _ = await served.get("/api/v1/pods")
    assert status == 200 and doc["total"] == 6
    assert [(p["namespace"], p["name"], p["state"]) for p in doc["items"]] == [
        ("evil", EVIL, "confirmed"), ("team-a", "infer", "confirmed"),
        ("team-a", "train-1", "confirmed"), ("team-b", "serve", "assumed"),
        ("team-c", EVIL, "pending"), ("team-c", "huge", "pending")]
    for p in doc["items"]:
        assert set(p) == POD_KEYS
    train = doc["items"][2]
    assert train["node"] == "gpu-a" and [g["uuid"] for g in train["grants"]] == [
        "GPU-gpu-a-0", "GPU-gpu-a-1"]
    assert set(train["grants"][0]) == {"container", "uuid", "memory", "cores", "init"}
    _, doc, _ = await served.get("/api/v1/pods?state=pending&q=huge")
    assert doc["items"] == [{"namespace": "team-c", "name": "huge", "uid": "uid-huge",
                             "node": None, "state": "pending", "priority": 7, "grants": [],
                             "reason": "no GPU has 999999 MiB free",
                             "since": "2026-11-21T10:00:00Z"}]
    _, doc, _ = await served.get("/api/v1/pods?node=gpu-b&limit=1&offset=1")
    assert [p["name"] for p in doc["items"]] == ["infer"] and doc["total"] == 3


@pytest.mark.parametrize(("path", "words"), [
    ("/api/v1/gpus?limit=0", "limit must be between 1 and 5000"),
    ("/api/v1/gpus?limit=5001", "limit must be between 0 and 5000"),
    ("/api/v1/gpus?offset=ten", "offset must be a whole number"),
    ("/api/v1/gpus?state=pending", "unknown parameter 'state'"),
    ("/api/v1/gpus?health=sick", "health must be one of healthy, unhealthy"),
    ("/api/v1/pods?state=running", "state must be one of pending, assumed, confirmed"),
    ("/api/v1/pods?health=healthy", "unknown parameter 'health'"),
    ("/api/v1/summary?x=1", "takes no parameters"),
])
async def test_bad_parameters_are_400_with_a_reason(served: Served, path: str,
                                                    words: str) -> None:
    status, doc, _ = await served.get(path)
    assert status == 400
    assert words in doc["error"]


async def test_not_ready_is_503_and_the_page_says_so(served: Served) -> None:
    served.ready[0] = False
    for path in ("/api/v1/gpus", "/api/v1/pods", "/api/v1/summary"):
        status, doc, _ = await served.get(path)
        assert status == 503 and "still syncing" in doc["error"]
    status, html, _ = await served.get("/")
    assert status == 503 and "still syncing its caches" in html
    assert "GPU-gpu-a-0" not in html


async def test_summary(served: Served) -> None:
    status, doc, _ = await served.get("/api/v1/summary")
    assert status == 200
    assert doc["nodes"] == 2 and doc["gpus"] == 6 and doc["unhealthyGpus"] == 1
    assert doc["pods"] == 4 and doc["assumedPods"] == 1 and doc["pendingPods"] == 2
    assert doc["memoryAllocated"] == (16000 + 3000 + 100) << 20


async def test_the_page_is_complete_without_script(served: Served) -> None:
    status, html, headers = await served.get("/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    rows = re.findall(r'<tr class="gpu[^"]*">', html)
    assert len(rows) == 6 and rows[4] == '<tr class="gpu sick">'
    for text in ("team-a/train-1", "team-b/serve", "no GPU has 999999 MiB free",
                 "2026-11-21T10:00:00Z", "2.9 GiB / 16.0 GiB", "7.8 GiB / 32.0 GiB",
                 "30 / 100 %", "2 / 10", "assumed", "unhealthy", "Per-container usage"):
        assert text in html, text
    assert 'class="fill w18 ok"' in html  # gpu-b-1: 3000 of 16384 MiB
    assert 'class="fill w24 ok"' in html  # gpu-a-*: 8000 of 32768 MiB
    _, small, _ = await served.get("/?limit=2&offset=2&q=gpu")
    assert len(re.findall(r'<tr class="gpu', small)) == 2
    assert 'href="?q=gpu&amp;offset=0&amp;limit=2"' in small
    assert 'href="?q=gpu&amp;offset=4&amp;limit=2"' in small
    assert "3–4 of 6" in small
    assert 'value="gpu"' in small and '<option value="2" selected>' in small


async def test_values_are_escaped_and_the_policy_is_strict(served: Served) -> None:
    status, html, headers = await served.get("/")
    assert status == 200
    assert EVIL not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "unsafe-inline" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    # no inline script or style for the policy to allow, nothing from elsewhere
    assert re.findall(r"<script[^>]*>", html) == [re.search(r'<script src="static/status\.js'
                                                            r'\?v=[0-9a-f]{12}" defer>',
                                                            html)[0]]  # type: ignore[index]
    assert "style=" not in html and "<style" not in html and "http" not in html.split(
        "<body")[0]
    for attr in re.findall(r'(?:href|src)="([^"]*)"', html):
        assert not attr.startswith(("http:", "https:", "//")), attr
    _, bad, _ = await served.get("/?q=" + "%3Cscript%3E" + "&limit=nope")
    assert "<script>" not in bad.replace('<script src="', "")


async def test_static_assets(served: Served) -> None:
    _, html, _ = await served.get("/")
    for name, ctype in (("status.css", "text/css"), ("status.js", "text/javascript"),
                        ("favicon.svg", "image/svg+xml")):
        link = re.search(rf'"(static/{re.escape(name)}\?v=[0-9a-f]+)"', html)
        assert link, name
        status, body, headers = await served.get("/" + link[1])
        assert status == 200 and headers["Content-Type"].startswith(ctype) and body
        assert "immutable" in headers["Cache-Control"]
    status, _, _ = await served.get("/static/nope.js")
    assert status == 404
    status, _, headers = await served.get("/favicon.ico")
    assert status == 200 and headers["Content-Type"] == "image/svg+xml"


async def test_a_bad_page_query_is_400_and_says_why(served: Served) -> None:
    status, html, _ = await served.get("/?limit=-3")
    assert status == 400 and "bad query: limit must be between 0 and 5000, got -3" in html
    status, html, _ = await served.get("/?refresh=0")
    assert status == 400 and "refresh must be 1 to 3600 seconds" in html
    status, html, _ = await served.get("/?refresh=30")
    assert status == 200 and 'data-refresh="30"' in html


async def test_verbs_only_app_has_no_page() -> None:
    alloc = Allocator()
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc))
    app = make_app(ext, ready=lambda: True, ops=False)
    paths = {r.resource.canonical for r in app.router.routes()  # type: ignore[union-attr]
             if r.resource is not None}
    assert paths == {"/filter", "/prioritize", "/bind", "/preempt"}


async def test_real_scheduler_serves_the_page_only_on_its_ops_port(tmp_path: Path) -> None:
    async with placed_cluster(tmp_path) as c, aiohttp.ClientSession() as s:
        for path in ("/", "/api/v1/gpus", "/api/v1/pods", "/static/status.js"):
            async with s.get(c.sched.url + path) as r:
                assert r.status == 404, path  # the verbs' port
            async with s.get(c.sched.ops_url + path) as r:
                assert r.status == 200, path
        async with s.get(c.sched.ops_url + "/api/v1/pods?state=pending") as r:
            pending = await r.json()
        assert [p["name"] for p in pending["items"]] == ["too-big"]
        assert "99999 MiB" in pending["items"][0]["reason"]
        async with s.get(c.sched.ops_url + "/api/v1/gpus?q=train") as r:
            doc = await r.json()
        assert {s["pod"] for g in doc["items"] for s in g["slices"]} >= {"train-1", "train-2"}
        async with s.get(c.sched.ops_url + "/") as r:
            html = await r.text()
        assert "&lt;script&gt;" in html and EVIL not in html
        # bound to the address it was given (127.0.0.1), not to every address
        assert c.sched.ops_port is not None
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", c.sched.ops_port), timeout=2).close()


async def test_real_scheduler_asks_for_the_token_its_settings_name(tmp_path: Path) -> None:
    """Issue 23, finding 3: with ``ops.tokenFile`` the page, the API and /metrics answer 401
    without the token and are served with it; /readyz and the verbs (kube-scheduler sends
    no token) are not asked for one."""
    token = tmp_path / "ops-token"
    token.write_text("let-me-see\n")
    with standin(tmp_path) as (_, kubeconfig):
        sched = Scheduler(kubeconfig, tmp_path, ops_port=free_port(), config={
            "ops": {"tokenFile": str(token), "trustLoopback": False}})
        sched.start()
        try:
            await sched.wait_ready()  # /readyz: no token
            async with aiohttp.ClientSession() as s:
                for path in ("/", "/api/v1/summary", "/metrics"):
                    async with s.get(sched.ops_url + path) as r:
                        assert r.status == 401, path
                        assert "bearer token" in await r.text()
                    async with s.get(sched.ops_url + path,
                                     headers={"Authorization": "Bearer let-me-see"}) as r:
                        assert r.status == 200, path
                async with s.post(sched.url + "/filter", json={
                        "Pod": {"metadata": {"name": "p", "namespace": "default"},
                                "spec": {"containers": [{"name": "c"}]}},
                        "NodeNames": ["n1"]}) as r:
                    assert r.status == 200
                    assert (await r.json())["NodeNames"] == ["n1"]
        finally:
            sched.stop()


async def test_dra_nodes_fed_by_their_informers_show_on_the_page_and_the_api() -> None:
    """The scheduler's DRA informers (projected as they project; here two dicts as their
    caches, and their events) feed the state's :class:`DraNodes`; the API and the page
    list the DRA nodes' GPUs after the cluster's, with a DRA badge, count them in the
    totals, and drop a claim's use once it is deallocated (its projection then empty)
    and a node's GPUs once its slices go. Until
    those informers have listed, the page says it is still syncing (``shown``)."""
    from tests.core.test_dra_report import _claim, _gpu, _result, _slices
    from vgpud.core.dra_report import claim_projection, slice_projection
    from vgpud.kube.cache import Added, Deleted, Modified
    from vgpud.kube.resources import object_key

    alloc = Allocator()
    alloc.set_node(node("gpu-a", 1, 32768))
    slice_cache: dict[str, Any] = {}
    claim_cache: dict[str, Any] = {}
    dra = DraNodes(slices=slice_cache.values, claims=claim_cache.values)
    state = SchedulerState(alloc, dra=dra)
    ready, shown = [True], [False]
    ext = Extender(state, writer=None, events=None, metrics=Metrics(alloc))
    runner = web.AppRunner(make_app(ext, ready=lambda: ready[0], shown=lambda: shown[0]))

    def event(cache: dict[str, Any], e: Any) -> None:
        """What an informer does: its cache changed, then its subscribers told."""
        if isinstance(e, Deleted):
            cache.pop(e.key)
        else:
            cache[e.key] = e.obj if isinstance(e, Added) else e.new
        dra.changed(e)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    slices = _slices("d-node", _gpu(0), _gpu(1))
    other = {"metadata": {"name": "other-driver"}, "spec": {"driver": "gpu.nvidia.com",
                                                              "pool": {"name": "d-node"}}}
    for s in [*slices, other]:
        event(slice_cache, Added(object_key(s), slice_projection(s)))
    assert sum(1 for v in slice_cache.values() if v) == len(slices)  # not the other's
    claim = _claim("c1", _result("gpu-1", pool="d-node", memory="4Gi", cores="30"),
                   pods=("serve",), namespace="team-d")
    event(claim_cache, Added("team-d/c1", claim_projection(claim)))
    try:
        async with aiohttp.ClientSession() as session:
            s = Served(f"http://127.0.0.1:{port}", alloc, ready, session)
            status, doc, _ = await s.get("/api/v1/gpus")
            assert status == 503 and "still syncing" in doc["error"]
            shown[0] = True
            _, doc, _ = await s.get("/api/v1/gpus")
            assert [(g["node"], g["uuid"], g["dra"]) for g in doc["items"]] == [
                ("gpu-a", "GPU-gpu-a-0", False), ("d-node", "GPU-0", True),
                ("d-node", "GPU-1", True)]
            g1 = doc["items"][2]
            assert (g1["memoryAllocated"], g1["coresAllocated"], g1["vgpusAllocated"]) == (
                4 << 30, 30, 1)
            assert [(x["namespace"], x["pod"], x["container"], x["state"])
                    for x in g1["slices"]] == [("team-d", "serve", "c1/gpu", "reserved")]
            _, pods, _ = await s.get("/api/v1/pods?node=d-node")
            assert [(p["name"], p["grants"][0]["uuid"]) for p in pods["items"]] == [
                ("serve", "GPU-1")]
            _, total, _ = await s.get("/api/v1/summary")
            assert (total["nodes"], total["gpus"], total["pods"]) == (2, 3, 1)
            assert total["memoryAllocated"] == 4 << 30
            _, html, _ = await s.get("/?node=d-node")
            assert len(re.findall(r'<tr class="gpu">', html)) == 2
            assert html.count('title="allocated by DRA ResourceClaims">DRA</span>') == 2
            assert "team-d/serve" in html and "c1/gpu" in html

            # deallocated: its projection is empty, its use goes
            done = {**claim, "status": {}}
            event(claim_cache, Modified("team-d/c1", claim_projection(claim),
                                        claim_projection(done)))
            _, doc, _ = await s.get("/api/v1/gpus?node=d-node")
            assert [g["memoryAllocated"] for g in doc["items"]] == [0, 0]
            _, total, _ = await s.get("/api/v1/summary")
            assert total["pods"] == 0
            for sl in slices:
                event(slice_cache, Deleted(object_key(sl), slice_projection(sl)))
            _, doc, _ = await s.get("/api/v1/gpus")
            assert [g["uuid"] for g in doc["items"]] == ["GPU-gpu-a-0"]
    finally:
        await runner.cleanup()
