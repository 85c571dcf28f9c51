"""The extender's HTTP surface in-process: golden wire JSON and bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.builders import node, pod
from vgpud.core.allocate import Allocator
from vgpud.core.model import Placement
from vgpud.core.requests import parse_pod
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.scheduling.state import SchedulerState

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Allocator]]:
    alloc = Allocator()
    for n in (node("big", 2, 40000), node("small", 1, 8000), node("sick", 1, 40000,
                                                                      healthy=(False,))):
        alloc.set_node(n)
    async with serving(Extender(SchedulerState(alloc), writer=None, events=None,
                                metrics=Metrics(alloc))) as url:
        yield url, alloc


@asynccontextmanager
async def serving(ext: Extender) -> AsyncIterator[str]:
    """The extender's app on a free local port; its URL."""
    runner = web.AppRunner(make_app(ext, ready=lambda: True))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def post(url: str, body: Any, *, raw: bool = False) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(
            url, data=body if raw else json.dumps(body),
            headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def test_filter_speaks_the_extender_wire_format(server: tuple[str, Allocator]) -> None:
    url, _ = server
    status, doc = await post(f"{url}/filter", {
        "Pod": pod("p", memory=10000), "NodeNames": ["big", "small", "sick", "ghost"]})
    assert status == 200
    assert set(doc) == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert doc["NodeNames"] == ["big"] and doc["Error"] == ""
    assert doc["FailedNodes"] == {}
    assert set(doc["FailedAndUnresolvableNodes"]) == {"small", "sick", "ghost"}
    assert "10000 MiB" in doc["FailedAndUnresolvableNodes"]["small"]


async def test_filter_with_full_node_objects(server: tuple[str, Allocator]) -> None:
    url, _ = server
    items = [{"metadata": {"name": n}, "status": {}} for n in ("big", "small")]
    _, doc = await post(f"{url}/filter", {"Pod": pod("p", memory=100),
                                          "Nodes": {"items": items}})
    assert [n["metadata"]["name"] for n in doc["Nodes"]["items"]] == ["big", "small"]
    assert doc["NodeNames"] is None


async def test_resolvable_rejections_go_to_failed_nodes(server: tuple[str, Allocator]) -> None:
    url, alloc = server
    d = alloc.schedule(parse_pod(pod("a", memory=7000), alloc.defaults), ["small"])
    assert d.placement is not None
    _, doc = await post(f"{url}/filter", {"Pod": pod("b", memory=7000), "NodeNames": ["small"]})
    assert list(doc["FailedNodes"]) == ["small"]


async def test_prioritize_scores_are_0_to_10(server: tuple[str, Allocator]) -> None:
    url, _ = server
    status, doc = await post(f"{url}/prioritize", {"Pod": pod("p", memory=100),
                                                   "NodeNames": ["big", "small"]})
    assert status == 200
    assert [d["Host"] for d in doc] == ["big", "small"]
    assert all(isinstance(d["Score"], int) and 0 <= d["Score"] <= 10 for d in doc)


@pytest.mark.parametrize(("path", "body", "fragment"), [
    ("/filter", b"{not json", "not valid JSON"),
    ("/filter", b"", "empty request body"),
    ("/filter", b"[]", "must be a JSON object"),
    ("/filter", b'{"NodeNames": ["a"]}', "missing 'Pod'"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p"}}}', "neither 'NodeNames' nor 'Nodes'"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "big"}', "list of node"),
    ("/prioritize", b"\xff\xfe", "not valid JSON"),
    ("/bind", b'{"PodName": "p"}', "'Node' is missing"),
    ("/bind", b'{"PodName": 3, "Node": "n"}', "must be a string"),
])
async def test_malformed_bodies_get_400_and_a_reason(server: tuple[str, Allocator], path: str,
                                                     body: bytes, fragment: str) -> None:
    url, _ = server
    status, doc = await post(f"{url}{path}", body, raw=True)
    assert status == 400
    assert fragment in doc["Error"]
    async with aiohttp.ClientSession() as s, s.get(f"{url}/healthz") as r:
        assert r.status == 200  # still serving


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


POD_HOLE = b'{"metadata": {"name": "p", "uid": "u"}, "spec": {"x": HOLE}}'


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
@pytest.mark.parametrize(("body", "fragment", "headers"), [
    (nested(100_000), "deeper than 100 levels", {}),
    (b'{"Pod": ' + POD_HOLE.replace(b"HOLE", nested(150)) + b', "NodeNames": ["big"], '
     b'"PodName": "p", "Node": "big"}', "deeper than 100 levels", {}),
    (b'{"Pod": NaN, "NodeNames": ["big"]}', "not valid JSON", {}),
    (b'{"NodeNames": ["' + bytes([0xC3, 0x28]) + b'"]}', "not UTF-8", {}),
    (b'{"PodName": "p", "Node": "big"}', "Content-Encoding (gzip)",
     {"Content-Encoding": "gzip"}),
], ids=["deep", "deep-pod", "nan", "not-utf8", "not-gzip"])
async def test_hostile_bodies_get_400_and_a_reason(server: tuple[str, Allocator], path: str,
                                                   body: bytes, fragment: str,
                                                   headers: dict[str, str]) -> None:
    """Every verb decodes through the one edge decoder: nesting past what kube-scheduler
    ever sends (a pod nested 150 deep was scheduled), JSON's forbidden constants, text
    that is not UTF-8 and a body that is not its Content-Encoding get a 400 naming the
    problem (not a 200 carrying an internal error, not a 5xx)."""
    url, _ = server
    async with aiohttp.ClientSession() as s, s.post(
            f"{url}{path}", data=body,
            headers={"Content-Type": "application/json", **headers}) as r:
        status, doc = r.status, await r.json(content_type=None)
    assert (status, fragment in doc["Error"]) == (400, True), doc
    async with aiohttp.ClientSession() as s, s.get(f"{url}/healthz") as r:
        assert r.status == 200  # still serving


@pytest.mark.parametrize(("limits", "fragment"), [
    ({"memory": -5}, "negative"),
    ({"memory": "1e30"}, "absurd"),
    ({"cores": 250}, "more than 100"),
    ({"number": "2.5"}, "not a whole number"),
])
async def test_bad_quantities_fail_every_node_unresolvably(server: tuple[str, Allocator],
                                                           limits: dict, fragment: str) -> None:
    url, _ = server
    status, doc = await post(f"{url}/filter", {"Pod": pod("p", **limits),
                                               "NodeNames": ["big", "small"]})
    assert status == 200 and doc["NodeNames"] == []
    assert set(doc["FailedAndUnresolvableNodes"]) == {"big", "small"}
    assert all(fragment in m for m in doc["FailedAndUnresolvableNodes"].values())


async def test_filter_refuses_what_the_webhook_would_refuse(
        server: tuple[str, Allocator]) -> None:
    """Issue 22, finding 18, defence in depth: a GPU pod the webhook never saw (a
    namespace it spares, a webhook down under failurePolicy Ignore) that could undo its
    shim is refused on every node, with the webhook's reason; other pods are unaffected."""
    url, _ = server
    unsafe = pod("p", number=1)
    unsafe["spec"]["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    _, doc = await post(f"{url}/filter", {"Pod": unsafe, "NodeNames": ["big", "small"]})
    assert doc["NodeNames"] == []
    reason = doc["FailedAndUnresolvableNodes"]["big"]
    assert "seccompProfile is Unconfined" in reason and "/etc/ld.so.preload" in reason
    plain = pod("q", containers=[{"name": "c", "securityContext": {"privileged": True}}])
    _, doc = await post(f"{url}/filter", {"Pod": plain, "NodeNames": ["big"]})
    assert doc["NodeNames"] == ["big"]  # no GPU asked: none of our business


async def test_unknown_policy_name(server: tuple[str, Allocator]) -> None:
    url, _ = server
    p = pod("p", memory=1, annotations={"nvidia.com/node-scheduler-policy": "fastest"})
    _, doc = await post(f"{url}/filter", {"Pod": p, "NodeNames": ["big"]})
    assert "unknown value 'fastest'" in doc["FailedAndUnresolvableNodes"]["big"]


async def test_bind_without_api_is_a_clear_error(server: tuple[str, Allocator]) -> None:
    url, _ = server
    status, doc = await post(f"{url}/bind", {"PodName": "p", "PodNamespace": "default",
                                             "PodUID": "u", "Node": "big"})
    assert status == 200 and "disabled" in doc["Error"]


async def test_oversized_body_is_refused(server: tuple[str, Allocator]) -> None:
    url, _ = server
    status, doc = await post(f"{url}/filter", b"x" * (65 << 20), raw=True)
    assert status == 413 and "larger than" in doc["Error"]


async def test_metrics(server: tuple[str, Allocator]) -> None:
    url, _ = server
    await post(f"{url}/filter", {"Pod": pod("p", memory=10), "NodeNames": ["big"]})
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    assert 'vgpud_extender_requests_total{outcome="ok",verb="filter"}' in text
    assert ('vgpud_scheduler_gpu_memory_capacity_bytes{node="big",uuid="GPU-big-0",'
            f'model="Tesla V100-PCIE-32GB"}} {40000 << 20}') in text
    assert "vgpud_extender_request_duration_seconds_bucket" in text
    # known label values exist before their first event
    assert 'vgpud_extender_requests_total{outcome="internal_error",verb="bind"} 0.0' in text
    assert "vgpud_scheduler_pending_gpu_pods 0.0" in text


async def test_verbs_refuse_until_the_caches_have_synced() -> None:
    alloc = Allocator()
    alloc.set_node(node("big", 2, 40000))
    synced = False
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc))
    runner = web.AppRunner(make_app(ext, ready=lambda: synced))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        body = {"Pod": pod("p", memory=10), "NodeNames": ["big"]}
        status, doc = await post(f"{url}/filter", body)
        assert status == 200 and "still syncing" in doc["Error"]  # kube-scheduler retries
        async with aiohttp.ClientSession() as s, s.get(f"{url}/readyz") as r:
            assert r.status == 503
        synced = True
        status, doc = await post(f"{url}/filter", body)
        assert doc["Error"] == "" and doc["NodeNames"] == ["big"]
    finally:
        await runner.cleanup()


async def test_verbs_and_ops_can_listen_apart() -> None:
    alloc = Allocator()
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc))
    verbs = web.AppRunner(make_app(ext, lambda: True, ops=False))
    ops = web.AppRunner(make_app(ext, lambda: True, verbs=False))
    urls = []
    for r in (verbs, ops):
        await r.setup()
        site = web.TCPSite(r, "127.0.0.1", 0)
        await site.start()
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{urls[0]}/metrics") as r:
                assert r.status == 404
            async with s.post(f"{urls[1]}/bind", json={}) as r:
                assert r.status in (404, 405)
            async with s.get(f"{urls[1]}/metrics") as r:
                assert r.status == 200
    finally:
        for r in (verbs, ops):
            await r.cleanup()


def test_per_gpu_exposition_parses_and_escapes() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from vgpud.extender.metrics import render_allocation, snapshot

    alloc = Allocator()
    alloc.set_node(node("n1", 2, 16000, model='Odd "GPU"\\ name'))
    alloc.set_node(node("n2", 1, 8000))
    alloc.remove_node("n2")
    assert alloc.schedule(parse_pod(pod("a", memory=3000, cores=20), alloc.defaults)).placement
    families = {f.name: f for f in text_string_to_metric_families(
        render_allocation(snapshot(alloc)))}
    mem = {s.labels["uuid"]: s.value
           for s in families["vgpud_scheduler_gpu_memory_allocated_bytes"].samples}
    assert mem == {"GPU-n1-0": 3000 << 20, "GPU-n1-1": 0}  # the removed node is gone
    sample = families["vgpud_scheduler_gpu_cores_allocated_ratio"].samples[0]
    assert sample.labels["model"] == 'Odd "GPU"\\ name'
    assert sample.value == 0.2
    states = {s.labels["state"]: s.value
              for s in families["vgpud_scheduler_ledger_entries"].samples}
    assert states == {"assumed": 1, "confirmed": 0}


async def test_prioritize_zeroes_a_node_filled_since_the_filter(
        server: tuple[str, Allocator]) -> None:
    """Between a pod's filter and its prioritize another bind may take a node's last
    room; binpack would still score that node best, and the bind would fail. The
    extender scores it 0, and the pod's intent (what its bind will take) goes to the
    node it still fits."""
    url, alloc = server
    late = pod("late", memory=7000, cores=50)
    late["metadata"]["uid"] = "uid-late"
    _, doc = await post(f"{url}/filter", {"Pod": late, "NodeNames": ["big", "small"]})
    assert doc["NodeNames"] == ["big", "small"]
    # "small" (8000 MiB, one GPU) is the binpack favourite, until another pod takes it
    _, before = await post(f"{url}/prioritize", {"Pod": late, "NodeNames": ["big", "small"]})
    assert {d["Host"]: d["Score"] for d in before}["small"] > 0
    first = alloc.schedule(parse_pod(pod("first", memory=7000), alloc.defaults), ["small"])
    assert first.placement is not None
    _, after = await post(f"{url}/prioritize", {"Pod": late, "NodeNames": ["big", "small"]})
    scores = {d["Host"]: d["Score"] for d in after}
    assert scores["small"] == 0 and scores["big"] > 0
    assert alloc.intents() == 1  # on "big", where its bind will find room
    placed = alloc.place(parse_pod(late, alloc.defaults), "big")
    assert isinstance(placed, Placement) and placed.node == "big"


@pytest.mark.parametrize("gate", [True, False])
async def test_gpu_topology_gate_decides_whether_link_mode_binds(gate: bool) -> None:
    """Issue 24, item 3: with GPUTopology on (the default) a pod asking two NVLinked GPUs
    finds none on a node without NVLink; with the gate off the link mode is ignored (as
    VGPU-Manager's gate does) and the node fits."""
    alloc = Allocator()
    alloc.set_node(node("pcie", 2, 40000))
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc),
                   topology=gate)
    async with serving(ext) as url:
        _, doc = await post(f"{url}/filter", {
            "Pod": pod("p", number=2, memory=1000,
                       annotations={"nvidia.com/device-topology-mode": "link"}),
            "NodeNames": ["pcie"]})
    assert doc["NodeNames"] == ([] if gate else ["pcie"]), doc
