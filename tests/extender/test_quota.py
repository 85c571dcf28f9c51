"""The vGPU quota through ``vgpud scheduler`` over the API stand-in: a ResourceQuota of
9,000 MiB of vGPU memory admits ``2 x 3000`` and ``1 x 3000`` and refuses the next
``1 x 1000`` at filter with the quota's reason (Kubernetes' own quota would count
3,000 + 3,000 + 1,000: it sums what pods declare per vGPU). A changed quota counts
without a restart; a value that is not a quantity is shown, not enforced, never a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from tests import builders
from tests.builders import node
from tests.e2e.cluster import free_port
from tests.standin import ApiServer
from vgpud.config import parse_settings
from vgpud.core.allocate import Allocator
from vgpud.core.codec import NODE_DEVICES, encode_node_devices
from vgpud.core.model import Defaults
from vgpud.core.quota import quota_keys, read_quota
from vgpud.core.requests import parse_pod
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.run import run_scheduler
from vgpud.extender.wire import BindingArgs, ExtenderArgs
from vgpud.kube.cache import Added
from vgpud.scheduling.state import SchedulerState

pytestmark = pytest.mark.anyio

NS = "team"
MEMORY = "requests.nvidia.com/vgpu-memory"


def gpu_pod(name: str, number: int, memory: int, percent: int | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/vgpu-number": str(number)}
    if percent is None:
        limits["nvidia.com/vgpu-memory"] = str(memory)
    else:
        limits["nvidia.com/vgpu-memory-percentage"] = str(percent)
    return builders.gpu_pod(name, limits, namespace=NS, annotations=None, phase="Pending")


def quota(hard: dict[str, Any], name: str = "gpu") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": NS}, "spec": {"hard": hard}}


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer() as server:
        yield server


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with s.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        doc: dict[str, Any] = await r.json()
        return doc


async def schedule(s: aiohttp.ClientSession, url: str, pod: dict[str, Any]) -> dict[str, Any]:
    """kube-scheduler's calls for one pod on n1: filter, then bind when n1 passed."""
    got = await post(s, f"{url}/filter", {"Pod": pod, "NodeNames": ["n1"]})
    if got.get("NodeNames") == ["n1"]:
        with anyio.fail_after(10):
            while True:  # the informer must have seen the pod for bind to find it
                bound = await post(s, f"{url}/bind", {
                    "PodName": pod["metadata"]["name"], "PodNamespace": NS,
                    "PodUID": pod["metadata"]["uid"], "Node": "n1"})
                if "not found" not in bound.get("Error", ""):
                    break
                await anyio.sleep(0.02)
        assert bound.get("Error", "") == "", bound
    return got


async def test_the_quota_counts_what_pods_really_take_on_the_standin(
        api: ApiServer, tmp_path: Path) -> None:
    n1 = node("n1", 4, 40000)
    api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "n1", "annotations": {NODE_DEVICES: encode_node_devices(n1.inventory)}}})
    api.create("resourcequotas", quota({MEMORY: "9000"}), NS)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_scheduler(parse_settings({}), kubeconfig=str(kubeconfig),
                                            listen=f"127.0.0.1:{port}"))

        async def ready() -> bool:
            try:
                async with s.get(f"{url}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        with anyio.fail_after(20):
            while not await ready():  # noqa: ASYNC110
                await anyio.sleep(0.02)

        for name, number, memory in (("a", 2, 3000), ("b", 1, 3000)):
            got = await schedule(s, url, api.create("pods", gpu_pod(name, number, memory), NS))
            assert got["NodeNames"] == ["n1"], got
        c = api.create("pods", gpu_pod("c", 1, 1000), NS)
        got = await schedule(s, url, c)
        assert got["NodeNames"] == []
        reason = got["FailedAndUnresolvableNodes"]["n1"]
        assert reason == (f"namespace {NS} quota gpu: {MEMORY} is 9000 MiB of vGPU memory in "
                          "all; its pods take 9000 and this pod would take 1000 more (counted "
                          "per vGPU, as vgpud grants it)")

        async def rows() -> list[dict[str, Any]]:
            async with s.get(f"{url}/api/v1/quotas") as r:
                assert r.status == 200
                items: list[dict[str, Any]] = (await r.json())["items"]
                return items

        assert await rows() == [{"namespace": NS, "quota": "gpu", "key": MEMORY,
                                 "resource": "memory", "unit": "MiB", "hard": 9000,
                                 "used": 9000}]
        async with s.get(f"{url}/") as r:  # the status page shows use against the quota
            page = await r.text()
        assert 'id="quotas"' in page and "9,000 / 9,000 MiB" in page
        async with s.get(f"{url}/api/v1/pods", params={"state": "pending"}) as r:
            pending = (await r.json())["items"]
        assert [p["reason"] for p in pending] == [reason]

        # A raised quota counts at the next filter: no restart.
        api.patch("resourcequotas", "gpu", {"spec": {"hard": {MEMORY: "10000"}}},
                  namespace=NS)

        async def admits_c() -> bool:
            return (await post(s, f"{url}/filter", {"Pod": c, "NodeNames": ["n1"]})
                    ).get("NodeNames") == ["n1"]

        with anyio.fail_after(10):
            while not await admits_c():  # noqa: ASYNC110
                await anyio.sleep(0.02)

        # A value that is not a quantity: shown with its reason, the limit not enforced.
        api.create("resourcequotas", quota({"nvidia.com/vgpu-cores": "lots"}, "typo"), NS)

        async def shows_typo() -> bool:
            return any(r.get("quota") == "typo" for r in await rows())

        with anyio.fail_after(10):
            while not await shows_typo():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        typo = [r for r in await rows() if r["quota"] == "typo"]
        assert "'lots' is not a quantity (this limit is not enforced)" in typo[0]["error"]
        assert await admits_c()
        tg.cancel_scope.cancel()


async def test_a_memory_share_is_counted_as_resolved_on_each_node() -> None:
    """50 % of a 40,000 MiB GPU takes 20,000 MiB; of an 8,000 MiB GPU, 4,000: under a
    10,000 MiB quota only the small node passes."""
    alloc = Allocator()
    alloc.set_node(node("big", 1, 40000))
    alloc.set_node(node("small", 1, 8000))
    state = SchedulerState(alloc)
    state.on_quota(Added(f"{NS}/gpu", read_quota(quota({MEMORY: "10000"}),
                                                 quota_keys(Defaults()))))
    ext = Extender(state, writer=None, events=None, metrics=Metrics(alloc))
    manifest = gpu_pod("share", 1, 0, percent=50)
    manifest["metadata"]["uid"] = "uid-share"
    got = await ext.filter(ExtenderArgs(manifest, ("big", "small"), None))
    assert got["NodeNames"] == ["small"]
    assert "would take 20000 more" in got["FailedAndUnresolvableNodes"]["big"]
    assert parse_pod(manifest, Defaults()).namespace == NS


async def test_bind_checks_the_quota_with_the_ledger_it_assumes_into() -> None:
    """Two pods filtered before either bound: the second bind finds the first assumed."""
    alloc = Allocator()
    alloc.set_node(node("n1", 4, 40000))
    state = SchedulerState(alloc)
    state.on_quota(Added(f"{NS}/gpu", read_quota(quota({MEMORY: "9000"}),
                                                 quota_keys(Defaults()))))

    class Binder:
        async def bind(self, *args: Any, **kw: Any) -> None:
            return None

    ext = Extender(state, writer=Binder(), events=None,  # type: ignore[arg-type]
                   metrics=Metrics(alloc))
    pods = []
    for name in ("a", "b"):
        manifest = gpu_pod(name, 2, 3000)
        manifest["metadata"]["uid"] = f"uid-{name}"
        pods.append(manifest)
        got = await ext.filter(ExtenderArgs(manifest, ("n1",), None))
        assert got["NodeNames"] == ["n1"]
    first = await ext.bind(BindingArgs("a", NS, "uid-a", "n1"))
    assert first == {"Error": ""}
    second = await ext.bind(BindingArgs("b", NS, "uid-b", "n1"))
    assert "quota gpu" in second["Error"] and "take 6000" in second["Error"]
