"""The namespace quota on true vGPU use (vgpud/core/quota.py): which keys are read, what a
pod takes, what a namespace takes (from the ledger), and the refusal."""

from __future__ import annotations

from typing import Any

from tests.builders import container, node, pod
from vgpud.core.allocate import Allocator
from vgpud.core.model import ContainerGrant, Defaults, DeviceGrant, Placement
from vgpud.core.quota import (
    CORES,
    MEMORY,
    QUOTA_CODE,
    Limit,
    Quota,
    Use,
    exceeds,
    placement_use,
    quota_keys,
    quota_rows,
    read_quota,
    request_use,
)
from vgpud.core.requests import parse_pod

KEYS = quota_keys(Defaults())


def rq(hard: dict[str, Any], namespace: str = "team", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"hard": hard, **spec}}


def in_team(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["metadata"]["namespace"] = "team"
    return manifest


def test_the_preset_names_bare_and_with_requests_are_read() -> None:
    assert KEYS["nvidia.com/vgpu-memory"].what == MEMORY
    assert KEYS["requests.nvidia.com/vgpu-memory"].what == MEMORY
    assert KEYS["requests.nvidia.com/vgpu-cores"].what == CORES
    assert "requests.nvidia.com/vgpu-number" not in KEYS  # Kubernetes counts it right
    assert "limits.nvidia.com/vgpu-memory" not in KEYS
    assert "requests.nvidia.com/gpumem" not in KEYS  # not an enabled preset
    compat = quota_keys(Defaults(compat_presets=("hami", "tke")))
    assert compat["requests.nvidia.com/gpumem"].what == MEMORY
    assert compat["tencent.com/vcuda-memory"].unit == 256  # TKE's unit


def test_a_quota_reads_its_limits_in_mib_and_percent() -> None:
    q = read_quota(rq({"requests.nvidia.com/vgpu-memory": "9k", "requests.cpu": "4",
                       "nvidia.com/vgpu-cores": 250}), KEYS)
    assert q.key == "team/gpu" and not q.errors
    assert q.limits == (Limit("nvidia.com/vgpu-cores", CORES, 250),
                        Limit("requests.nvidia.com/vgpu-memory", MEMORY, 9000))


def test_a_value_that_is_not_a_quantity_is_a_clear_error_not_a_crash() -> None:
    q = read_quota(rq({"requests.nvidia.com/vgpu-memory": "lots",
                       "requests.nvidia.com/vgpu-cores": "100"}), KEYS)
    assert q.limits == (Limit("requests.nvidia.com/vgpu-cores", CORES, 100),)
    assert q.errors == ("ResourceQuota team/gpu: spec.hard[requests.nvidia.com/vgpu-memory]: "
                        "'lots' is not a quantity (this limit is not enforced)",)
    assert read_quota({"metadata": {"name": "x"}, "spec": {"hard": ["a"]}}, KEYS).errors
    assert read_quota({"metadata": {"name": "x"}, "spec": "no"}, KEYS).errors


def test_a_scoped_quota_is_not_read() -> None:
    q = read_quota(rq({"requests.nvidia.com/vgpu-memory": "1"}, scopes=["BestEffort"]), KEYS)
    assert q.scoped and not q.limits


def test_a_request_takes_number_times_memory() -> None:
    req = parse_pod(pod(number=2, memory=3000, cores=30), Defaults())
    assert request_use(req) == Use(6000, 60)


def test_init_containers_count_as_kubernetes_counts_them_the_largest_phase() -> None:
    manifest = pod(containers=[container("main", number=1, memory=2000)],
                   init=[container("prep", number=2, memory=1500)])
    assert request_use(parse_pod(manifest, Defaults())) == Use(3000, 0)


def test_a_share_of_memory_depends_on_the_gpu_chosen() -> None:
    assert request_use(parse_pod(pod(number=1, percent=50), Defaults())) is None
    assert request_use(parse_pod(pod(number=1), Defaults())) is None  # a whole GPU's memory
    # resolved on the GPU it got: 50 % of a 40,000 MiB GPU
    alloc = Allocator()
    alloc.set_node(node("n", 1, 40000))
    got = alloc.place(parse_pod(pod(number=1, percent=50), Defaults()), "n")
    assert isinstance(got, Placement) and placement_use(got) == Use(20000, 0)


def test_the_ledger_counts_each_namespace_assumed_and_confirmed() -> None:
    alloc = Allocator(clock=lambda: 0.0)
    alloc.set_node(node("n", 4, 40000))
    a = parse_pod(in_team(pod("a", number=2, memory=3000, cores=10)), Defaults())
    b = parse_pod(in_team(pod("b", number=1, memory=3000)), Defaults())
    c = parse_pod(pod("c", number=1, memory=5000), Defaults())  # namespace default
    for req in (a, b, c):
        p = alloc.place(req, "n")
        assert isinstance(p, Placement)
        assert alloc.assume(req, p) is None
    led = alloc.ledger
    assert led.namespace_use("team") == Use(9000, 20)
    assert led.namespace_use("default") == Use(5000, 0)
    entry = led.get(a.uid)
    assert entry is not None
    alloc.confirm(a.uid, a.key, entry.placement)  # assumed -> confirmed: counted once
    assert led.namespace_use("team") == Use(9000, 20)
    alloc.forget(b.uid)
    assert led.namespace_use("team") == Use(6000, 20)
    alloc.forget(a.uid)
    assert led.namespace_use("team") == Use() and "team" not in led.namespaces()
    assert led.violations() == []


def test_the_quota_refuses_what_would_pass_it_and_says_so() -> None:
    q = read_quota(rq({"requests.nvidia.com/vgpu-memory": "9000"}), KEYS)
    assert exceeds([q], Use(6000), Use(3000), "team") is None  # exactly at the limit
    why = exceeds([q], Use(9000), Use(1000), "team")
    assert why is not None and why.code == QUOTA_CODE and not why.resolvable
    assert why.message == (
        "namespace team quota gpu: requests.nvidia.com/vgpu-memory is 9000 MiB of vGPU "
        "memory in all; its pods take 9000 and this pod would take 1000 more (counted per "
        "vGPU, as vgpud grants it)")
    # a pod asking nothing of the bounded amount is never refused by it
    assert exceeds([q], Use(9000), Use(0, 50), "team") is None


def test_placement_use_sums_a_phase_and_takes_the_largest() -> None:
    p = Placement("n", (
        ContainerGrant("a", False, (DeviceGrant("g0", 3000, 10), DeviceGrant("g1", 3000, 10))),
        ContainerGrant("i", True, (DeviceGrant("g0", 8000, 50),))))
    assert placement_use(p) == Use(8000, 50)


def test_rows_show_use_against_each_limit_and_each_error() -> None:
    good = read_quota(rq({"requests.nvidia.com/vgpu-memory": "9000"}), KEYS)
    bad = Quota("team", "typo", errors=("not a quantity",))
    rows = quota_rows([bad, good], {"team": Use(6000, 0)})
    assert [(r.quota, r.key, r.hard, r.used, r.error) for r in rows] == [
        ("gpu", "requests.nvidia.com/vgpu-memory", 9000, 6000, ""),
        ("typo", "", 0, 0, "not a quantity")]
