"""The reschedule controller's decisions, without I/O: which pods, and what to do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from tests.builders import node
from tests.kube.clocks import JumpClock
from tests.standin import ApiServer
from vgpud.core.cluster import Cluster
from vgpud.core.codec import ASSIGNMENT, encode_assignment
from vgpud.core.model import ContainerGrant, DeviceGrant, Gpu, Node, NodeInventory, Placement
from vgpud.kube.cache import Added
from vgpud.kube.client import KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import KubeError
from vgpud.kube.writes import EventRecorder, RetryPolicy
from vgpud.scheduling.projections import PodInfo, project_pod
from vgpud.scheduling.reschedule import (
    ATTEMPTS,
    BURST,
    RESCHEDULED_FROM,
    Copy,
    Delete,
    GiveUp,
    Leave,
    Planner,
    Recreate,
    attempts_of,
    gpu_problem,
    reason_to_reschedule,
    replacement,
    replacement_name,
)
from vgpud.scheduling.rescheduler import Rescheduler

ADMISSION = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
             "message": "Allocate failed due to no healthy devices present"}
PRESTART = {"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {
    "reason": "CreateContainerConfigError",
    "message": "device plugin PreStartContainer rpc failed with err: no assignment"}}}]}


def raw_pod(name: str = "p", *, uid: str | None = None, owner: str | None = None,
            status: dict[str, Any] | None = None, gpus: tuple[str, ...] = ("GPU-n1-0",),
            annotations: dict[str, str] | None = None, bound: bool = True) -> dict[str, Any]:
    placement = Placement("n1", (ContainerGrant("main", False, tuple(
        DeviceGrant(u, 1000, 10) for u in gpus)),))
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                            "labels": {"app": "x"},
                            "annotations": {ASSIGNMENT: encode_assignment(placement),
                                            "team": "ml", **(annotations or {})}}
    if owner:
        kind, _, oname = owner.partition("/")
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": oname,
                                    "uid": "owner-uid", "controller": True}]
    spec: dict[str, Any] = {"schedulerName": "vgpu-scheduler", "priority": 0,
                            "priorityClassName": "", "containers": [{"name": "main"}]}
    if bound:
        spec["nodeName"] = "n1"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status or {"phase": "Pending"}}


def info(name: str = "p", **kw: Any) -> PodInfo:
    return project_pod(raw_pod(name, **kw))


def fine(node: str, uuid: str) -> str | None:
    return None


# -- which pods -------------------------------------------------------------------------------


def test_kubelets_refusals_are_reasons() -> None:
    why = reason_to_reschedule(info(status=ADMISSION), fine)
    assert why is not None and "UnexpectedAdmissionError" in why
    why = reason_to_reschedule(info(status=PRESTART), fine)
    assert why is not None and "PreStartContainer" in why


@pytest.mark.parametrize("pod", [
    info(),                                              # pending, nothing wrong
    info(status={"phase": "Running"}),
    info(status={"phase": "Failed", "reason": "Evicted"}),
    info(status=ADMISSION, bound=False),                 # not bound
    project_pod({**raw_pod(status=ADMISSION), "metadata": {
        **raw_pod()["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    project_pod({**raw_pod(status=ADMISSION), "metadata": {"name": "p", "uid": "u"}}),
    project_pod({"metadata": {"name": "odd", "annotations": {ASSIGNMENT: "{"}},
                 "spec": {"nodeName": "n1"}, "status": ADMISSION}),
    project_pod({"status": {"containerStatuses": [None, {"state": None}]}}),
])
def test_other_pods_are_not(pod: PodInfo) -> None:
    assert reason_to_reschedule(pod, fine) is None
    if pod.phase != "Pending":
        assert reason_to_reschedule(pod, lambda n, u: "gone") is None


def test_a_gpu_gone_since_binding_is_a_reason_only_before_the_pod_runs() -> None:
    gone = {"GPU-n1-1"}

    def problem(node: str, uuid: str) -> str | None:
        return f"{uuid} gone" if uuid in gone else None

    assert reason_to_reschedule(info(gpus=("GPU-n1-0", "GPU-n1-1")), problem) == "GPU-n1-1 gone"
    assert reason_to_reschedule(info(gpus=("GPU-n1-0",)), problem) is None
    assert reason_to_reschedule(info(gpus=("GPU-n1-1",), status={"phase": "Running"}),
                                problem) is None
    assert reason_to_reschedule(info(gpus=("GPU-n1-1",), bound=False), problem) is None


def test_gpu_problem_reads_the_clusters_inventory() -> None:
    c = Cluster()
    c.set_node(node("n1", 2, healthy=(True, False)))
    assert gpu_problem(c, "n1", "GPU-n1-0") is None
    assert "unhealthy" in (gpu_problem(c, "n1", "GPU-n1-1") or "")
    assert "no longer reported" in (gpu_problem(c, "n1", "GPU-n1-7") or "")
    assert gpu_problem(c, "unknown", "GPU-n1-0") is None  # no inventory: nothing to compare
    c.set_node(Node("n1", NodeInventory((Gpu("GPU-n1-0", 0, "m", 1000),))))
    assert "no longer reported" in (gpu_problem(c, "n1", "GPU-n1-1") or "")


# -- what to do -------------------------------------------------------------------------------


def test_bare_pods_are_left_alone_unless_enabled() -> None:
    pod = info(status=ADMISSION)
    assert isinstance(Planner().plan(pod, "x", 0.0), Leave)
    assert Planner(bare_pods=True).plan(pod, "x", 0.0) == Recreate(pod, "x")
    static = info(status=ADMISSION, owner="Node/n1")
    assert isinstance(Planner(bare_pods=True).plan(static, "x", 0.0), Leave)


class Feed:
    """The shell's side: pod events in order, each with the next sequence number."""

    def __init__(self, planner: Planner) -> None:
        self.p = planner
        self.seq = 0

    def add(self, pod: PodInfo, now: float = 0.0) -> PodInfo:
        self.seq += 1
        self.p.added(pod, self.seq, now)
        return pod

    def fail(self, pod: PodInfo, now: float = 0.0) -> PodInfo:
        self.seq += 1
        self.p.failed(pod, self.seq, now)
        return pod

    def act(self, pod: PodInfo, now: float = 0.0) -> object:
        a = self.p.plan(pod, "why", now)
        assert a is not None
        assert self.p.plan(pod, "why", now) == a  # plan reads only
        self.p.record(a, now)
        assert self.p.plan(pod, "why", now) is None  # decided once
        return a


def rs(name: str, owner: str = "ReplicaSet/web") -> PodInfo:
    return info(name, owner=owner, status=ADMISSION)


@pytest.mark.parametrize("replaced_before_delete", [False, True])
def test_an_owned_lineage_gives_up_after_max_attempts(replaced_before_delete: bool) -> None:
    # A ReplicaSet replaces a Failed pod as soon as it sees it fail; our fake one (and a
    # Pending pod's owner) only once it is deleted. Either order is one lineage.
    f = Feed(Planner(max_attempts=2))
    pod = f.add(rs("web-0"))
    actions = []
    for i in range(1, 5):
        f.fail(pod, now=i)
        nxt = rs(f"web-{i}")
        if replaced_before_delete:
            f.add(nxt, now=i)
        actions.append(f.act(pod, now=i))
        if not replaced_before_delete:
            f.add(nxt, now=i)
        pod = nxt
    assert [type(a) for a in actions] == [Delete, Delete, GiveUp, GiveUp]
    assert [a.attempt for a in actions if isinstance(a, Delete)] == [1, 2]
    assert isinstance(actions[2], GiveUp) and actions[2].attempts == 2


def test_replicas_failing_together_are_separate_lineages() -> None:
    f = Feed(Planner(max_attempts=2))
    first = [f.add(rs(f"a{i}")) for i in range(5)]
    for pod in first:
        f.fail(pod)
    for pod in first:
        assert f.act(pod) == Delete(pod, "why", 1)
    second = [f.add(rs(f"b{i}")) for i in range(5)]  # the five replacements, then their
    for pod in second:                                # failures
        f.fail(pod)
    for pod in second:
        assert f.act(pod, 1.0) == Delete(pod, "why", 2)
    third = f.fail(f.add(rs("c0")))
    assert isinstance(f.p.plan(third, "x", 2.0), GiveUp)
    # another owner counts apart
    other = f.fail(f.add(rs("d0", owner="ReplicaSet/api")))
    assert f.p.plan(other, "x", 2.0) == Delete(other, "x", 1)


def test_a_pod_that_was_there_before_is_not_a_replacement() -> None:
    f = Feed(Planner(max_attempts=1))
    old, older = f.add(rs("old")), f.add(rs("older"))
    f.fail(old)
    f.act(old)                                   # attempt 1 of 1
    f.fail(older)                                # existed before old failed
    assert f.p.plan(older, "x", 0.0) == Delete(older, "x", 1)
    new = f.fail(f.add(rs("new")))
    assert isinstance(f.p.plan(new, "x", 0.0), GiveUp)


def test_counts_decay_and_are_bounded() -> None:
    f = Feed(Planner(max_attempts=1, decay=600.0, max_owners=2))
    w0 = f.fail(f.add(rs("w0")))
    assert f.act(w0) == Delete(w0, "why", 1)
    w1 = f.add(rs("w1"), now=10.0)
    f.fail(w1, now=599.0)
    assert isinstance(f.act(w1, 599.0), GiveUp)
    # a given-up owner stays given up while failures keep coming
    w2 = f.fail(f.add(rs("w2"), now=900.0), now=1000.0)
    assert isinstance(f.p.plan(w2, "x", 1000.0), GiveUp)
    w3 = f.fail(f.add(rs("w3"), now=1500.0), now=1500.0)
    assert f.p.plan(w3, "x", 1500.0) == GiveUp(w3, "x", 1)
    w4 = f.add(rs("w4"), now=2000.0)
    assert isinstance(f.p.plan(f.fail(w4, now=2000.0), "x", 2000.0), GiveUp)
    w5 = f.fail(f.add(rs("w5"), now=2700.0), now=2700.0)
    assert f.p.plan(w5, "x", 2700.0) == Delete(w5, "x", 1)  # 700 s quiet: a fresh start
    # at most max_owners owners are kept: the least recently failing one goes first
    for i in range(3):
        o = f.fail(f.add(rs(f"o{i}", owner=f"ReplicaSet/o{i}"), 4000.0), 4000.0)
        f.act(o, 4000.0)
    n2 = f.fail(f.add(rs("o2-next", owner="ReplicaSet/o2"), 4001.0), 4001.0)
    assert f.p.plan(n2, "x", 4001.0) == GiveUp(n2, "x", 1)
    n0 = f.fail(f.add(rs("o0-next", owner="ReplicaSet/o0"), 4001.0), 4001.0)
    assert f.p.plan(n0, "x", 4001.0) == Delete(n0, "x", 1)


def test_forget_lets_a_new_pod_with_an_old_uid_be_decided() -> None:
    p = Planner(bare_pods=True)
    pod = info(status=ADMISSION)
    a = p.plan(pod, "x", 0.0)
    assert a is not None
    p.record(a, 0.0)
    assert p.is_done(pod.uid) and p.plan(pod, "x", 0.0) is None
    p.forget(pod.uid)
    assert p.plan(pod, "x", 0.0) == Recreate(pod, "x")


# -- a bare pod's copy ---------------------------------------------------------------------


def test_the_copy_drops_the_binding_and_counts_its_attempt() -> None:
    raw = raw_pod("solo", status=ADMISSION)
    raw["metadata"].update(resourceVersion="7", creationTimestamp="t", finalizers=["f"])
    raw["spec"]["ephemeralContainers"] = [{"name": "debug"}]
    copy = replacement(raw, project_pod(raw), "why", max_attempts=3)
    assert isinstance(copy, Copy)
    assert copy.name == "solo-r1" and copy.attempt == 1
    meta, spec = copy.body["metadata"], copy.body["spec"]
    assert set(meta) == {"name", "namespace", "labels", "annotations"}
    assert meta["annotations"] == {"team": "ml", ATTEMPTS: "1", RESCHEDULED_FROM: "uid-solo"}
    assert meta["labels"] == {"app": "x"}
    assert "nodeName" not in spec and "priority" not in spec and "ephemeralContainers" not in spec
    assert spec["schedulerName"] == "vgpu-scheduler" and spec["containers"] == [{"name": "main"}]
    assert "status" not in copy.body
    assert raw["spec"]["nodeName"] == "n1"  # the old pod's dict is not changed


def test_the_lineage_ends_after_max_attempts() -> None:
    raw = raw_pod("solo-r2", status=ADMISSION, annotations={ATTEMPTS: "2"})
    copy = replacement(raw, project_pod(raw), "why", max_attempts=3)
    assert isinstance(copy, Copy) and copy.name == "solo-r3"
    assert copy.body["metadata"]["annotations"][ATTEMPTS] == "3"
    raw = raw_pod("solo-r3", status=ADMISSION, annotations={ATTEMPTS: "3"})
    end = replacement(raw, project_pod(raw), "why", max_attempts=3)
    assert isinstance(end, GiveUp) and end.attempts == 3


@pytest.mark.parametrize(("value", "n"), [("2", 2), ("-4", 0), ("many", 0), ("", 0)])
def test_attempts_annotation_is_read_defensively(value: str, n: int) -> None:
    assert attempts_of(raw_pod(annotations={ATTEMPTS: value})) == n
    assert attempts_of({"metadata": None}) == 0


def test_names_replace_our_suffix_and_stay_valid() -> None:
    assert replacement_name("worker", 1, ours=False) == "worker-r1"
    assert replacement_name("worker-r1", 2, ours=True) == "worker-r2"
    assert replacement_name("worker-r2", 1, ours=False) == "worker-r2-r1"  # not ours to strip
    long = "a" * 250 + "-b"
    got = replacement_name(long, 12, ours=False)
    assert len(got) == 253 and got.endswith("a-r12")
    got = replacement_name("a" * 248 + "-" + "b" * 4, 3, ours=False)
    assert len(got) <= 253 and not got[:-3].endswith("-")


# -- the shell, in process, against the stand-in ------------------------------------------


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer() as server:
        yield server


def make(api: ApiServer, kube: KubeClient, pods: list[dict[str, Any]], *,
         clock: Clock = SYSTEM_CLOCK, qps: float = 1.0,
         problem: Callable[[str, str], str | None] = fine,
         **kw: Any) -> tuple[Rescheduler, dict[str, PodInfo]]:
    """A Rescheduler whose pod cache is the given pods, created in the stand-in."""
    cache = {}
    for p in pods:
        created = api.create("pods", p)
        i = project_pod(created)
        cache[i.key] = i
    events = EventRecorder(kube, clock=clock)
    r = Rescheduler(kube, events=events, planner=Planner(max_attempts=3), pod_lookup=cache.get,
                    gpu_problem=problem, qps=qps, clock=clock, **kw)
    for key, i in cache.items():
        r.on_pod(Added(key, i))
    return r, cache


def created(name: str, **kw: Any) -> dict[str, Any]:
    raw = raw_pod(name, **kw)
    del raw["metadata"]["uid"]  # the stand-in gives one
    return raw


@pytest.mark.anyio
async def test_deletions_are_rate_limited(api: ApiServer) -> None:
    clock = JumpClock()
    async with KubeClient.for_url(api.url) as kube:
        r, cache = make(api, kube, [created(f"w{i}", owner="ReplicaSet/web", status=ADMISSION)
                                    for i in range(8)], clock=clock, qps=2.0)
        for key in list(cache):
            await r.handle(key)
    assert r.deleted == 8 and api.objects("pods") == []
    assert sum(clock.sleeps) == pytest.approx((8 - BURST) / 2.0)  # burst 5, then 2 per s
    reasons = [e["reason"] for e in api.objects("events")]
    assert reasons == ["Rescheduled"] * 8


@pytest.mark.anyio
async def test_api_errors_and_bugs_are_retried_not_fatal(api: ApiServer) -> None:
    def problem(node: str, uuid: str) -> str | None:
        raise RuntimeError("a bug")

    api.fail("delete", "pods", 500, times=3)
    async with KubeClient.for_url(api.url) as kube:
        r, _ = make(api, kube, [created("flaky", owner="ReplicaSet/web", status=ADMISSION),
                                    created("odd", owner="ReplicaSet/api")],  # Pending
                        problem=problem, retry=RetryPolicy(attempts=1),
                        max_backoff=0.02, tick=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(r.run)
            with anyio.fail_after(5):
                while api.objects("pods") != [api.get("pods", "odd")]:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert api.count("delete", "pods") == 4  # three 500s, then the delete
    assert r.deleted == 1


@pytest.mark.anyio
async def test_a_bare_copy_is_created_before_the_old_pod_goes(api: ApiServer) -> None:
    async with KubeClient.for_url(api.url) as kube:
        r, cache = make(api, kube, [created("solo", status=ADMISSION)],
                        retry=RetryPolicy(attempts=1))
        r.planner.bare_pods = True
        api.fail("delete", "pods", 500, times=1)
        with pytest.raises(KubeError):
            await r.handle("default/solo")
        assert {p["metadata"]["name"] for p in api.objects("pods")} == {"solo", "solo-r1"}
        api.clear_faults()
        await r.handle("default/solo")  # the copy exists already: it is ours, finish
    (copy,) = api.objects("pods")
    assert copy["metadata"]["name"] == "solo-r1" and r.recreated == 1
    assert copy["metadata"]["annotations"][RESCHEDULED_FROM] == cache["default/solo"].uid


@pytest.mark.anyio
async def test_a_stranger_with_the_copys_name_is_left_alone(api: ApiServer) -> None:
    async with KubeClient.for_url(api.url) as kube:
        r, _ = make(api, kube, [created("solo", status=ADMISSION)])
        r.planner.bare_pods = True
        api.create("pods", created("solo-r1"))
        await r.handle("default/solo")
    assert {p["metadata"]["name"] for p in api.objects("pods")} == {"solo", "solo-r1"}
    (event,) = api.objects("events")
    assert event["reason"] == "RescheduleGaveUp" and "solo-r1 already exists" in event["message"]
