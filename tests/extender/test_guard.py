"""The scheduler's ops port behind its guard (vgpud/ops.py): a bearer token when one is
set, a rate per client, a cap on renders at once; the verbs never behind it (issue 23,
finding 3)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from tests.builders import node, pod
from tests.kube.clocks import ManualClock
from vgpud.config import ConfigError, OpsSettings, parse_settings
from vgpud.core.allocate import Allocator
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.ops import QUEUE_PER_SLOT, RELOAD_EVERY, Guard, TokenFile, is_loopback
from vgpud.scheduling.state import SchedulerState

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
OPS_PATHS = ("/", "/api/v1/gpus", "/api/v1/pods", "/api/v1/summary", "/api/v1/quotas",
             "/metrics",
             "/static/status.css")


class Binder:
    """An in-memory PodBinder: records the binds."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str]] = []

    async def bind(self, namespace: str, name: str, node: str, *, uid: str | None = None,
                   annotations: Mapping[str, str] | None = None) -> None:
        self.bound.append((namespace, name, node))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("filter saw every pod first")


def extender(nodes: int = 3, gpus: int = 2) -> tuple[Extender, Binder]:
    alloc = Allocator()
    for i in range(nodes):
        alloc.set_node(node(f"n{i:05d}", gpus, 40000))
    binder = Binder()
    ext = Extender(SchedulerState(alloc), writer=binder,  # type: ignore[arg-type]
                   events=None, metrics=Metrics(alloc))
    return ext, binder


@contextlib.asynccontextmanager
async def serve(*apps: web.Application, host: str = "127.0.0.1") -> AsyncIterator[list[str]]:
    runners = [web.AppRunner(a, access_log=None) for a in apps]
    urls = []
    try:
        for r in runners:
            await r.setup()
            site = web.TCPSite(r, host, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            urls.append(f"http://{host}:{port}")
        yield urls
    finally:
        for r in runners:
            await r.cleanup()


def token_guard(tmp_path: Path, *, loopback: bool = False, **limits: Any) -> Guard:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    return Guard.from_settings(OpsSettings(tokenFile=str(f), trustLoopback=loopback,
                                           **limits))


async def get(s: aiohttp.ClientSession, url: str, token: str | None = None,
              ) -> tuple[int, str, Mapping[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.get(url, headers=headers) as r:
        return r.status, await r.text(), r.headers


async def filter_and_bind(s: aiohttp.ClientSession, verbs: str, name: str,
                          nodes: list[str]) -> None:
    p = pod(name, memory=100)
    async with s.post(f"{verbs}/filter", json={"Pod": p, "NodeNames": nodes}) as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["Error"] == "" and doc["NodeNames"], doc
    async with s.post(f"{verbs}/bind", json={
            "PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
            "Node": doc["NodeNames"][0]}) as r:
        assert r.status == 200
        assert (await r.json())["Error"] == ""


# -- the bearer token -----------------------------------------------------------------------


@pytest.mark.parametrize("combined", [False, True], ids=["ops-port", "shared-port"])
async def test_ops_routes_need_the_token_and_probes_and_verbs_do_not(
        tmp_path: Path, combined: bool) -> None:
    ext, binder = extender()
    guard = token_guard(tmp_path)
    if combined:  # no --metrics-listen: one app, the verbs exempt
        apps = [make_app(ext, lambda: True, guard=guard)]
    else:
        apps = [make_app(ext, lambda: True, ops=False, guard=guard),
                make_app(ext, lambda: True, verbs=False, guard=guard)]
    async with serve(*apps) as urls, aiohttp.ClientSession() as s:
        verbs, ops = urls[0], urls[-1]
        for path in OPS_PATHS:
            status, text, headers = await get(s, ops + path)
            assert status == 401, path
            assert "bearer token" in text and "Authorization: Bearer" in text
            assert headers["WWW-Authenticate"] == 'Bearer realm="vgpud"'
            status, text, headers = await get(s, ops + path, "wrong")
            assert status == 401 and "not the one" in text, path
            assert 'error="invalid_token"' in headers["WWW-Authenticate"]
            status, _, _ = await get(s, ops + path, TOKEN)
            assert status == 200, path
        status, text, _ = await get(s, ops + "/api/v1/summary")
        assert text.startswith('{"error": "vgpud: this endpoint needs a bearer token')
        for probe in ("/healthz", "/readyz"):
            assert (await get(s, ops + probe))[0] == 200
        # kube-scheduler's extender client sends no token (the chart's
        # KubeSchedulerConfiguration configures none): the verbs answer as before
        await filter_and_bind(s, verbs, "p1", ["n00000", "n00001"])
    assert len(binder.bound) == 1


async def test_loopback_needs_no_token_only_while_trusted(tmp_path: Path) -> None:
    ext, _ = extender()
    for trusted, want in ((True, 200), (False, 401)):
        app = make_app(ext, lambda: True, verbs=False, guard=token_guard(tmp_path,
                                                                          loopback=trusted))
        async with serve(app) as (ops,), aiohttp.ClientSession() as s:
            assert (await get(s, ops + "/api/v1/summary"))[0] == want
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.7") and not is_loopback(None) and not is_loopback("x")


def test_a_bad_token_file_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read ops\.tokenFile"):
        Guard.from_settings(OpsSettings(tokenFile=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        Guard.from_settings(OpsSettings(tokenFile=str(tmp_path / "empty")))


def test_a_rotated_token_is_read_again_on_the_clock(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("old\n")
    clock = ManualClock()
    t = TokenFile(str(f), clock)
    f.write_text("newer\n")
    assert t.current() == "old"  # not looked at again yet
    clock.advance(RELOAD_EVERY)
    assert t.current() == "newer"
    f.write_text("")  # a half-written or emptied file keeps the last good token
    clock.advance(RELOAD_EVERY)
    assert t.current() == "newer"


def test_settings_carry_the_ops_section() -> None:
    s = parse_settings({"ops": {"tokenFile": "/t", "clientQPS": 2, "maxConcurrentRenders": 1}})
    assert s.ops == OpsSettings(tokenFile="/t", clientQPS=2, maxConcurrentRenders=1)
    with pytest.raises(ConfigError, match=r"ops\.clientQPS"):
        parse_settings({"ops": {"clientQPS": 0}})
    with pytest.raises(ConfigError, match=r"ops\.maxConcurrentRenders"):
        parse_settings({"ops": {"maxConcurrentRenders": 0}})


# -- rate and renders at once -----------------------------------------------------------------


async def test_each_client_gets_its_rate_then_429_with_retry_after() -> None:
    ext, _ = extender()
    clock = ManualClock()
    guard = Guard(OpsSettings(clientQPS=0.5, clientBurst=3), clock=clock)
    async with serve(make_app(ext, lambda: True, verbs=False, guard=guard)) as (ops,), \
            aiohttp.ClientSession() as s:
        got = [(await get(s, ops + "/api/v1/summary"))[0] for _ in range(3)]
        assert got == [200, 200, 200]
        status, text, headers = await get(s, ops + "/api/v1/summary")
        assert status == 429 and headers["Retry-After"] == "2"  # 1 token at 0.5 a second
        assert "too many requests" in text and "0.5 a second" in text
        assert (await get(s, ops + "/metrics"))[0] == 429  # the same client's bucket
        for probe in ("/healthz", "/readyz"):  # kubelet's probes are never limited
            assert (await get(s, ops + probe))[0] == 200
        clock.advance(2.0)
        assert (await get(s, ops + "/api/v1/summary"))[0] == 200
        assert (await get(s, ops + "/api/v1/summary"))[0] == 429
    assert guard.refused["rate"] == 3


async def test_renders_past_the_cap_wait_their_turn_then_get_429_busy() -> None:
    """One render at a time (cap 1): four more wait for the slot (QUEUE_PER_SLOT), the
    next is answered 429 at once; a waiter is served when the slot frees, or 429 when it
    has waited its longest."""
    ext, _ = extender()
    guard = Guard(OpsSettings(maxConcurrentRenders=1, clientBurst=100))
    release = anyio.Event()
    app = make_app(ext, lambda: True, verbs=False, guard=guard)

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    app.router.add_get("/slow", slow)
    got: list[int] = []
    async with serve(app) as (ops,), aiohttp.ClientSession() as s, \
            anyio.create_task_group() as tg:

        async def ask() -> None:
            got.append((await get(s, ops + "/slow"))[0])

        for _ in range(1 + QUEUE_PER_SLOT):
            tg.start_soon(ask)
        with anyio.fail_after(10):
            while (guard.rendering, guard.waiting) != (1, QUEUE_PER_SLOT):
                await anyio.lowlevel.checkpoint()
        status, text, headers = await get(s, ops + "/metrics")
        assert status == 429 and headers["Retry-After"] == "1" and "busy" in text
        # static files and probes are not renders
        assert (await get(s, ops + "/static/status.js"))[0] == 200
        assert (await get(s, ops + "/healthz"))[0] == 200
        release.set()
    assert got == [200] * (1 + QUEUE_PER_SLOT)
    assert guard.rendering == guard.waiting == 0 and guard.refused["busy"] == 1


async def test_a_waiter_gives_up_after_its_longest_wait() -> None:
    ext, _ = extender()
    guard = Guard(OpsSettings(maxConcurrentRenders=1), queue_wait=0.05)
    release = anyio.Event()
    app = make_app(ext, lambda: True, verbs=False, guard=guard)

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    app.router.add_get("/slow", slow)
    async with serve(app) as (ops,), aiohttp.ClientSession() as s, \
            anyio.create_task_group() as tg:
        tg.start_soon(get, s, ops + "/slow")
        with anyio.fail_after(10):
            while guard.rendering == 0:
                await anyio.lowlevel.checkpoint()
        status, _, headers = await get(s, ops + "/api/v1/summary")  # waits 0.05 s, no slot
        assert status == 429 and headers["Retry-After"] == "1"
        release.set()
    assert guard.refused["busy"] == 1


async def test_a_pages_refresh_is_served_whole() -> None:
    """The page's script asks for GPUs, pending pods and the summary at once: with the
    defaults all three are served, none refused."""
    ext, _ = extender(nodes=50, gpus=8)
    guard = Guard(OpsSettings())
    statuses: list[int] = []
    async with serve(make_app(ext, lambda: True, verbs=False, guard=guard)) as (ops,), \
            aiohttp.ClientSession() as s, anyio.create_task_group() as tg:

        async def ask(path: str) -> None:
            statuses.append((await get(s, ops + path))[0])

        for _ in range(3):  # three refreshes in a row, each three requests at once
            for path in ("/api/v1/gpus?limit=200", "/api/v1/pods?state=pending&limit=100",
                         "/api/v1/summary"):
                tg.start_soon(ask, path)
    assert statuses == [200] * 9


async def test_a_flood_of_status_requests_is_refused_while_filter_and_bind_go_on() -> None:
    """One client floods the ops port with status pages, API pages and scrapes of a large
    cluster. Most are answered 429 at once; the filters and binds sent meanwhile to the
    verbs' port (the same event loop, as in the pod) are each answered well within a
    second."""
    ext, binder = extender(nodes=1500, gpus=8)
    guard = Guard(OpsSettings())  # the defaults the chart ships
    verbs_app = make_app(ext, lambda: True, ops=False, guard=guard)
    ops_app = make_app(ext, lambda: True, verbs=False, guard=guard)
    names = [f"n{i:05d}" for i in range(0, 1500, 15)]
    statuses: list[int] = []
    retry_after: list[str | None] = []
    latencies: list[float] = []
    async with serve(verbs_app, ops_app) as (verbs, ops), \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as flood, \
            aiohttp.ClientSession() as sched:

        async def one(path: str) -> None:
            async with flood.get(ops + path) as r:
                await r.read()
                statuses.append(r.status)
                retry_after.append(r.headers.get("Retry-After"))

        async with anyio.create_task_group() as tg:
            for i in range(120):
                tg.start_soon(one, ("/metrics", "/api/v1/gpus?limit=5000", "/")[i % 3])
            for i in range(10):
                start = time.perf_counter()
                with anyio.fail_after(1.0):
                    await filter_and_bind(sched, verbs, f"p{i}", names)
                latencies.append(time.perf_counter() - start)
    assert len(statuses) == 120
    refused = [i for i, st in enumerate(statuses) if st == 429]
    assert len(refused) >= 100, statuses
    assert all(retry_after[i] for i in refused)
    assert set(statuses) <= {200, 429}
    assert len(binder.bound) == 10
