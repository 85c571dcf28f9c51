"""Least privilege on the real API server: each role runs with its own ServiceAccount and
the chart's RBAC (every test here fails on a 403 to a vgpud identity, see conftest); these
tests show that check has teeth and that the roles cannot do what they must not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.deploy.rendered import Manifests
from tests.realkube.api import ApiError, Obj, path_of
from tests.realkube.cluster import Scenario
from tests.realkube.conftest import refused
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import (
    DRA_ACCOUNT,
    NAMESPACE,
    Release,
    dra_identity,
    driver_pod,
)
from vgpud.core.codec import NODE_DEVICES
from vgpud.core.dra import DRIVER


@pytest.fixture(scope="module")
def chart_values() -> tuple[str, ...]:
    return ("dra.enabled=true",)  # the DRA node role too: `vgpud dra`'s ServiceAccount


SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


@pytest.mark.parametrize(("account", "verb", "path", "body", "says"), [
    # the scheduler binds through pods/binding only: no pod writes beyond that
    ("vgpud-scheduler", "PATCH", "/api/v1/namespaces/{ns}/pods/x", {"metadata": {}},
     'cannot patch resource "pods"'),
    ("vgpud-scheduler", "DELETE", "/api/v1/nodes/x", None, 'cannot delete resource "nodes"'),
    # the webhook reads nodes and touches only its own webhook configurations
    ("vgpud-webhook", "GET", "/api/v1/namespaces/{ns}/pods", None,
     'cannot list resource "pods"'),
    ("vgpud-webhook", "PATCH",
     "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/other",
     {"metadata": {}}, 'cannot patch resource "mutatingwebhookconfigurations"'),
    # the plugin cannot read secrets or write other nodes' objects it does not own
    ("vgpud-plugin", "GET", "/api/v1/namespaces/kube-system/secrets", None,
     'cannot list resource "secrets"'),
    ("vgpud-plugin", "DELETE", "/api/v1/namespaces/{ns}/pods/x", None,
     'cannot delete resource "pods"'),
    # the DRA plugin: no secrets, no pod writes at all (it prepares claims, it does not
    # reassign pods as the device plugin does), no node deletes, no node status (it
    # publishes no extended resources)
    ("vgpud-dra", "GET", "/api/v1/namespaces/kube-system/secrets", None,
     'cannot list resource "secrets"'),
    ("vgpud-dra", "DELETE", "/api/v1/namespaces/{ns}/pods/x", None,
     'cannot delete resource "pods"'),
    ("vgpud-dra", "PATCH", "/api/v1/namespaces/{ns}/pods/x", {"metadata": {}},
     'cannot patch resource "pods"'),
    ("vgpud-dra", "DELETE", "/api/v1/nodes/x", None, 'cannot delete resource "nodes"'),
    ("vgpud-dra", "PATCH", "/api/v1/nodes/x/status", {"status": {}},
     'cannot patch resource "nodes/status"'),
    # its slices: listed (by field selector) and written whole, never read one by one,
    # patched or watched
    ("vgpud-dra", "GET", SLICES + "/x", None, 'cannot get resource "resourceslices"'),
    ("vgpud-dra", "PATCH", SLICES + "/x", {"metadata": {}},
     'cannot patch resource "resourceslices"'),
    ("vgpud-dra", "GET", SLICES + "?watch=1", None, 'cannot watch resource "resourceslices"'),
    # claims: read one it prepares; not listed, not allocated (kube-scheduler's), not made
    ("vgpud-dra", "GET", "/apis/resource.k8s.io/v1/resourceclaims", None,
     'cannot list resource "resourceclaims"'),
    ("vgpud-dra", "PUT", CLAIMS + "/x/status", {"metadata": {}},
     'cannot update resource "resourceclaims/status"'),
    ("vgpud-dra", "POST", CLAIMS, {"metadata": {}}, 'cannot create resource "resourceclaims"'),
    ("vgpud-dra", "POST", "/apis/resource.k8s.io/v1/deviceclasses", {"metadata": {}},
     'cannot create resource "deviceclasses"'),
])
def test_a_call_outside_a_roles_rbac_is_refused_and_the_audit_check_sees_it(
        control_plane: ControlPlane, release: Release, scenario: Scenario, account: str,
        verb: str, path: str, body: object, says: str) -> None:
    api = control_plane.as_service_account("kube-system", account)
    _, start = control_plane.audit()
    with pytest.raises(ApiError) as denied:
        api.request(verb, path.format(ns=scenario.ns), body,
                    content_type="application/merge-patch+json")
    assert denied.value.code == 403, denied.value
    # RBAC's refusal, naming the account and what it may not do
    assert f'User "system:serviceaccount:kube-system:{account}" {says}' in \
        denied.value.message, denied.value
    events, _ = control_plane.audit(start)
    seen = refused(events)
    assert any(account in line and "-> 403" in line for line in seen), seen
    # this refusal was the test's own doing: the autouse check must not fail the test
    control_plane.audit_forget(start)


# -- the DRA role on its node: what RBAC grants it, the admission policies narrow -----------

@pytest.fixture(scope="module")
def dra_role(control_plane: ControlPlane, release: Release) -> Iterator[Manifests]:
    with dra_identity(control_plane) as chart:
        yield chart


def _slice(name: str, node: str, driver: str = DRIVER) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "devices": [],
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def _denied(call: Callable[[], Any], says: str, code: int = 403) -> str:
    """``call`` refused with ``code`` (403; 422: a status field the API server's own
    authorization check refused, as a field error) saying ``says``."""
    with pytest.raises(ApiError) as denied:
        call()
    assert denied.value.code == code, denied.value
    assert says in denied.value.message, denied.value
    return denied.value.message


def _claim(cp: ControlPlane, ns: str, name: str) -> None:
    cp.admin.request("POST", CLAIMS.format(ns=ns), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "vgpu.vgpud.io", "allocationMode": "ExactCount",
            "count": 1}}]}}})


def _allocated(cp: ControlPlane, ns: str, claim: str, node: str) -> None:
    """What kube-scheduler writes: ``claim`` allocated a share of ``node``'s gpu-0."""
    cp.admin.request("PATCH", f"{CLAIMS.format(ns=ns)}/{claim}/status", {"status": {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                     "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
        content_type="application/merge-patch+json")


def _device_status(ns: str, claim: str, node: str) -> Obj:
    """A status.devices entry as ``vgpud dra`` applies it (vgpud/dra/prepare.py)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": ns},
            "status": {"devices": [{"driver": DRIVER, "pool": node, "device": "gpu-0",
                                    "conditions": [{"type": "Ready", "status": "True",
                                                    "reason": "Prepared", "message": "test",
                                                    "lastTransitionTime":
                                                        "2026-11-28T00:00:00Z"}],
                                    "data": {"uuid": "GPU-x"}}]}}


def test_the_dra_role_does_on_its_node_what_vgpud_dra_does_and_nothing_else(
        control_plane: ControlPlane, release: Release, dra_role: Manifests,
        scenario: Scenario) -> None:
    """Every call ``vgpud dra`` makes, made here with its pod's token (it names the node,
    as the DaemonSet's projected token does) with the chart's policies in force, goes
    through; the same verbs on another node's objects, or through a token that names no
    node, are refused by the policies (RBAC cannot name a node: it allows them)."""
    cp, ns = control_plane, scenario.ns
    mine, other = scenario.gpu_node("mine"), scenario.gpu_node("other")
    pod = driver_pod(cp, mine)
    made: list[str] = []
    try:
        dra = cp.admin.as_token(cp.token(NAMESPACE, DRA_ACCOUNT, pod=pod))
        here = cp.admin.create(scenario.pod("here", scheduler="nobody", node_name=mine))
        _claim(cp, ns, "claim")

        # the node runtime: its Node read and its inventory annotation written, the pods
        # on it listed, watched and read, events on them posted and counted
        assert dra.get("Node", mine)["metadata"]["name"] == mine
        dra.patch("Node", mine, {"metadata": {"annotations": {NODE_DEVICES: "[]"}}})
        on_mine = {"fieldSelector": f"spec.nodeName={mine}"}
        assert "here" in {p["metadata"]["name"] for p in dra.list("Pod", **on_mine)}
        dra.request("GET", path_of("Pod"), query={**on_mine, "watch": "1",
                                                   "timeoutSeconds": "1"})
        assert dra.get("Pod", "here", ns)["metadata"]["uid"] == here["metadata"]["uid"]
        event = dra.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "here.dra", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "here",
                               "namespace": ns, "uid": here["metadata"]["uid"]},
            "reason": "VgpuOverLimit", "message": "a test's", "type": "Warning", "count": 1})
        dra.patch("Event", event["metadata"]["name"], {"count": 2}, ns)
        # the kubelet plugin: the claim it prepares read, its device status written (a
        # claim kube-scheduler allocated on this node's device)
        dra.request("GET", CLAIMS.format(ns=ns) + "/claim")
        _allocated(cp, ns, "claim", mine)
        dra.request("PATCH", CLAIMS.format(ns=ns) + "/claim/status",
                    _device_status(ns, "claim", mine),
                    query={"fieldManager": "vgpud-dra", "force": "true"},
                    content_type="application/apply-patch+yaml")
        assert cp.admin.request("GET", CLAIMS.format(ns=ns) + "/claim")["status"][
            "devices"][0]["data"] == {"uuid": "GPU-x"}
        _claim(cp, ns, "theirs")
        _allocated(cp, ns, "theirs", other)
        # the publisher: this node's slices of its driver listed, created, updated, deleted
        made.append(f"{mine}-gpu")
        dra.create(_slice(made[-1], mine))
        (listed,) = dra.list("ResourceSlice",
                             fieldSelector=f"spec.nodeName={mine},spec.driver={DRIVER}")
        listed["spec"]["pool"]["generation"] = 2
        dra.request("PUT", path_of("ResourceSlice", made[-1]),
                    {**listed, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"})
        dra.delete("ResourceSlice", made[-1])

        # what the policies refuse it, though RBAC allows the verb
        made.append(f"{other}-gpu")
        theirs = cp.admin.create(_slice(made[-1], other))
        unbound = cp.as_service_account(NAMESPACE, DRA_ACCOUNT)
        _, start = cp.audit()
        _denied(lambda: dra.patch("Node", other, {"metadata": {"annotations": {
            NODE_DEVICES: "[]"}}}), f"the DRA driver of node {mine} writes only that node "
            f"and its pods, not Node {other}")
        _denied(lambda: dra.patch("Node", mine, {"metadata": {"labels": {"x": "y"}}}),
                "the DRA driver changes only the vgpud.io/ annotations")
        _denied(lambda: dra.patch("Node", mine, {"spec": {"unschedulable": True}}),
                "changes only the vgpud.io/ annotations")
        _denied(lambda: dra.create(_slice(f"{other}-forged", other)),
                f"the DRA driver of node {mine} writes only the {DRIVER} ResourceSlices of "
                f"that node, not {other}-forged of node {other}")
        _denied(lambda: dra.create(_slice(f"{mine}-other-driver", mine, "gpu.example.com")),
                f"writes only the {DRIVER} ResourceSlices of that node")
        # another node's slice it neither updates nor deletes
        changed = {**theirs, "spec": {**theirs["spec"], "pool": {
            **theirs["spec"]["pool"], "generation": 2}}}
        _denied(lambda: dra.request("PUT", path_of("ResourceSlice", made[-1]), changed),
                f"writes only the {DRIVER} ResourceSlices of that node, not {made[-1]} of "
                f"node {other}")
        _denied(lambda: dra.delete("ResourceSlice", made[-1]),
                f"not {made[-1]} of node {other}")
        # another node's claim: its device status is not this driver's to write (the
        # API server's node-aware check of resourceclaims/driver), nor is any allocation
        _denied(lambda: dra.request(
            "PATCH", CLAIMS.format(ns=ns) + "/theirs/status",
            _device_status(ns, "theirs", other),
            query={"fieldManager": "vgpud-dra", "force": "true"},
            content_type="application/apply-patch+yaml"),
            'cannot arbitrary-node:patch resource "resourceclaims/driver"', 422)
        _denied(lambda: dra.request(
            "PATCH", CLAIMS.format(ns=ns) + "/claim/status",
            {"status": {"allocation": None}},
            content_type="application/merge-patch+json"),
            'cannot patch resource "resourceclaims/binding"', 422)
        # a token bound to no pod names no node: it writes neither slices nor nodes
        _denied(lambda: unbound.create(_slice(f"{mine}-unbound", mine)),
                "the DRA driver's token names no node")
        _denied(lambda: unbound.patch("Node", mine, {"metadata": {"annotations": {
            NODE_DEVICES: "[]"}}}), "the DRA driver's token names no node")
        events, _ = cp.audit(start)
        seen = [line for line in refused(events) if DRA_ACCOUNT in line]
        assert len(seen) == 9, seen  # the audit check sees each (the 422s are not RBAC's)
        cp.audit_forget(start)  # and they were the test's own doing
        # nothing refused was written
        kept = cp.admin.get("ResourceSlice", made[-1])
        assert kept["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        assert cp.admin.get("Node", other)["metadata"]["annotations"][NODE_DEVICES] != "[]"
        node = cp.admin.get("Node", mine)
        assert "x" not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")
        for name in (f"{other}-forged", f"{mine}-other-driver", f"{mine}-unbound"):
            assert cp.admin.find("ResourceSlice", name) is None
        assert "devices" not in cp.admin.request("GET", CLAIMS.format(ns=ns) + "/theirs")[
            "status"]
        assert cp.admin.request("GET", CLAIMS.format(ns=ns) + "/claim")["status"][
            "allocation"]["devices"]["results"][0]["pool"] == mine
    finally:
        for name in made:
            cp.admin.delete("ResourceSlice", name)
        cp.admin.delete("Pod", pod["metadata"]["name"], NAMESPACE, grace=0)
