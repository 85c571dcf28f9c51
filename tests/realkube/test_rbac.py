"""Least privilege on the real API server: each role runs with its own ServiceAccount and
the chart's RBAC (every test here fails on a 403 to a vgpud identity, see conftest); these
tests show that check has teeth and that the roles cannot do what they must not."""

from __future__ import annotations

import pytest

from tests.realkube.api import ApiError
from tests.realkube.cluster import Scenario
from tests.realkube.conftest import refused
from tests.realkube.controlplane import ControlPlane
from tests.realkube.release import Release


@pytest.mark.parametrize(("account", "verb", "path", "body"), [
    # the scheduler binds through pods/binding only: no pod writes beyond that
    ("vgpud-scheduler", "PATCH", "/api/v1/namespaces/{ns}/pods/x", {"metadata": {}}),
    ("vgpud-scheduler", "DELETE", "/api/v1/nodes/x", None),
    # the webhook reads nodes and touches only its own webhook configurations
    ("vgpud-webhook", "GET", "/api/v1/namespaces/{ns}/pods", None),
    ("vgpud-webhook", "PATCH",
     "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/other",
     {"metadata": {}}),
    # the plugin cannot read secrets or write other nodes' objects it does not own
    ("vgpud-plugin", "GET", "/api/v1/namespaces/kube-system/secrets", None),
    ("vgpud-plugin", "DELETE", "/api/v1/namespaces/{ns}/pods/x", None),
])
def test_a_call_outside_a_roles_rbac_is_refused_and_the_audit_check_sees_it(
        control_plane: ControlPlane, release: Release, scenario: Scenario, account: str,
        verb: str, path: str, body: object) -> None:
    api = control_plane.as_service_account("kube-system", account)
    _, start = control_plane.audit()
    with pytest.raises(ApiError) as denied:
        api.request(verb, path.format(ns=scenario.ns), body,
                    content_type="application/merge-patch+json")
    assert denied.value.code == 403, denied.value
    events, _ = control_plane.audit(start)
    seen = refused(events)
    assert any(account in line and "-> 403" in line for line in seen), seen
    # this refusal was the test's own doing: the autouse check must not fail the test
    control_plane.audit_forget(start)
