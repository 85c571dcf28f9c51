"""Admission decisions (vgpud/core/admission.py): every patch applied to the original
pod by an RFC 6902 library (jsonpatch) gives the expected pod; every denial names the
container and the field."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.fuzz import examples
from vgpud.core.admission import (
    AdmissionPolicy,
    Catalogue,
    Verdict,
    admit,
    is_gpu_pod,
    mutate,
    pointer,
    validate,
)
from vgpud.core.model import Defaults, Gpu, NodeInventory
from vgpud.core.requests import parse_pod

POLICY = AdmissionPolicy()
NUM, MEM, CORES, PCT = ("nvidia.com/vgpu-number", "nvidia.com/vgpu-memory",
                        "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory-percentage")
PIN = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team"}, "spec": body}


def ctr(name: str = "main", limits: dict[str, Any] | None = None,
        requests: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "image": "cuda", **({"resources": res} if res else {}), **extra}


def mutated(p: dict[str, Any], policy: AdmissionPolicy = POLICY) -> dict[str, Any]:
    original = copy.deepcopy(p)
    out = jsonpatch.apply_patch(p, mutate(p, policy))
    assert p == original, "mutate must not change its input"
    return dict(out)


# -- mutations ------------------------------------------------------------------------------------

@pytest.mark.parametrize("given_name", [None, "", "default-scheduler"])
def test_scheduler_name_is_set_when_empty_or_default(given_name: str | None) -> None:
    spec = {} if given_name is None else {"schedulerName": given_name}
    out = mutated(pod(ctr(limits={NUM: 1}), **spec))
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"


def test_scheduler_name_follows_the_setting() -> None:
    out = mutated(pod(ctr(limits={NUM: 1})), AdmissionPolicy(scheduler_name="gpu-sched"))
    assert out["spec"]["schedulerName"] == "gpu-sched"


def test_another_custom_scheduler_is_never_replaced_and_gets_a_warning() -> None:
    p = pod(ctr(limits={NUM: 1}), schedulerName="volcano", nodeName="node-7")
    out = mutated(p)
    assert out["spec"]["schedulerName"] == "volcano"
    assert out["spec"]["nodeName"] == "node-7"  # not ours to schedule
    v = validate(out, POLICY)
    assert v.allowed and any("'volcano'" in w for w in v.warnings)


def test_a_pod_without_gpu_is_left_alone() -> None:
    p = pod(ctr(limits={"cpu": "1", "nvidia.com/gpu": 1}), nodeName="node-7")
    assert not is_gpu_pod(p, POLICY.defaults)  # nvidia.com/gpu is HAMi's, not enabled
    assert mutate(p, POLICY) == []


@pytest.mark.parametrize("given_res", [{MEM: "3000"}, {CORES: 30}, {PCT: 50},
                                       {MEM: 3000, CORES: 20}])
def test_number_is_added_when_only_memory_or_cores_are_given(given_res: dict[str, Any]) -> None:
    out = mutated(pod(ctr(limits=dict(given_res))))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {**given_res, NUM: "1"}


def test_number_added_is_the_configured_default() -> None:
    policy = AdmissionPolicy(Defaults(default_gpu_num=2))
    out = mutated(pod(ctr(limits={MEM: 1000})), policy)
    assert out["spec"]["containers"][0]["resources"]["limits"][NUM] == "2"


def test_requests_are_copied_to_limits_creating_the_map() -> None:
    p = pod(ctr(requests={MEM: "3000", NUM: 2, "cpu": "1"}))
    out = mutated(p)
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"] == {MEM: "3000", NUM: 2}  # GPU names only: cpu may overcommit
    assert res["requests"] == {MEM: "3000", NUM: 2, "cpu": "1"}


def test_requests_join_existing_limits() -> None:
    p = pod(ctr(limits={"memory": "1Gi", NUM: 1}, requests={CORES: 25}))
    out = mutated(p)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "1Gi", NUM: 1, CORES: 25}


def test_null_limits_are_replaced() -> None:
    p = pod({"name": "m", "resources": {"limits": None, "requests": {MEM: 10}}})
    out = mutated(p)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {MEM: 10, NUM: "1"}


def test_init_containers_are_mutated_at_their_own_index() -> None:
    p = pod(ctr("app"), ctr("gpu", requests={CORES: 10}),
            init=(ctr("warm", limits={MEM: 100}),))
    out = mutated(p)
    assert out["spec"]["initContainers"][0]["resources"]["limits"] == {MEM: 100, NUM: "1"}
    assert out["spec"]["containers"][1]["resources"]["limits"] == {CORES: 10, NUM: "1"}
    assert "resources" not in out["spec"]["containers"][0]


def test_presets_are_mutated_under_their_own_names() -> None:
    policy = AdmissionPolicy(Defaults(preset="hami", compat_presets=("volcano", "tke")))
    p = pod(ctr("h", limits={"nvidia.com/gpumem": 3000}, requests={"nvidia.com/priority": 0}),
            ctr("v", limits={"volcano.sh/vgpu-memory": 1000}),
            ctr("t", requests={"tencent.com/vcuda-core": 30}))
    out = mutated(p, policy)
    lim = [c["resources"]["limits"] for c in out["spec"]["containers"]]
    assert lim[0] == {"nvidia.com/gpumem": 3000, "nvidia.com/priority": 0, "nvidia.com/gpu": "1"}
    assert lim[1] == {"volcano.sh/vgpu-memory": 1000, "volcano.sh/vgpu-number": "1"}
    assert lim[2] == {"tencent.com/vcuda-core": 30}  # TKE's unit has no separate count
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"


def test_node_name_becomes_a_required_affinity() -> None:
    out = mutated(pod(ctr(limits={NUM: 1}), nodeName="node-7"))
    assert "nodeName" not in out["spec"]
    assert out["spec"]["affinity"] == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [PIN]}]}}}


def test_node_name_is_anded_into_every_term_of_the_pods_own_affinity() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    other = {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}
    affinity = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [zone]}}],
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [zone]},
                {"matchFields": [other]},
                {},  # matches nothing: stays so
            ]}}}
    out = mutated(pod(ctr(limits={NUM: 1}), nodeName="node-7", affinity=affinity))
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [zone], "matchFields": [PIN]},
        {"matchFields": [other, PIN]},
        {},
    ]
    assert na["preferredDuringSchedulingIgnoredDuringExecution"] == affinity["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert out["spec"]["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]


@pytest.mark.parametrize("affinity", [
    {"podAffinity": {}},
    {"nodeAffinity": {}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}},
])
def test_node_name_creates_each_missing_level(affinity: dict[str, Any]) -> None:
    out = mutated(pod(ctr(limits={NUM: 1}), nodeName="node-7", affinity=affinity))
    req = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req["nodeSelectorTerms"] == [{"matchFields": [PIN]}]
    if "podAffinity" in affinity:
        assert out["spec"]["affinity"]["podAffinity"] == {}


def test_resource_names_are_escaped_in_pointers() -> None:
    assert pointer("spec", "limits", "a/b~c") == "/spec/limits/a~1b~0c"


@pytest.mark.parametrize(("bad", "reason"), [
    (None, "the pod is not an object"), ([], "the pod is not an object"),
    ("pod", "the pod is not an object"), ({"spec": []}, "spec must be an object"),
    ({"spec": {"containers": "x"}}, "spec.containers must be a list"),
    ({"spec": {"containers": [None, 3, {"resources": []}]}},
     "spec.containers[0] must be an object (a container)"),
    ({"spec": {"containers": [{"name": "a", "resources": {"limits": [NUM]}}]}},
     "spec.containers[0] (container 'a'): resources.limits must be an object"),
    ({"spec": {"containers": [{"name": "a", "resources": {"limits": {NUM: "x"}}}]}},
     "container 'a': nvidia.com/vgpu-number: 'x' is not a quantity"),
    ({"spec": None}, None),  # no spec: no GPU
    ({"spec": {"containers": [{"name": "a", "resources": {"limits": {NUM: 1}}}],
               "affinity": "everywhere", "nodeName": "n"}}, None),
])
def test_malformed_pods_do_not_crash_mutate_and_are_denied_with_the_reason(
        bad: Any, reason: str | None) -> None:
    """mutate never raises over a malformed pod; admission (mutating and validating)
    denies one whose GPU use it cannot read, or whose GPU request is malformed, with
    the reason; a patch it does send applies and gives a pod validate accepts."""
    ops = mutate(bad, POLICY)  # must not raise, whatever the pod holds
    verdict, patch = admit(bad, POLICY)
    if reason is not None:
        assert (verdict.allowed, verdict.message, patch) == (False, reason, [])
        assert validate(bad, POLICY) == Verdict(False, reason)
    else:
        assert verdict.allowed and patch == ops
        patched = jsonpatch.apply_patch(bad, ops)
        assert validate(patched, POLICY).allowed


# -- denials --------------------------------------------------------------------------------------

def denied(p: dict[str, Any], policy: AdmissionPolicy = POLICY,
           catalogue: Catalogue | None = None) -> str:
    v = validate(p, policy, catalogue or Catalogue({}))
    assert not v.allowed, f"expected a denial for {p}"
    return v.message


@pytest.mark.parametrize(("limits", "fragments"), [
    ({NUM: -1}, ["'main'", NUM, "negative"]),
    ({MEM: "1.5"}, ["'main'", MEM, "not a whole number"]),
    ({MEM: "3Gi"}, ["'main'", MEM, "write 3072 for 3Gi"]),
    ({NUM: "1.5"}, ["'main'", NUM, "not a whole number"]),
    ({CORES: 101}, ["'main'", CORES, "more than 100"]),
    ({PCT: 101}, ["'main'", PCT, "between 1 and 100"]),
    ({MEM: 1000, PCT: 50}, ["'main'", MEM, PCT, "not both"]),
])
def test_bad_quantities_are_denied_naming_container_and_field(
        limits: dict[str, Any], fragments: list[str]) -> None:
    msg = denied(pod(ctr("sidecar"), ctr(limits=limits)))
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.mark.parametrize(("annotation", "value", "fragment"), [
    ("nvidia.com/node-scheduler-policy", "packed", "binpack, spread"),
    ("nvidia.com/device-scheduler-policy", "random", "binpack, spread"),
    ("nvidia.com/device-topology-mode", "ring", "numa"),
    ("nvidia.com/vgpu-compute-policy", "burst", "fixed, balance, none"),
    ("nvidia.com/vgpu-priority", "high", "not an integer"),
])
def test_unknown_policy_values_are_denied(annotation: str, value: str, fragment: str) -> None:
    p = pod(ctr(limits={NUM: 1}))
    p["metadata"]["annotations"] = {annotation: value}
    msg = denied(p)
    assert annotation in msg and repr(value) in msg and fragment in msg


def test_a_uuid_both_included_and_excluded_is_denied() -> None:
    p = pod(ctr(limits={NUM: 1}))
    p["metadata"]["annotations"] = {"nvidia.com/include-gpu-uuid": "GPU-a,GPU-b",
                                    "nvidia.com/nouse-gpuuuid": "GPU-b"}
    assert "'gpu-b'" in denied(p).lower()


def test_a_privileged_gpu_container_is_denied_unless_allowed() -> None:
    p = pod(ctr("ok", limits={NUM: 1}),
            ctr("root", limits={NUM: 1}, securityContext={"privileged": True}))
    msg = denied(p)
    assert "'root'" in msg and "securityContext.privileged" in msg
    assert "allowPrivilegedGPUPods" in msg
    assert validate(p, AdmissionPolicy(allow_privileged=True)).allowed
    # privileged without a GPU is none of our business
    q = pod(ctr("gpu", limits={NUM: 1}), ctr("root", securityContext={"privileged": True}))
    assert validate(q, POLICY).allowed


@pytest.mark.parametrize(("container_sc", "pod_sc", "fragment"), [
    ({"capabilities": {"add": ["NET_RAW", "SYS_ADMIN"]}}, None, "SYS_ADMIN"),
    ({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}, None, "CAP_SYS_ADMIN"),
    ({"capabilities": {"add": ["ALL"]}}, None, "has ALL"),
    ({"seccompProfile": {"type": "Unconfined"}}, None, "securityContext.seccompProfile"),
    (None, {"seccompProfile": {"type": "Unconfined"}}, "the pod's securityContext"),
])
def test_a_gpu_container_that_could_undo_its_shim_is_denied_unless_allowed(
        container_sc: dict[str, Any] | None, pod_sc: dict[str, Any] | None,
        fragment: str) -> None:
    """Issue 22, finding 18: CAP_SYS_ADMIN, or seccomp Unconfined (a user namespace),
    lets a process mount over /etc/ld.so.preload and run without the shim."""
    extra = {"securityContext": container_sc} if container_sc else {}
    p = pod(ctr("ok", limits={NUM: 1}), ctr("escape", limits={NUM: 1}, **extra))
    if pod_sc:
        p["spec"]["securityContext"] = pod_sc
    msg = denied(p)
    assert "'escape'" in msg or "'ok'" in msg
    assert fragment in msg and "/etc/ld.so.preload" in msg and "allowPrivilegedGPUPods" in msg
    assert validate(p, AdmissionPolicy(allow_privileged=True)).allowed


def test_a_container_profile_overrides_the_pods_and_others_are_not_our_business() -> None:
    p = pod(ctr("gpu", limits={NUM: 1},
                securityContext={"seccompProfile": {"type": "RuntimeDefault"}}))
    p["spec"]["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    assert validate(p, POLICY).allowed
    q = pod(ctr("gpu", limits={NUM: 1}),
            ctr("side", securityContext={"capabilities": {"add": ["SYS_ADMIN"]},
                                         "seccompProfile": {"type": "Unconfined"}}))
    assert validate(q, POLICY).allowed
    r = pod(ctr("gpu", limits={NUM: 1}, securityContext={
        "capabilities": {"add": ["NET_ADMIN"]}, "seccompProfile": {"type": "Localhost",
                                                                   "localhostProfile": "x"}}))
    assert validate(r, POLICY).allowed


def test_requests_that_differ_from_limits_are_denied() -> None:
    msg = denied(pod(ctr(limits={MEM: 3000}, requests={MEM: "2000"})))
    assert "'main'" in msg and MEM in msg and "differ" in msg
    msg = denied(pod(ctr(limits={MEM: 3000}, requests={MEM: "-2"})))
    assert "resources.requests" in msg and "negative" in msg


def gpus(n: int, memory: int, *, split: int = 10, mig: bool = False) -> NodeInventory:
    return NodeInventory(tuple(Gpu(f"GPU-{memory}-{i}", i, "A", memory, split=split, mig=mig)
                               for i in range(n)))


CLUSTER = Catalogue.of([gpus(8, 24576)] * 40 + [gpus(2, 81920)] * 3
                       + [gpus(4, 1 << 20, mig=True)])


@pytest.mark.parametrize(("limits", "ok"), [
    ({MEM: 81920}, True),  # one of the two-GPU nodes
    ({MEM: 81920, NUM: 2}, True),
    ({MEM: 81921}, False),  # no GPU that large (the MIG ones do not count)
    ({MEM: 40000, NUM: 3}, False),  # no node with three such GPUs
    ({MEM: 24576, NUM: 8}, True),
    ({NUM: 9}, False),  # no node has nine GPUs
    ({PCT: 100, NUM: 8}, True),
])
def test_requests_larger_than_any_gpu_of_the_cluster_are_denied(
        limits: dict[str, Any], ok: bool) -> None:
    v = validate(pod(ctr(limits=limits)), POLICY, CLUSTER)
    assert v.allowed is ok, v.message
    if not ok:
        assert "'main'" in v.message and "81920 MiB" in v.message and "is 8" in v.message


def test_without_known_nodes_size_is_not_judged() -> None:
    assert validate(pod(ctr(limits={MEM: 1 << 23})), POLICY, Catalogue({})).allowed


def test_scaling_counts_in_the_catalogue() -> None:
    doubled = Catalogue.of([NodeInventory(gpus(1, 16384).devices, memory_scaling=2.0)])
    assert validate(pod(ctr(limits={MEM: 30000})), POLICY, doubled).allowed
    assert not validate(pod(ctr(limits={MEM: 33000})), POLICY, doubled).allowed


def test_non_gpu_pods_are_allowed_whatever_their_annotations() -> None:
    p = pod(ctr(limits={"cpu": 1}))
    p["metadata"]["annotations"] = {"nvidia.com/vgpu-priority": "high"}
    assert validate(p, POLICY).allowed


def test_node_name_left_on_a_gpu_pod_is_warned_about() -> None:
    v = validate(pod(ctr(limits={NUM: 1}), nodeName="n"), POLICY)
    assert v.allowed and any("spec.nodeName" in w for w in v.warnings)


# -- property: mutation never turns an accepted pod into a denied one --------------------------

# mostly valid (so that many pods are accepted and the property has teeth), some not
QUANTITY = st.one_of(st.integers(1, 100), st.integers(1, 4),
                     st.sampled_from(["1", "2", "50", "3000", "1", 1, 1, 2, 30]),
                     st.sampled_from([0, -1, 101, "1.5", "3Gi", "abc", "2k"]))
RESOURCES = st.dictionaries(st.sampled_from([NUM, MEM, CORES, "cpu", "nvidia.com/gpu"]),
                            QUANTITY, max_size=3) | st.dictionaries(
    st.sampled_from([NUM, PCT]), QUANTITY, max_size=2)


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": prefix}
    shape = draw(st.sampled_from(["limits", "requests", "both", "same", "none"]))
    lim, req = draw(RESOURCES), draw(RESOURCES)
    if shape == "limits":
        c["resources"] = {"limits": lim}
    elif shape == "requests":
        c["resources"] = {"requests": req}
    elif shape == "both":
        c["resources"] = {"limits": lim, "requests": req}
    elif shape == "same":
        c["resources"] = {"limits": lim, "requests": dict(lim)}
    if draw(st.integers(0, 4)) == 0:
        c["securityContext"] = {"privileged": draw(st.booleans())}
    return c


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(st.lists(containers("c"), min_size=1,
                                                        max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers("i"), max_size=2))
    for kind in ("containers", "initContainers"):  # distinct names, but now and then a clash
        for i, c in enumerate(spec.get(kind, [])):
            c["name"] += str(i if draw(st.integers(0, 9)) else 0)
    spec["schedulerName"] = draw(st.sampled_from([None, "", "default-scheduler",
                                                  "vgpu-scheduler", "other"]))
    if draw(st.booleans()):
        spec["nodeName"] = draw(st.sampled_from(["", "node-1"]))
    if draw(st.booleans()):
        spec["affinity"] = draw(st.sampled_from([
            {}, {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "k", "operator": "Exists"}]}, {}]}}}]))
    ann = draw(st.dictionaries(st.sampled_from([
        "nvidia.com/vgpu-priority", "nvidia.com/device-scheduler-policy",
        "nvidia.com/include-gpu-uuid", "nvidia.com/exclude-gpu-uuid"]),
        st.sampled_from(["1", "spread", "GPU-a", "GPU-b", "x"]), max_size=2))
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": ann}, "spec": spec}


@pytest.mark.property
@hsettings(max_examples=examples(400, 5000))
@given(pods(), st.sampled_from([None, CLUSTER]))
@example({"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {
    "requests": {MEM: 100}}}], "nodeName": "node-1"}}, None)
def test_mutate_then_validate_accepts_what_validate_accepts(
        p: dict[str, Any], catalogue: Catalogue | None) -> None:
    cat = catalogue or Catalogue({})
    before = validate(p, POLICY, cat)
    out = mutated(p)
    after = validate(out, POLICY, cat)
    if before.allowed:
        assert after.allowed, (after.message, out)
    if before.allowed and is_gpu_pod(p, POLICY.defaults):
        assert parse_pod(out, POLICY.defaults) == parse_pod(p, POLICY.defaults)
    if is_gpu_pod(p, POLICY.defaults) and after.allowed:
        spec = out["spec"]
        assert spec.get("schedulerName") in ("vgpu-scheduler", "other")
        if spec.get("schedulerName") == "vgpu-scheduler":
            assert not spec.get("nodeName")
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            res = c.get("resources") or {}
            for name in set(res.get("requests") or {}) & {NUM, MEM, CORES, PCT}:
                assert name in res["limits"]
    assert mutate(out, POLICY) == [] or not after.allowed  # idempotent on accepted pods
