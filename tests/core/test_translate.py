"""A vGPU pod headed to DRA nodes becomes a pod with ResourceClaims (vgpud.core.translate):
the patch, applied by an RFC 6902 library (jsonpatch), gives a pod that names one claim
per GPU container, made from a template of its shape, and asks no vGPU resource any more;
an ask with no claim to become is refused with the reason."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from vgpud.core.admission import AdmissionPolicy, admit_for_dra
from vgpud.core.dra import NODE_MODE_LABEL
from vgpud.core.model import Defaults
from vgpud.core.requests import RequestError
from vgpud.core.translate import Classes, Shape, headed_to_dra, translate

DEFAULTS = Defaults()


def pod(containers: list[dict[str, Any]], *, init: list[dict[str, Any]] | None = None,
        dra: bool = True, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
            "spec": {**({"nodeSelector": {NODE_MODE_LABEL: "dra"}} if dra else {}),
                     **({"initContainers": init} if init else {}),
                     "containers": containers, **spec}}


def gpu(name: str, number: int = 1, memory: int | None = 4096, cores: int | None = 30,
        **extra: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/vgpu-number": number, "cpu": "1"}
    if memory is not None:
        limits["nvidia.com/vgpu-memory"] = memory
    if cores is not None:
        limits["nvidia.com/vgpu-cores"] = cores
    return {"name": name, "image": "cuda", "resources": {"limits": limits}, **extra}


def test_a_container_asking_memory_and_cores_names_a_claim_of_its_shape() -> None:
    p = pod([gpu("main"), {"name": "side", "image": "x"}])
    t = translate(p, DEFAULTS)
    assert t.shapes == (Shape(1, 4096, 30),)
    out = jsonpatch.apply_patch(p, list(t.ops))
    assert out["spec"]["resourceClaims"] == [
        {"name": "vgpud-main", "resourceClaimTemplateName": "vgpud-1x4096mi-30c"}]
    main = out["spec"]["containers"][0]
    assert main["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "vgpud-main"}]}
    assert out["spec"]["containers"][1] == {"name": "side", "image": "x"}
    assert "schedulerName" not in out["spec"]  # kube-scheduler allocates claims
    template = t.shapes[0].template("team", Classes())
    assert template["metadata"]["name"] == "vgpud-1x4096mi-30c"
    assert template["spec"]["spec"]["devices"]["requests"] == [{"name": "vgpu", "exactly": {
        "deviceClassName": "vgpu.vgpud.io", "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": "4096Mi", "cores": "30"}}}}]


def test_two_containers_of_one_shape_share_a_template_and_keep_their_own_claims() -> None:
    p = pod([gpu("a", 2), gpu("b", 2)], init=[gpu("setup", 1, 1024, 0)],
            resourceClaims=[{"name": "other", "resourceClaimName": "x"}])
    t = translate(p, DEFAULTS)
    assert sorted(t.shapes) == [Shape(1, 1024, 0), Shape(2, 4096, 30)]
    out = jsonpatch.apply_patch(p, list(t.ops))
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == [
        "other", "vgpud-setup", "vgpud-a", "vgpud-b"]
    assert out["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "vgpud-setup"}]
    for c in out["spec"]["containers"]:
        assert not any(n.startswith("nvidia.com/") for n in c["resources"]["limits"])


def test_requests_and_existing_claims_are_kept_apart_from_the_vgpu_names() -> None:
    c = gpu("main")
    c["resources"]["requests"] = {"nvidia.com/vgpu-memory": 4096, "memory": "1Gi"}
    c["resources"]["claims"] = [{"name": "mine"}]
    p = pod([c], resourceClaims=[{"name": "mine", "resourceClaimName": "m"}])
    out = jsonpatch.apply_patch(p, list(translate(p, DEFAULTS).ops))
    res = out["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"memory": "1Gi"}
    assert res["claims"] == [{"name": "mine"}, {"name": "vgpud-main"}]


def test_a_whole_gpu_is_a_claim_of_the_gpu_class() -> None:
    c = gpu("main", 2, None, 100)
    c["resources"]["limits"]["nvidia.com/vgpu-memory-percentage"] = 100
    t = translate(pod([c]), DEFAULTS)
    assert t.shapes == (Shape(2, None, 100),)
    exactly = t.shapes[0].template("team", Classes())["spec"]["spec"]["devices"][
        "requests"][0]["exactly"]
    assert exactly == {"deviceClassName": "gpu.vgpud.io", "allocationMode": "ExactCount",
                       "count": 2}


def test_a_share_of_memory_by_percent_is_refused_with_the_reason() -> None:
    c = gpu("main", 1, None, 30)
    c["resources"]["limits"]["nvidia.com/vgpu-memory-percentage"] = 50
    with pytest.raises(RequestError, match="50% of a GPU's memory has no DRA capacity"):
        translate(pod([c]), DEFAULTS)
    verdict, ops, shapes = admit_for_dra(pod([c]), AdmissionPolicy(dra_mode="selected")) or (
        None, None, None)
    assert verdict is not None and not verdict.allowed and ops == [] and shapes == ()
    assert "headed to DRA nodes" in verdict.message


@pytest.mark.parametrize(("mode", "dra", "expected"), [
    ("off", True, False), ("selected", True, True), ("selected", False, False),
    ("always", False, True)])
def test_which_pods_are_translated(mode: str, dra: bool, expected: bool) -> None:
    p = pod([gpu("main")], dra=dra)
    assert headed_to_dra(p, mode) is (mode != "off" and expected)
    got = admit_for_dra(p, AdmissionPolicy(dra_mode=mode))
    assert (got is not None) is expected
    # a pod asking no vGPU is never the DRA path's
    assert admit_for_dra(pod([{"name": "x", "image": "y"}], dra=dra),
                         AdmissionPolicy(dra_mode=mode)) is None


def test_a_stored_template_is_recognised_by_value_not_by_spelling() -> None:
    shape = Shape(1, 4096, 30)
    stored = shape.template("team", Classes())
    exactly = stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacity"]["requests"]["memory"] = "4Gi"  # as kube-apiserver stores 4096Mi
    assert shape.made(stored, Classes())
    exactly["capacity"]["requests"]["memory"] = "16Gi"
    assert not shape.made(stored, Classes())
    exactly["capacity"]["requests"]["memory"] = "4Gi"
    exactly["deviceClassName"] = "gpu.vgpud.io"
    assert not shape.made(stored, Classes())
    exactly["deviceClassName"] = "vgpu.vgpud.io"
    exactly["selectors"] = [{"cel": {"expression": "true"}}]
    assert not shape.made(stored, Classes())
    assert not shape.made({"spec": "junk"}, Classes())
