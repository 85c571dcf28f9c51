"""The grant is vgpud's alone (issue 23, findings 1 and 4), on the real API server: the
chart's ValidatingAdmissionPolicies refuse any CREATE or UPDATE of a pod that sets,
changes or removes its ``vgpud.io/`` annotations unless it comes from the scheduler's or
the plugin's ServiceAccount, while the scheduler's Binding (which carries the assignment)
still goes through; and the plugin writes only its own node and that node's pods, and
only their ``vgpud.io/`` annotations. A tenant here is a ServiceAccount that may create
and patch pods in its namespace, as a user of a GPU cluster may."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.realkube.api import Api, ApiError, Obj, wait_for
from tests.realkube.cluster import Scenario
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import NAMESPACE, Release
from vgpud.core.codec import ASSIGNMENT

POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
POLICIES = ("vgpud-grants", "vgpud-plugin-scope")


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[list[Obj]]:
    """The chart's service accounts, RBAC and grant policy, without its processes."""
    rel = Release(control_plane, tmp_path_factory.mktemp("grants"))
    rel.apply_objects(webhooks=False)
    docs = [d for d in rel.manifests.docs if d["kind"] in POLICY_KINDS]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (k, n) for k in POLICY_KINDS for n in POLICIES), "the chart renders the policies"
    for d in docs:
        control_plane.admin.apply(d, manager="helm")
    try:
        yield docs
    finally:
        for d in reversed(docs):
            control_plane.admin.delete(d["kind"], d["metadata"]["name"])


def _tenant(cp: ControlPlane, scenario: Scenario) -> Api:
    ns = scenario.ns
    cp.admin.create({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "tenant", "namespace": ns}})
    cp.admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": {"name": "tenant", "namespace": ns},
                     "rules": [{"apiGroups": [""], "resources": ["pods"],
                                "verbs": ["create", "get", "list", "patch", "update"]}]})
    cp.admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": "tenant", "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "tenant"},
                     "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]})
    return cp.as_service_account(ns, "tenant")


def _pod(scenario: Scenario, name: str, annotations: dict[str, str] | None = None) -> Obj:
    # a scheduler nobody runs: the pod stays where the test puts it
    return scenario.pod(name, annotations=annotations, scheduler="nobody")


def _refused(call: object) -> ApiError:
    with pytest.raises(ApiError) as denied:
        call()  # type: ignore[operator]
    assert denied.value.code == 403, denied.value
    assert "written by vgpud alone" in denied.value.message, denied.value
    return denied.value


FORGED = '{"node":"gpu-node","gpus":[]}'


def _effective(cp: ControlPlane, tenant: Api, scenario: Scenario) -> None:
    """A new policy reaches the API server's admission a moment after it is stored:
    probe until a forged pod is refused (the probes that got in are deleted)."""
    n = 0

    def refuses() -> bool:
        nonlocal n
        n += 1
        try:
            tenant.create(_pod(scenario, f"probe-{n}", {ASSIGNMENT: FORGED}))
        except ApiError as e:
            return e.code == 403
        cp.admin.delete("Pod", f"probe-{n}", scenario.ns, grace=0)
        return False
    wait_for("the grant policy to take effect", refuses, timeout=30)


def test_a_tenant_cannot_create_a_pod_with_a_grant(
        control_plane: ControlPlane, policy: list[Obj], scenario: Scenario) -> None:
    tenant = _tenant(control_plane, scenario)
    _effective(control_plane, tenant, scenario)
    e = _refused(lambda: tenant.create(_pod(scenario, "forged", {ASSIGNMENT: FORGED})))
    assert ASSIGNMENT in e.message
    # nor any other vgpud.io/ annotation, nor through a controller's identity: the
    # policy names who may, not what they may not
    _refused(lambda: tenant.create(_pod(scenario, "marked",
                                        {"vgpud.io/rescheduled-from": "x"})))
    # a pod without them is the tenant's to create and annotate
    tenant.create(_pod(scenario, "plain", {"team": "a"}))
    tenant.patch("Pod", "plain", {"metadata": {"annotations": {"team": "b"}}}, scenario.ns)


def test_only_vgpud_writes_a_running_pods_grant(
        control_plane: ControlPlane, policy: list[Obj], scenario: Scenario) -> None:
    tenant = _tenant(control_plane, scenario)
    _effective(control_plane, tenant, scenario)
    tenant.create(_pod(scenario, "p"))
    _refused(lambda: tenant.patch("Pod", "p", {"metadata": {"annotations": {
        ASSIGNMENT: FORGED}}}, scenario.ns))
    # the scheduler's Binding carries the assignment (pods/binding: not the pod's UPDATE)
    sched = control_plane.as_service_account(NAMESPACE, "vgpud-scheduler")
    granted = '{"node":"n1","gpus":[]}'
    sched.request("POST", f"/api/v1/namespaces/{scenario.ns}/pods/p/binding", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "annotations": {ASSIGNMENT: granted}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}})
    assert scenario.get("p")["metadata"]["annotations"][ASSIGNMENT] == granted
    # the tenant can neither change the grant nor take it away (the scheduler would then
    # count the GPU free beside a pod still using it) ...
    _refused(lambda: tenant.patch("Pod", "p", {"metadata": {"annotations": {
        ASSIGNMENT: FORGED}}}, scenario.ns))
    _refused(lambda: tenant.patch("Pod", "p", {"metadata": {"annotations": {
        ASSIGNMENT: None}}}, scenario.ns))
    # ... nor replace the pod's whole metadata in an update
    pod = tenant.get("Pod", "p", scenario.ns)
    pod["metadata"]["annotations"] = {}
    _refused(lambda: tenant.request(
        "PUT", f"/api/v1/namespaces/{scenario.ns}/pods/p", pod))
    # (the plugin's reassignment, vgpud's own write: below, from its node's token)
    # the tenant's other annotations stay the tenant's
    tenant.patch("Pod", "p", {"metadata": {"annotations": {"team": "a"}}}, scenario.ns)


def test_the_policy_names_the_charts_own_service_accounts(policy: list[Obj]) -> None:
    """The two writers the policy lets through are the chart's scheduler and plugin."""
    (vap,) = [d for d in policy if d["kind"] == POLICY_KINDS[0]
              and d["metadata"]["name"] == "vgpud-grants"]
    cond = vap["spec"]["matchConditions"][0]["expression"]
    assert f"system:serviceaccount:{NAMESPACE}:vgpud-scheduler" in cond
    assert f"system:serviceaccount:{NAMESPACE}:vgpud-plugin" in cond




# -- finding 4: the plugin writes its own node and its pods, nothing else --------------

def _denied(call: object, says: str) -> None:
    with pytest.raises(ApiError) as denied:
        call()  # type: ignore[operator]
    assert denied.value.code == 403, denied.value
    assert says in denied.value.message, denied.value


def test_the_plugin_writes_only_its_own_node_and_its_pods(
        control_plane: ControlPlane, policy: list[Obj], scenario: Scenario) -> None:
    cp = control_plane
    mine, other = scenario.gpu_node("mine"), scenario.gpu_node("other")
    # the plugin's pod on its node: a token bound to it names the node, as the
    # DaemonSet's projected token does
    plugin_pod = cp.admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{scenario.id}-plugin", "namespace": NAMESPACE}, "spec": {
        "nodeName": mine, "serviceAccountName": "vgpud-plugin",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "plugin", "image": "registry.invalid/x"}]}})
    try:
        _plugin_scope(cp, scenario, mine, other,
                      cp.admin.as_token(cp.token(NAMESPACE, "vgpud-plugin", pod=plugin_pod)))
    finally:
        cp.admin.delete("Pod", plugin_pod["metadata"]["name"], NAMESPACE, grace=0)


def _plugin_scope(cp: ControlPlane, scenario: Scenario, mine: str, other: str,
                  plugin: Api) -> None:
    here = cp.admin.create(_pod(scenario, "here") | {"spec": {
        "nodeName": mine, "containers": [{"name": "main", "image": "registry.invalid/x"}]}})
    there = cp.admin.create(_pod(scenario, "there") | {"spec": {
        "nodeName": other, "containers": [{"name": "main", "image": "registry.invalid/x"}]}})
    assert here and there
    ns = scenario.ns
    grant = {"metadata": {"annotations": {ASSIGNMENT: '{"node":"x","gpus":[]}'}}}
    _, start = cp.audit()

    def on_its_node() -> bool:  # the policy reaches admission a moment after it is stored
        try:
            plugin.patch("Pod", "there", grant, ns)
        except ApiError as e:
            return e.code == 403
        return False
    wait_for("the plugin-scope policy to take effect", on_its_node, timeout=30)
    # its own node's pod: the reassignment goes through
    plugin.patch("Pod", "here", grant, ns)
    # another node's pod, another node, another node's status: refused, naming both
    _denied(lambda: plugin.patch("Pod", "there", grant, ns), f"of node {mine} writes only")
    _denied(lambda: plugin.patch("Node", other, {"metadata": {"annotations": {
        "vgpud.io/node-devices": "[]"}}}), f"not Node {other}")
    # its own node: the inventory annotation goes through (the status capacity the
    # plugin patches with a feature gate on is held to its node by the same rule) ...
    plugin.patch("Node", mine, {"metadata": {"annotations": {"vgpud.io/node-devices": "[]"}}})
    # ... but nothing else of it or of its pods
    _denied(lambda: plugin.patch("Node", mine, {"metadata": {"labels": {"x": "y"}}}),
            "changes only the vgpud.io/ annotations")
    _denied(lambda: plugin.patch("Node", mine, {"spec": {"unschedulable": True}}),
            "changes only the vgpud.io/ annotations")
    _denied(lambda: plugin.patch("Pod", "here", {"metadata": {"annotations": {"team": "x"}}},
                                 ns), "changes only the vgpud.io/ annotations")
    # a token bound to no pod names no node: it writes nothing
    unbound = cp.as_service_account(NAMESPACE, "vgpud-plugin")
    _denied(lambda: unbound.patch("Pod", "here", grant, ns), "names no node")
    # these refusals were the test's own doing
    cp.audit_forget(start)
