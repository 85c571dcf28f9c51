"""The vGPU quota on the real control plane (issue 24, item 1): a namespace's
ResourceQuota of ``requests.nvidia.com/vgpu-memory: 9000``. Kubernetes' own quota
admission counts what pods declare per vGPU (3,000 + 3,000 + 1,000 = 7,000: it admits
all three); vgpud counts what they take (6,000 + 3,000 = 9,000), so the real
kube-scheduler's call to the extender's filter refuses the third pod with the quota's
reason, and it binds once room is made. The scheduler's ServiceAccount reads
ResourceQuotas and writes none (the conftest fails the test on any 403 to it)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.realkube.api import ApiError, Obj, wait_for
from tests.realkube.cluster import Scenario
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import NAMESPACE, Release

KEY = "requests.nvidia.com/vgpu-memory"


@pytest.fixture(autouse=True)
def _release(release: Release) -> Release:
    return release


def _quotas(release: Release) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{release.extender_ops}/api/v1/quotas",
                                timeout=10) as r:
        items: list[dict[str, Any]] = json.loads(r.read())["items"]
        return items


def _gpu(number: int, memory: int) -> dict[str, str]:
    return {"nvidia.com/vgpu-number": str(number), "nvidia.com/vgpu-memory": str(memory)}


def _quota_event(scenario: Scenario, name: str) -> str | None:
    for e in scenario.events(name):
        if e.get("reason") == "FailedScheduling" and "quota gpu" in str(e.get("message")):
            return str(e["message"])
    return None


def test_the_extender_refuses_past_the_quota_on_what_pods_really_take(
        scenario: Scenario, release: Release, control_plane: ControlPlane) -> None:
    scenario.gpu_node("a", gpus=4, memory=16384)
    admin = scenario.admin
    admin.create({"apiVersion": "v1", "kind": "ResourceQuota",
                  "metadata": {"name": "gpu", "namespace": scenario.ns},
                  "spec": {"hard": {KEY: "9000"}}})
    # No quota controller runs here: give the quota the status it would compute, which
    # kube-apiserver's quota admission needs before it admits pods it bounds.
    admin.patch("ResourceQuota", "gpu", {"status": {"hard": {KEY: "9000"},
                                                    "used": {KEY: "0"}}},
                scenario.ns, sub="status")
    wait_for("the extender to read the quota", lambda: [
        r for r in _quotas(release) if r["namespace"] == scenario.ns and r["hard"] == 9000],
        detail=release.tails)

    for name, number in (("two", 2), ("one", 1)):
        scenario.apply(scenario.pod(name, _gpu(number, 3000)))
        scenario.wait_bound(name, detail=lambda n=name: scenario.describe(n)  # type: ignore[misc]
                            + "\n" + release.tails())
    scenario.apply(scenario.pod("third", _gpu(1, 1000)))
    message = wait_for("kube-scheduler to record the extender's quota refusal",
                       lambda: _quota_event(scenario, "third"),
                       detail=lambda: scenario.describe("third") + "\n" + release.tails())
    assert (f"namespace {scenario.ns} quota gpu: {KEY} is 9000 MiB of vGPU memory in all; "
            "its pods take 9000 and this pod would take 1000 more") in message, message
    assert not scenario.get("third")["spec"].get("nodeName")

    # Kubernetes' own count: what the pods declared (requests default to the limits).
    used = admin.get("ResourceQuota", "gpu", scenario.ns)["status"]["used"][KEY]
    assert used in ("7000", "7k"), used
    (row,) = [r for r in _quotas(release) if r["namespace"] == scenario.ns]
    assert (row["used"], row["hard"]) == (9000, 9000), row

    # Room is made (the one-vGPU pod goes): the third pod binds, with no restart.
    admin.delete("Pod", "one", scenario.ns, grace=0)
    wait_for("the extender to count the deletion", lambda: [
        r for r in _quotas(release) if r["namespace"] == scenario.ns and r["used"] == 6000])
    # kube-scheduler retries an unschedulable pod on a cluster event or after its backoff;
    # a label on the pod is such an event
    admin.patch("Pod", "third", {"metadata": {"labels": {"retry": "1"}}}, scenario.ns)
    pod: Obj = scenario.wait_bound("third", timeout=90, detail=lambda: scenario.describe(
        "third") + "\n" + release.tails())
    assert pod["spec"]["nodeName"] == scenario.nodes[0]

    # Least privilege: the scheduler's ServiceAccount reads quotas, never writes them.
    sched = control_plane.as_service_account(NAMESPACE, "vgpud-scheduler")
    assert sched.list("ResourceQuota", scenario.ns)
    _, start = control_plane.audit()
    with pytest.raises(ApiError) as denied:
        sched.delete("ResourceQuota", "gpu", scenario.ns)
    assert denied.value.code == 403, denied.value
    control_plane.audit_forget(start)  # this refusal was the test's own doing
    admin.delete("ResourceQuota", "gpu", scenario.ns)


def test_a_key_without_requests_is_vgpuds_alone(scenario: Scenario, release: Release) -> None:
    """``nvidia.com/vgpu-memory`` (no ``requests.``): kube-apiserver stores it and counts
    nothing against it (it admits the pod though the quota has no status, which it would
    need for a resource it counts), and vgpud's filter refuses the pod."""
    scenario.gpu_node("a", gpus=2, memory=16384)
    scenario.admin.create({"apiVersion": "v1", "kind": "ResourceQuota",
                           "metadata": {"name": "gpu", "namespace": scenario.ns},
                           "spec": {"hard": {"nvidia.com/vgpu-memory": "2000"}}})
    wait_for("the extender to read the quota", lambda: [
        r for r in _quotas(release) if r["namespace"] == scenario.ns], detail=release.tails)
    scenario.apply(scenario.pod("big", _gpu(1, 3000)))
    message = wait_for("kube-scheduler to record the extender's quota refusal",
                       lambda: _quota_event(scenario, "big"),
                       detail=lambda: scenario.describe("big") + "\n" + release.tails())
    assert "nvidia.com/vgpu-memory is 2000 MiB of vGPU memory in all; its pods take 0 and " \
           "this pod would take 3000 more" in message, message
    scenario.admin.delete("ResourceQuota", "gpu", scenario.ns)
