"""The ``Reschedule`` controller end to end: ``vgpud scheduler`` as a process against the
API stand-in over HTTP, the driver playing kube-scheduler, and a small ReplicaSet
controller below playing kube-controller-manager. The tests play kubelet by writing
the pod statuses it would write when it refuses a pod."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
import pytest

from tests.builders import gpu_node, gpu_pod
from tests.e2e.cluster import (
    Driver,
    Scheduler,
    held_by_annotations,
    ledger_from_metrics,
    overcommitted,
    standin,
)
from vgpud.core.codec import (
    ASSIGNMENT,
    NODE_DEVICES,
    decode_assignment,
    decode_node_devices,
    encode_node_devices,
)
from vgpud.core.model import NodeInventory, Placement
from vgpud.scheduling.reschedule import ATTEMPTS, RESCHEDULED_FROM

pytestmark = pytest.mark.anyio

T = TypeVar("T")
MERGE = {"Content-Type": "application/merge-patch+json"}
WHOLE_GPU = {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 16000}
ADMISSION = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
             "message": "Pod was rejected: Allocate failed due to requested number of devices "
                        "unavailable for nvidia.com/vgpu-number"}
PRESTART = {"phase": "Pending", "containerStatuses": [{
    "name": "main", "ready": False, "restartCount": 0, "image": "cuda", "imageID": "",
    "state": {"waiting": {"reason": "CreateContainerConfigError",
                          "message": "device plugin PreStartContainer rpc failed with err: "
                                     "no vgpud assignment for these devices"}}}]}


# -- a ReplicaSet controller, as kube-controller-manager would run one ----------------------


class ReplicaSets:
    """Keeps ``spec.replicas`` pods for every ReplicaSet in the stand-in, from its
    template, owned by it. Like the real one for Pending pods; unlike it, a Failed pod
    still counts, so a replacement appears only once the pod is deleted (the real one
    replaces a Failed pod at once, which would hide whether the scheduler deleted it)."""

    def __init__(self, session: aiohttp.ClientSession, api: str) -> None:
        self.s = session
        self.api = api
        self.created: dict[str, list[str]] = {}  # RS name -> pod names, in order

    async def _get(self, path: str) -> list[dict[str, Any]]:
        async with self.s.get(self.api + path) as r:
            assert r.status == 200, await r.text()
            return list((await r.json())["items"])

    async def reconcile(self) -> None:
        pods = await self._get("/api/v1/pods")
        for rs in await self._get("/apis/apps/v1/replicasets"):
            meta = rs["metadata"]
            owned = [p for p in pods if any(o.get("uid") == meta["uid"] for o in
                                            p["metadata"].get("ownerReferences") or [])]
            for _ in range(rs["spec"]["replicas"] - len(owned)):
                template = rs["spec"]["template"]
                body = {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {**template["metadata"], "generateName": meta["name"] + "-",
                                     "ownerReferences": [{
                                         "apiVersion": "apps/v1", "kind": "ReplicaSet",
                                         "name": meta["name"], "uid": meta["uid"],
                                         "controller": True, "blockOwnerDeletion": True}]},
                        "spec": template["spec"]}
                async with self.s.post(f"{self.api}/api/v1/namespaces/{meta['namespace']}/pods",
                                       json=body) as r:
                    assert r.status == 201, await r.text()
                    self.created.setdefault(meta["name"], []).append(
                        (await r.json())["metadata"]["name"])

    async def run(self) -> None:
        while True:
            await self.reconcile()
            await anyio.sleep(0.02)  # a controller's resync period


def replicaset(name: str, limits: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    pod = gpu_pod(name, limits)
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}}


# -- the cluster -------------------------------------------------------------------------------


class Env:
    def __init__(self, driver: Driver, sched: Scheduler, rs: ReplicaSets) -> None:
        self.d = driver
        self.sched = sched
        self.rs = rs

    async def until(self, what: str, probe: Callable[[], Awaitable[T | None]],
                    within: float = 10.0) -> T:
        """Poll ``probe`` until it returns something (another process's state: nothing
        to wait on but the API)."""
        deadline = time.monotonic() + within
        while True:
            got = await probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.sched.log()[-4000:]}")
            await anyio.sleep(0.02)

    async def pod(self, name: str) -> dict[str, Any] | None:
        async with self.d.s.get(f"{self.d.api}/api/v1/namespaces/default/pods/{name}") as r:
            return dict(await r.json()) if r.status == 200 else None

    async def set_status(self, name: str, status: dict[str, Any]) -> None:
        """What kubelet writes when it refuses the pod."""
        async with self.d.s.patch(f"{self.d.api}/api/v1/namespaces/default/pods/{name}/status",
                                  data=json.dumps({"status": status}), headers=MERGE) as r:
            assert r.status == 200, await r.text()

    async def events(self, reason: str, uid: str | None = None) -> list[dict[str, Any]]:
        async with self.d.s.get(f"{self.d.api}/api/v1/namespaces/default/events") as r:
            items = (await r.json())["items"]
        return [e for e in items if e["reason"] == reason
                and (uid is None or e["involvedObject"].get("uid") == uid)]

    async def gone(self, pod: dict[str, Any]) -> bool:
        now = await self.pod(pod["metadata"]["name"])
        return now is None or now["metadata"]["uid"] != pod["metadata"]["uid"]

    async def rescheduled(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Wait until the scheduler deleted ``pod`` and said so; the event."""
        await self.until(f"{pod['metadata']['name']} deleted", lambda: self.gone(pod))
        (event,) = await self.until(
            "the Rescheduled event", lambda: self.events("Rescheduled", pod["metadata"]["uid"]))
        assert event["type"] == "Warning"
        return event

    async def next_pod(self, rs: str, n: int) -> dict[str, Any]:
        """The ``n``-th pod (from 1) the ReplicaSet controller made for ``rs``."""
        async def probe() -> dict[str, Any] | None:
            names = self.rs.created.get(rs, [])
            return await self.pod(names[n - 1]) if len(names) >= n else None
        return await self.until(f"pod {n} of {rs}", probe)

    async def place(self, pod: dict[str, Any], nodes: list[str]) -> str:
        out = await self.d.schedule(pod, nodes)
        assert out.node, out.reason
        return out.node


@pytest.fixture
async def env(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    config = getattr(request, "param", {})
    with standin(tmp_path) as (url, kubeconfig):
        sched = Scheduler(kubeconfig, tmp_path, config=config)
        sched.start()
        try:
            async with aiohttp.ClientSession() as s, anyio.create_task_group() as tg:
                rs = ReplicaSets(s, url)
                tg.start_soon(rs.run)
                await sched.wait_ready()
                yield Env(Driver(s, url, sched.url), sched, rs)
                tg.cancel_scope.cancel()
        finally:
            sched.stop()


async def setup(env: Env, nodes: list[dict[str, Any]], sets: list[dict[str, Any]]) -> None:
    await env.d.create(nodes + sets)
    # the scheduler's node cache has them once a filter can place on them
    names = [n["metadata"]["name"] for n in nodes]

    async def known() -> bool:
        probe = gpu_pod("probe", {"nvidia.com/vgpu-number": 1})
        probe["metadata"]["uid"] = "probe"
        async with env.d.s.post(f"{env.sched.url}/filter",
                                json={"Pod": probe, "NodeNames": names}) as r:
            return len((await r.json())["NodeNames"] or []) == len(names)
    await env.until("the nodes in the scheduler's cache", known)


# -- the scenarios -----------------------------------------------------------------------------


async def test_admission_failure_is_deleted_and_placed_again_by_its_replicaset(env: Env) -> None:
    await setup(env, [gpu_node("n1", 1, 16384, split=1)], [replicaset("web", WHOLE_GPU)])
    first = await env.next_pod("web", 1)
    assert await env.place(first, ["n1"]) == "n1"
    first = await env.pod(first["metadata"]["name"]) or {}
    assert ASSIGNMENT in first["metadata"]["annotations"]
    await env.set_status(first["metadata"]["name"], ADMISSION)

    event = await env.rescheduled(first)
    assert "ReplicaSet/web" in event["message"] and "UnexpectedAdmissionError" in event["message"]
    assert "attempt 1 of 3" in event["message"]
    second = await env.next_pod("web", 2)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert await env.place(second, ["n1"]) == "n1"  # the only room there was: freed
    pods = await env.d.pods()
    assert [p["metadata"]["name"] for p in pods] == [second["metadata"]["name"]]
    assert overcommitted(pods, await env.d.nodes()) == []
    ledger = await ledger_from_metrics(env.d.s, env.sched.url)
    assert {k: v for k, v in ledger.items() if v} == {
        k: v[0] for k, v in held_by_annotations(pods).items()}


async def test_prestart_failure_and_a_gpu_gone_are_rescheduled(env: Env) -> None:
    await setup(env, [gpu_node("n1", 2, 16384, split=1)],
                [replicaset("a", WHOLE_GPU), replicaset("b", WHOLE_GPU)])
    a1, b1 = await env.next_pod("a", 1), await env.next_pod("b", 1)
    await env.place(a1, ["n1"])
    await env.place(b1, ["n1"])
    # a: kubelet admitted it, but the plugin's PreStartContainer failed; it holds its GPU
    await env.set_status(a1["metadata"]["name"], PRESTART)
    event = await env.rescheduled(a1)
    assert "PreStartContainer rpc failed" in event["message"]
    a2 = await env.next_pod("a", 2)
    assert await env.place(a2, ["n1"]) == "n1"  # the deleted pod's GPU was released
    # b: still Pending when the node's plugin stops reporting the GPU it was given
    b1 = await env.pod(b1["metadata"]["name"]) or {}
    a2 = await env.pod(a2["metadata"]["name"]) or {}
    (gone,) = {d.uuid for c in _assignment(b1).containers for d in c.devices}
    (kept,) = {d.uuid for c in _assignment(a2).containers for d in c.devices}
    node = (await env.d.nodes())[0]
    inv = decode_node_devices(node["metadata"]["annotations"][NODE_DEVICES])
    smaller = NodeInventory(tuple(g for g in inv.devices if g.uuid != gone),
                            inv.memory_scaling, inv.core_scaling)
    async with env.d.s.patch(f"{env.d.api}/api/v1/nodes/n1", headers=MERGE, data=json.dumps(
            {"metadata": {"annotations": {NODE_DEVICES: encode_node_devices(smaller)}}})) as r:
        assert r.status == 200
    event = await env.rescheduled(b1)
    assert f"GPU {gone} is no longer reported by node n1" in event["message"]
    assert kept != gone
    a2_now = await env.pod(a2["metadata"]["name"])
    assert a2_now is not None and a2_now["metadata"]["uid"] == a2["metadata"]["uid"]  # kept
    b2 = await env.next_pod("b", 2)
    assert (await env.d.schedule(b2, ["n1"])).node is None  # no GPU left for it


async def test_a_bare_pod_is_left_alone_by_default(env: Env) -> None:
    await setup(env, [gpu_node("n1", 2, 16384, split=1)],
                [gpu_pod("solo", WHOLE_GPU), replicaset("guard", WHOLE_GPU)])
    solo = await env.pod("solo") or {}
    guard = await env.next_pod("guard", 1)
    await env.place(solo, ["n1"])
    await env.place(guard, ["n1"])
    await env.set_status("solo", ADMISSION)
    await env.set_status(guard["metadata"]["name"], ADMISSION)
    # the controller takes pods in the order they failed: once the guard is rescheduled,
    # the bare pod has been decided too
    await env.rescheduled(guard)
    still = await env.pod("solo")
    assert still is not None and still["metadata"]["uid"] == solo["metadata"]["uid"]
    assert still["status"]["reason"] == "UnexpectedAdmissionError"
    assert await env.events("Rescheduled", solo["metadata"]["uid"]) == []
    guard2 = await env.next_pod("guard", 2)  # before listing: the controller makes it
    assert {p["metadata"]["name"] for p in await env.d.pods()} == {  # on its own time
        "solo", guard2["metadata"]["name"]}


@pytest.mark.parametrize("env", [{"scheduler": {"rescheduleBarePods": True}}], indirect=True)
async def test_a_bare_pod_is_recreated_under_a_new_name_when_enabled(env: Env) -> None:
    await setup(env, [gpu_node("n1", 1, 16384, split=1)],
                [gpu_pod("solo", WHOLE_GPU, annotations={"team": "ml"})])
    old = await env.pod("solo") or {}
    for n in (1, 2):
        await env.place(old, ["n1"])
        await env.set_status(old["metadata"]["name"], ADMISSION)
        event = await env.rescheduled(old)
        assert f"Recreated as solo-r{n} (attempt {n} of 3)" in event["message"]
        new = await env.pod(f"solo-r{n}")
        assert new is not None
        ann = new["metadata"]["annotations"]
        assert not new["spec"].get("nodeName") and ASSIGNMENT not in ann
        assert ann[ATTEMPTS] == str(n) and ann[RESCHEDULED_FROM] == old["metadata"]["uid"]
        assert ann["team"] == "ml" and new["spec"]["containers"] == old["spec"]["containers"]
        assert new["status"]["phase"] == "Pending"
        old = new
    assert [p["metadata"]["name"] for p in await env.d.pods()] == ["solo-r2"]
    assert await env.place(old, ["n1"]) == "n1"


@pytest.mark.parametrize("env", [{"scheduler": {"rescheduleMaxAttempts": 2}}], indirect=True)
async def test_a_pod_failing_forever_stops_after_max_attempts(env: Env) -> None:
    await setup(env, [gpu_node("n1", 2, 16384, split=1)],
                [replicaset("doomed", WHOLE_GPU), replicaset("canary", WHOLE_GPU)])
    pods = []
    for n in (1, 2, 3):
        pod = await env.next_pod("doomed", n)
        await env.place(pod, ["n1"])
        await env.set_status(pod["metadata"]["name"], ADMISSION)
        pods.append(pod)
        if n < 3:
            event = await env.rescheduled(pod)
            assert f"attempt {n} of 2" in event["message"]
    last = pods[-1]
    (gave_up,) = await env.until("RescheduleGaveUp", lambda: env.events(
        "RescheduleGaveUp", last["metadata"]["uid"]))
    assert gave_up["type"] == "Warning" and "rescheduled 2 times" in gave_up["message"]
    assert "UnexpectedAdmissionError" in gave_up["message"]
    # kubelet writes the status again; then another owner's pod fails, and is rescheduled:
    # the doomed pod was looked at again before it, and left alone
    await env.set_status(last["metadata"]["name"], {**ADMISSION, "message": "again"})
    canary = await env.next_pod("canary", 1)
    await env.place(canary, ["n1"])
    await env.set_status(canary["metadata"]["name"], ADMISSION)
    await env.rescheduled(canary)
    assert not await env.gone(last)
    assert len(env.rs.created["doomed"]) == 3
    (again,) = await env.events("RescheduleGaveUp", last["metadata"]["uid"])
    assert again.get("count", 1) == 1
    async with env.d.s.get(f"{env.sched.url}/metrics") as r:
        text = await r.text()
    # two deletions of the doomed lineage and one of the canary; one surrender
    assert 'vgpud_scheduler_reschedules_total{action="deleted"} 3.0' in text
    assert 'vgpud_scheduler_reschedules_total{action="gave_up"} 1.0' in text


def _assignment(pod: dict[str, Any]) -> Placement:
    return decode_assignment(pod["metadata"]["annotations"][ASSIGNMENT])
