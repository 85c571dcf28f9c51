"""A GPU pod through the real control plane: kube-apiserver's admission chain calls the
chart's webhooks (their ``matchConditions`` evaluated by the server), the chart's
kube-scheduler calls the extender's filter, prioritize and bind, and the Binding lands
with the assignment. Every vgpud role runs with its own ServiceAccount token."""

from __future__ import annotations

import pytest

from tests.realkube.api import ApiError
from tests.realkube.cluster import Scenario, assignment
from tests.realkube.release import Release


@pytest.fixture(autouse=True)
def _release(release: Release) -> Release:
    return release


def _verbs_served(release: Release) -> dict[str, float]:
    """The extender's request counts by verb, from its /metrics."""
    out: dict[str, float] = {}
    for line in release.extender_metrics().splitlines():
        if line.startswith("vgpud_extender_requests_total{"):
            labels, _, value = line.rpartition(" ")
            verb = labels.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = out.get(verb, 0) + float(value)
    return out


def test_a_pod_applied_as_kubectl_does_is_admitted_filtered_scored_and_bound(
        scenario: Scenario, release: Release) -> None:
    a = scenario.gpu_node("a", gpus=2, memory=16384)
    b = scenario.gpu_node("b", gpus=2, memory=16384)
    before = _verbs_served(release)
    # memory only: the webhook adds the vGPU count and the scheduler's name
    created = scenario.apply(scenario.pod("infer", {"nvidia.com/vgpu-memory": "3000"}))
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert created["spec"]["schedulerName"] == "vgpu-scheduler"
    assert limits["nvidia.com/vgpu-number"] == "1"

    pod = scenario.wait_bound("infer", detail=lambda: scenario.describe("infer")
                              + "\n" + release.tails())
    got = assignment(pod)
    assert got.node == pod["spec"]["nodeName"] in (a, b)
    (grant,) = got.containers
    assert grant.name == "main"
    (device,) = grant.devices
    assert device.memory == 3000
    assert device.uuid.startswith(f"GPU-{got.node}-")
    served = _verbs_served(release)
    for verb in ("filter", "prioritize", "bind"):  # two feasible nodes: scoring ran
        assert served.get(verb, 0) > before.get(verb, 0), (verb, before, served)
    reasons = {e["reason"] for e in scenario.events("infer")}
    assert "Scheduled" in reasons, scenario.describe("infer")


def test_an_invalid_request_is_refused_with_the_webhooks_reason(scenario: Scenario) -> None:
    scenario.gpu_node("a")
    with pytest.raises(ApiError) as refused:
        scenario.apply(scenario.pod("greedy", {"nvidia.com/vgpu-number": "1",
                                               "nvidia.com/vgpu-cores": "150"}))
    e = refused.value
    assert e.code == 400 or e.code == 403, e
    # the mutating webhook runs first and refuses a request it cannot read (issue 24,
    # item 6: it allowed it, and the validating one refused it after)
    assert 'admission webhook "mutate.vgpud.io" denied the request' in e.message, e.message
    assert "nvidia.com/vgpu-cores: 150 is more than 100" in e.message, e.message
    assert scenario.admin.find("Pod", "greedy", scenario.ns) is None


def test_a_request_no_gpu_in_the_cluster_can_hold_is_refused(scenario: Scenario) -> None:
    scenario.gpu_node("a", gpus=2, memory=16384)
    with pytest.raises(ApiError) as refused:
        scenario.apply(scenario.pod("huge", {"nvidia.com/vgpu-memory": "999999"}))
    assert "no GPU node in this cluster could ever hold that" in refused.value.message


def test_a_pod_that_names_its_node_is_pinned_there_through_the_scheduler(
        scenario: Scenario) -> None:
    scenario.gpu_node("a")
    b = scenario.gpu_node("b")
    created = scenario.apply(scenario.pod("pinned", {"nvidia.com/vgpu-number": "1"},
                                          node_name=b))
    # the webhook turned spec.nodeName into a node affinity, so the scheduler places it
    assert not created["spec"].get("nodeName")
    terms = created["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "metadata.name", "operator": "In", "values": [b]} in [
        f for t in terms for f in t.get("matchFields", [])]
    pod = scenario.wait_bound("pinned")
    assert pod["spec"]["nodeName"] == b
    assert assignment(pod).node == b


def test_with_the_webhook_down_only_gpu_pods_are_held_back(scenario: Scenario,
                                                         release: Release) -> None:
    """The chart's matchConditions, evaluated by the real API server: with the webhook
    down (failurePolicy Fail) a pod that asks for no GPU is still admitted, and a GPU pod
    is refused with the reason, not admitted unchecked."""
    assert release.webhook is not None
    release.webhook.stop()
    try:
        cpu = scenario.apply(scenario.pod("web", resources={"limits": {"cpu": "1"}}))
        assert cpu["spec"].get("schedulerName") == "default-scheduler"
        with pytest.raises(ApiError) as refused:
            scenario.apply(scenario.pod("gpu", {"nvidia.com/vgpu-number": "1"}))
        assert 'failed calling webhook "mutate.vgpud.io"' in refused.value.message, (
            refused.value)
    finally:
        release.start_webhook()
    assert scenario.apply(scenario.pod("gpu", {"nvidia.com/vgpu-number": "1"}))["spec"][
        "schedulerName"] == "vgpu-scheduler"
