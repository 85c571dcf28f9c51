"""PodWriter, PodBinder and EventRecorder against the stand-in."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_pod
from tests.kube.clocks import JumpClock
from tests.standin import ApiServer
from vgpud.kube import errors
from vgpud.kube.client import KubeClient
from vgpud.kube.writes import EventRecorder, ObjectRef, PodBinder, PodWriter, RetryPolicy

pytestmark = pytest.mark.anyio

ASSIGNMENT = "vgpud.io/assignment"


def _pod(name: str) -> dict[str, Any]:
    return gpu_pod(name, annotations=None, scheduler=None, image="busybox", typed=False)


@pytest.fixture
def clock() -> JumpClock:
    return JumpClock()


@pytest.fixture
def writer(kube: KubeClient, clock: JumpClock) -> PodBinder:
    return PodBinder(kube, retry=RetryPolicy(attempts=4, jitter=0), clock=clock)


@pytest.fixture
def patcher(kube: KubeClient, clock: JumpClock) -> PodWriter:
    return PodWriter(kube, retry=RetryPolicy(attempts=4, jitter=0), clock=clock)


async def test_patch_with_fresh_resource_version(api: ApiServer, patcher: PodWriter) -> None:
    pod = api.create("pods", _pod("p"))
    patched = await patcher.patch_annotations(
        "default", "p", {ASSIGNMENT: '{"v":1}'}, resource_version=pod["metadata"]["resourceVersion"]
    )
    assert patched["metadata"]["annotations"] == {ASSIGNMENT: '{"v":1}'}
    assert api.count("patch", "pods") == 1 and api.count("get", "pods") == 0


async def test_stale_resource_version_conflicts_then_retries(
    api: ApiServer, patcher: PodWriter
) -> None:
    pod = api.create("pods", _pod("p"))
    stale = pod["metadata"]["resourceVersion"]
    api.patch("pods", "p", {"metadata": {"labels": {"touched": "yes"}}})
    patched = await patcher.patch_annotations(
        "default", "p", {ASSIGNMENT: "x"}, resource_version=stale, uid=pod["metadata"]["uid"]
    )
    assert patched["metadata"]["annotations"] == {ASSIGNMENT: "x"}
    assert patched["metadata"]["labels"] == {"touched": "yes"}
    assert api.count("patch", "pods") == 2  # 409, then success
    assert api.count("get", "pods") == 1  # the re-read


async def test_conflict_on_a_replaced_or_bound_pod_is_not_retried(
    api: ApiServer, patcher: PodWriter
) -> None:
    pod = api.create("pods", _pod("p"))
    rv, uid = pod["metadata"]["resourceVersion"], pod["metadata"]["uid"]
    api.delete("pods", "p")
    api.create("pods", _pod("p"))
    with pytest.raises(errors.Conflict, match="replaced"):
        await patcher.patch_annotations(
            "default", "p", {ASSIGNMENT: "x"}, resource_version=rv, uid=uid
        )
    fresh = api.get("pods", "p")
    api.patch("pods", "p", {"spec": {"nodeName": "elsewhere"}})
    with pytest.raises(errors.Conflict, match="no longer applies"):
        await patcher.patch_annotations(
            "default", "p", {ASSIGNMENT: "x"}, resource_version=fresh["metadata"]["resourceVersion"]
        )
    assert ASSIGNMENT not in (api.get("pods", "p")["metadata"].get("annotations") or {})
    with pytest.raises(errors.NotFound):
        await patcher.patch_annotations("default", "absent", {ASSIGNMENT: "x"},
                                        resource_version="1")


async def test_server_errors_are_retried_with_backoff(
    api: ApiServer, patcher: PodWriter, clock: JumpClock
) -> None:
    pod = api.create("pods", _pod("p"))
    api.fail("patch", "pods", 500, times=2)
    await patcher.patch_annotations(
        "default", "p", {ASSIGNMENT: "x"}, resource_version=pod["metadata"]["resourceVersion"]
    )
    assert api.count("patch", "pods") == 3
    assert clock.sleeps == [pytest.approx(0.05), pytest.approx(0.1)]
    api.fail("patch", "pods", 500)  # forever: gives up after the policy's attempts
    with pytest.raises(errors.ServerError):
        await patcher.patch_annotations("default", "p", {ASSIGNMENT: "y"}, resource_version="")
    assert api.count("patch", "pods") == 3 + 4


async def test_throttling_honours_retry_after(
    api: ApiServer, writer: PodBinder, clock: JumpClock
) -> None:
    api.create("pods", _pod("p"))
    api.fail("create", "pods/binding", 429, times=1, retry_after=2)
    await writer.bind("default", "p", "n1")
    assert clock.sleeps == [pytest.approx(2.0)]
    assert api.get("pods", "p")["spec"]["nodeName"] == "n1"


async def test_bind_avoids_the_client_binding_bug(api: ApiServer, writer: PodBinder) -> None:
    pod = api.create("pods", _pod("p"))
    await writer.bind("default", "p", "gpu-node-1", uid=pod["metadata"]["uid"])
    assert api.get("pods", "p")["spec"]["nodeName"] == "gpu-node-1"
    assert api.count("create", "pods/binding") == 1
    with pytest.raises(errors.Conflict, match="already assigned"):
        await writer.bind("default", "p", "gpu-node-2")
    api.create("pods", _pod("q"))
    with pytest.raises(errors.Conflict, match="UID"):
        await writer.bind("default", "q", "n1", uid="not-the-uid")
    with pytest.raises(errors.NotFound):
        await writer.bind("default", "absent", "n1")


async def test_a_binding_puts_its_annotations_on_the_pod_in_the_same_update(
    api: ApiServer, writer: PodBinder
) -> None:
    pod = _pod("p")
    pod["metadata"]["annotations"] = {"keep": "me", "vgpud.io/assignment": "stale"}
    uid = api.create("pods", pod)["metadata"]["uid"]
    rv = int(api.get("pods", "p")["metadata"]["resourceVersion"])
    await writer.bind("default", "p", "n1", uid=uid,
                      annotations={"vgpud.io/assignment": '{"v":1}'})
    got = api.get("pods", "p")
    assert got["spec"]["nodeName"] == "n1"
    assert got["metadata"]["annotations"] == {"keep": "me", "vgpud.io/assignment": '{"v":1}'}
    assert int(got["metadata"]["resourceVersion"]) == rv + 1  # one update, not two
    assert api.count("create", "pods/binding") == 1 and api.count("patch", "pods") == 0
    # a pod being deleted is not bound (kube-apiserver: "is being deleted"); a finalizer
    # keeps the unbound pod from going at once
    doomed = _pod("q")
    doomed["metadata"]["finalizers"] = ["example.com/hold"]
    api.create("pods", doomed)
    await writer.kube.request("DELETE", "/api/v1/namespaces/default/pods/q")
    assert api.get("pods", "q")["metadata"]["deletionTimestamp"]
    with pytest.raises(errors.Conflict, match="being deleted"):
        await writer.bind("default", "q", "n1", annotations={"a": "b"})
    assert "a" not in (api.get("pods", "q")["metadata"].get("annotations") or {})


async def test_bind_whose_answer_was_lost_is_confirmed_by_reading(
    api: ApiServer, writer: PodBinder
) -> None:
    api.create("pods", _pod("p"))
    api.fail("create", "pods/binding", 500, times=1, after=True)  # bound, answer lost
    await writer.bind("default", "p", "n1")  # the retry gets 409, the re-read says n1
    assert api.count("create", "pods/binding") == 2 and api.count("get", "pods") == 1
    # A retry that finds the pod bound elsewhere is a real conflict.
    api.create("pods", _pod("q"))
    api.patch("pods", "q", {"spec": {"nodeName": "other"}})
    api.fail("create", "pods/binding", 500, times=1)
    with pytest.raises(errors.Conflict, match="already assigned"):
        await writer.bind("default", "q", "n2")
    assert api.count("get", "pods") == 2


async def test_events_are_aggregated(api: ApiServer, kube: KubeClient, clock: JumpClock) -> None:
    pod = api.create("pods", _pod("p"))
    recorder = EventRecorder(kube, component="vgpu-scheduler", min_interval=10, clock=clock)
    ref = ObjectRef.of(pod)
    for _ in range(100):
        await recorder.record(ref, "FailedScheduling", "no GPU fits", type="Warning")
    await recorder.record(ref, "Scheduled", "bound to n1")
    assert api.count("create", "events") == 2 and api.count("patch", "events") == 0
    await recorder.flush()
    events = {e["reason"]: e for e in api.objects("events")}
    assert events["FailedScheduling"]["count"] == 100
    assert events["FailedScheduling"]["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert events["FailedScheduling"]["type"] == "Warning"
    assert events["Scheduled"]["count"] == 1
    assert recorder.aggregated == 99
    clock.advance(11)  # past min_interval: the next repeat writes at once
    await recorder.record(ref, "FailedScheduling", "no GPU fits", type="Warning")
    assert api.count("patch", "events") == 2
    assert {e["reason"]: e for e in api.objects("events")}["FailedScheduling"]["count"] == 101


async def test_event_storm_is_capped_and_failures_do_not_raise(
    api: ApiServer, kube: KubeClient, clock: JumpClock
) -> None:
    recorder = EventRecorder(kube, max_per_second=5, clock=clock)
    ref = ObjectRef(kind="Node", name="n1")
    for i in range(50):
        await recorder.record(ref, "DeviceUnhealthy", f"gpu {i} failed")
    assert recorder.created == 5 and recorder.dropped == 45
    assert len(api.objects("events")) == 5
    clock.advance(10)
    api.fail("create", "events", 500)
    await recorder.record(ref, "DeviceUnhealthy", "late")  # logged, not raised
    assert recorder.failed == 1
