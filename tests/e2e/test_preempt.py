"""GPU-aware preemption end to end: ``vgpud scheduler`` as a process, the API stand-in,
and a driver that plays kube-scheduler's preemption over the extender's wire JSON.

kube-scheduler proposes victims by CPU and memory; the extender must keep a node only
if the victims (plus lower-priority GPU pods it adds) free the GPU room, and never
name a pod of equal or higher priority."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from tests.builders import gpu_node, gpu_pod
from tests.e2e.cluster import Driver, overcommitted, running
from vgpud.core.codec import ASSIGNMENT, decode_assignment

pytestmark = pytest.mark.anyio


def prio_pod(name: str, priority: int, limits: dict[str, Any],
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    p = gpu_pod(name, limits)
    p["spec"]["priority"] = priority
    p["metadata"]["labels"] = labels or {}
    return p


def cpu_pod(name: str, node: str, priority: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "priority": priority,
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "4"}}}]}}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Driver, aiohttp.ClientSession, str]]:
    async with running(tmp_path) as (d, _):
        yield d, d.s, d.api


async def preempt(s: aiohttp.ClientSession, ext: str, body: dict[str, Any]) -> dict[str, Any]:
    async with s.post(f"{ext}/preempt", json=body) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def delete(s: aiohttp.ClientSession, api: str, name: str) -> None:
    async with s.delete(f"{api}/api/v1/namespaces/default/pods/{name}") as r:
        assert r.status == 200, await r.text()


async def until(check: Any, what: str, within: float = 20.0) -> None:
    """Poll an async check (an HTTP question: nothing to await instead) until it holds."""
    with anyio.move_on_after(within):
        while not await check():  # noqa: ASYNC110
            await anyio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {within}s waiting for {what}")


async def test_victims_free_exactly_the_gpu_room_and_the_pod_binds(
        cluster: tuple[Driver, aiohttp.ClientSession, str]) -> None:
    d, s, api = cluster
    # n1: one 16 GiB GPU, full with four low-priority pods of 4000 MiB / 25 %; "db" is
    # under a budget that allows no disruption. n2: the same GPU held by pods of the
    # preemptor's own priority, and a CPU-only pod kube-scheduler would evict.
    await d.create([gpu_node("n1", 1, 16000), gpu_node("n2", 1, 16000)])
    low = {"db": {"app": "db"}, "web-a": {"app": "web"}, "web-b": {"app": "web"},
           "web-c": {"app": "web"}}
    # "db" has the lowest priority: without its budget it would be the one to go.
    pods = [prio_pod(n, 5 if n == "db" else 10,
                     {"nvidia.com/vgpu-memory": 4000, "nvidia.com/vgpu-cores": 25}, lb)
            for n, lb in low.items()]
    peers = [prio_pod(f"peer{i}", 1000, {"nvidia.com/vgpu-memory": 8000,
                                         "nvidia.com/vgpu-cores": 50}) for i in range(2)]
    await d.create([*pods, *peers])
    for p in pods:
        assert (await d.schedule(p, ["n1"])).node == "n1"
    for p in peers:
        assert (await d.schedule(p, ["n2"])).node == "n2"
    await d.create([cpu_pod("batch", "n2", 0)])
    high = prio_pod("urgent", 1000, {"nvidia.com/vgpu-memory": 8000,
                                     "nvidia.com/vgpu-cores": 50})
    await d.create([high])
    first = await d.schedule(high, ["n1", "n2"])
    assert first.node is None, "nothing is free: the pod must wait for preemption"

    by_name = {p["metadata"]["name"]: p for p in await d.pods()}
    uid = {n: p["metadata"]["uid"] for n, p in by_name.items()}
    # kube-scheduler frees CPU: on n1 one GPU pod, on n2 the CPU-only pod.
    body = {"Pod": by_name["urgent"],
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": uid["web-a"]}], "NumPDBViolations": 0},
                "n2": {"Pods": [{"UID": uid["batch"]}], "NumPDBViolations": 0}}}

    unguarded = (await preempt(s, d.ext, body))["NodeNameToMetaVictims"]["n1"]["Pods"]
    assert {"UID": uid["db"]} in unguarded, "no budget yet: the lowest priority goes"
    await d.create([{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                     "metadata": {"name": "db", "namespace": "default"},
                     "spec": {"selector": {"matchLabels": {"app": "db"}}},
                     "status": {"disruptionsAllowed": 0}}])

    async def budget_seen() -> bool:
        # the PDB informer is asynchronous: poll until a reply spares "db" (before the
        # budget is seen, "db", the lowest priority, is the one chosen)
        got = await preempt(s, d.ext, body)
        victims = got["NodeNameToMetaVictims"].get("n1", {}).get("Pods", [])
        return bool(victims) and {"UID": uid["db"]} not in victims

    await until(budget_seen, "the PodDisruptionBudget reaches the extender")
    got = (await preempt(s, d.ext, body))["NodeNameToMetaVictims"]
    assert "n2" not in got, "evicting the CPU pod frees no GPU room: no useless eviction"
    n1 = got["n1"]
    victims = [v["UID"] for v in n1["Pods"]]
    assert victims[0] == uid["web-a"] and len(victims) == 2
    assert uid["db"] not in victims and n1["NumPDBViolations"] == 0
    names = {n for n, u in uid.items() if u in victims}
    assert all(by_name[n]["spec"]["priority"] < 1000 for n in names)
    freed = [decode_assignment(by_name[n]["metadata"]["annotations"][ASSIGNMENT])
             for n in names]
    assert sum(dv.memory for a in freed for c in a.containers for dv in c.devices) == 8000
    assert sum(dv.cores for a in freed for c in a.containers for dv in c.devices) == 50

    # The same question in the form kube-scheduler uses without nodeCacheCapable.
    whole = await preempt(s, d.ext, {"Pod": by_name["urgent"], "NodeNameToVictims": {
        "n1": {"Pods": [by_name["web-a"]], "NumPDBViolations": 0}}})
    assert whole["NodeNameToMetaVictims"]["n1"] == n1

    for n in names:  # kube-scheduler evicts; the pod binds once they are gone
        await delete(s, api, n)

    async def fits() -> bool:
        f = await d._verb("filter", {"Pod": by_name["urgent"], "NodeNames": ["n1"]})
        return bool(f["NodeNames"] == ["n1"])

    await until(fits, "the extender sees the victims gone")
    out = await d.schedule(high, ["n1", "n2"])
    assert out.node == "n1", out
    assert overcommitted(await d.pods(), await d.nodes()) == []


async def test_no_room_even_evicting_every_lower_pod_drops_the_node(
        cluster: tuple[Driver, aiohttp.ClientSession, str]) -> None:
    d, s, _ = cluster
    await d.create([gpu_node("n1", 1, 16000)])
    held = [prio_pod("low", 0, {"nvidia.com/vgpu-memory": 4000}),
            prio_pod("equal", 500, {"nvidia.com/vgpu-memory": 12000})]
    await d.create(held)
    for p in held:
        assert (await d.schedule(p, ["n1"])).node == "n1"
    high = prio_pod("big", 500, {"nvidia.com/vgpu-memory": 8000})
    await d.create([high, cpu_pod("cpu", "n1", 0)])
    by_name = {p["metadata"]["name"]: p for p in await d.pods()}
    got = await preempt(s, d.ext, {"Pod": by_name["big"], "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": by_name["cpu"]["metadata"]["uid"]}]}}})
    assert got == {"NodeNameToMetaVictims": {}}
    # a malformed body is a 400 with the reason, not a crash
    async with s.post(f"{d.ext}/preempt", json={"Pod": by_name["big"],
                                               "NodeNameToMetaVictims": {"n1": 7}}) as r:
        assert r.status == 400 and "NodeNameToMetaVictims" in (await r.json())["Error"]


@pytest.mark.parametrize("gate", [True, False])
async def test_serial_bind_node_binds_one_pod_of_a_node_at_a_time(
        tmp_path: Path, gate: bool) -> None:
    """With SerialBindNode, binds to one node never overlap: of four binds, each held
    0.4 s by the API, the API answers one at a time, so they take at least 1.6 s
    together (a lower bound that a slow machine cannot break). Without it they overlap:
    the API answers several at once (no node lock)."""
    config = {"scheduler": {"featureGates": {"SerialBindNode": gate}}}
    async with running(tmp_path, config) as (d, _):
        await d.create([gpu_node("n1", 2, 16000)])
        pods = [gpu_pod(f"p{i}", {"nvidia.com/vgpu-memory": 1000}) for i in range(4)]
        await d.create(pods)
        await d.fault(verb="create", resource="pods/binding", latency=0.4)
        t0 = anyio.current_time()
        got: list[Any] = []

        async def one(p: dict[str, Any]) -> None:
            got.append(await d.schedule(p, ["n1"]))

        async with anyio.create_task_group() as tg:
            for p in pods:
                tg.start_soon(one, p)
        took = anyio.current_time() - t0
        assert [o.node for o in got] == ["n1"] * 4
        together = await d.peak("create", "pods/binding")
        if gate:
            assert together == 1 and took >= 1.6, (together, took)
        else:
            assert together > 1
