"""Offline schema validation of every rendered object with kubernetes-validate (the
official OpenAPI schemas, strict: unknown fields are errors). The package is ~108 MB
installed, so these tests skip where it is not installed. (kube-scheduler's own
configuration has no schema there; test_manifests.py checks its shape.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.rendered import Manifests

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")

M = Manifests.committed()
# The oldest version the committed manifests apply to as they are (the webhooks'
# matchConditions are on by default from 1.28), and the version they are rendered for.
# The chart's own floor (Chart.yaml kubeVersion, 1.25) renders without matchConditions:
# test_render.py validates that render against the 1.25 schemas.
VERSIONS = ["1.28.0", "1.30.0"]
# ... except the grant policy, a kind Kubernetes serves as v1 from 1.30 (a render for an
# older cluster leaves it out: test_render.py)
SINCE = {"ValidatingAdmissionPolicy": "1.30.0", "ValidatingAdmissionPolicyBinding": "1.30.0"}


def _id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize(("doc", "version"), [
    pytest.param(d, v, id=f"{_id(d)}-{v}") for d in M.docs for v in VERSIONS
    if _version(v) >= _version(SINCE.get(d["kind"], VERSIONS[0]))])
def test_object_matches_the_kubernetes_schema(doc: dict[str, Any], version: str) -> None:
    kv.validate(doc, version, strict=True)


def test_validator_rejects_an_unknown_field() -> None:
    daemonset = copy.deepcopy(M.workload("DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kv.ValidationError, match="securityContxt"):
        kv.validate(daemonset, VERSIONS[-1], strict=True)


def test_validator_rejects_a_wrong_type() -> None:
    deployment = copy.deepcopy(M.workload("Deployment", "vgpud-scheduler"))
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, VERSIONS[-1], strict=True)
