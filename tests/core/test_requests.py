import pytest

from tests.builders import container, pod
from vgpud.core.model import ComputePolicy, Defaults, Policy, TopologyMode
from vgpud.core.requests import RequestError, parse_pod, parse_quantity

D = Defaults()


def test_limits_win_over_requests_and_defaults_fill_in() -> None:
    p = pod(containers=[{"name": "a", "resources": {
        "requests": {"nvidia.com/vgpu-memory": "100"},
        "limits": {"nvidia.com/vgpu-memory": "3000", "nvidia.com/vgpu-cores": 30}}}])
    (c,) = parse_pod(p, D).containers
    assert (c.number, c.memory, c.cores, c.memory_percent) == (1, 3000, 30, None)


def test_only_cores_means_one_vgpu_with_default_memory() -> None:
    (c,) = parse_pod(pod(cores=20), Defaults(default_mem=2048)).containers
    assert (c.number, c.memory, c.cores) == (1, 2048, 20)
    (c,) = parse_pod(pod(cores=20), D).containers
    assert (c.memory, c.memory_percent) == (None, 100)


def test_pod_without_gpu_has_no_containers() -> None:
    p = pod(containers=[{"name": "a", "resources": {"limits": {"cpu": "1"}}}])
    assert not parse_pod(p, D).wants_gpu


@pytest.mark.parametrize(("limits", "fragment"), [
    ({"number": -1}, "negative"),
    ({"number": "1.5"}, "not a whole number"),
    ({"number": "abc"}, "not a quantity"),
    ({"memory": 1000, "percent": 50}, "not both"),
    ({"cores": 101}, "more than 100"),
    ({"percent": 0}, "between 1 and 100"),
    ({"percent": 150}, "between 1 and 100"),
    ({"memory": "100Ei"}, "absurd"),
    ({"number": 0, "memory": 10}, "0 vGPUs"),
    ({"number": 1000}, "more than 64"),
])
def test_bad_requests_are_rejected_with_a_clear_reason(limits: dict, fragment: str) -> None:
    with pytest.raises(RequestError, match=fragment) as e:
        parse_pod(pod(**limits), D)
    assert "main" in str(e.value)  # names the container


def test_quantities() -> None:
    assert parse_quantity("2k", "x") == 2000
    assert parse_quantity("1Ki", "x") == 1024
    assert parse_quantity("1e3", "x") == 1000
    assert parse_quantity(7, "x") == 7
    with pytest.raises(RequestError):
        parse_quantity(True, "x")
    with pytest.raises(RequestError):
        parse_quantity("500m", "x")


@pytest.mark.parametrize(("preset", "limits", "expect"), [
    ("hami", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 25},
     (2, 4000, None, 25)),
    ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, (1, None, 50, 0)),
    ("volcano", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1024,
                 "volcano.sh/vgpu-cores": 50}, (1, 1024, None, 50)),
    # issue 24, item 2: Volcano's percentage (dropped: such a pod was not a GPU pod)
    ("volcano", {"volcano.sh/vgpu-memory-percentage": 25}, (1, None, 25, 0)),
    ("volcano", {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory-percentage": 50,
                 "volcano.sh/vgpu-cores": 20}, (2, None, 50, 20)),
    ("tke", {"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 8}, (1, 2048, None, 30)),
    ("tke", {"tencent.com/vcuda-core": 200}, (2, None, 100, 100)),
])
def test_presets(preset: str, limits: dict, expect: tuple) -> None:
    p = pod(containers=[{"name": "a", "resources": {"limits": limits}}])
    (c,) = parse_pod(p, Defaults(preset=preset)).containers
    assert (c.number, c.memory, c.memory_percent, c.cores) == expect


def test_tke_rejects_fractional_multi_gpu() -> None:
    p = pod(containers=[{"name": "a", "resources": {"limits": {"tencent.com/vcuda-core": 150}}}])
    with pytest.raises(RequestError, match="multiple of 100"):
        parse_pod(p, Defaults(preset="tke"))


def test_other_presets_only_with_compatibility_on() -> None:
    p = pod(containers=[{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}])
    assert not parse_pod(p, D).wants_gpu
    assert parse_pod(p, Defaults(compat_presets=("hami",))).wants_gpu


def test_annotations_and_hami_aliases() -> None:
    p = pod(memory=1000, annotations={
        "hami.io/node-scheduler-policy": "spread", "nvidia.com/device-scheduler-policy": "Spread",
        "nvidia.com/use-gputype": "A100,H100", "nvidia.com/exclude-gpu-uuid": "GPU-x",
        "nvidia.com/device-topology-mode": "numa", "nvidia.com/vgpu-compute-policy": "balance",
        "nvidia.com/vgpu-priority": "5"})
    r = parse_pod(p, D)
    assert r.node_policy is Policy.SPREAD and r.device_policy is Policy.SPREAD
    assert r.include_types == ("A100", "H100") and r.exclude_uuids == ("GPU-x",)
    assert r.topology is TopologyMode.NUMA and r.compute_policy is ComputePolicy.BALANCE
    assert r.priority == 5


@pytest.mark.parametrize(("annotations", "fragment"), [
    ({"nvidia.com/node-scheduler-policy": "fastest"}, "unknown value 'fastest'"),
    ({"nvidia.com/include-gpu-type": "A100", "nvidia.com/exclude-gpu-type": "a100"},
     "both included and excluded"),
    ({"nvidia.com/node-scheduler-policy": "spread", "hami.io/node-scheduler-policy": "binpack"},
     "disagree"),
    ({"nvidia.com/vgpu-priority": "high"}, "not an integer"),
    ({"nvidia.com/device-topology-mode": "ring"}, "unknown value"),
])
def test_bad_annotations(annotations: dict, fragment: str) -> None:
    with pytest.raises(RequestError, match=fragment):
        parse_pod(pod(memory=1, annotations=annotations), D)


def test_init_and_sidecar_containers() -> None:
    p = pod(containers=[container("app", memory=1000)],
            init=[container("setup", memory=500), container("proxy", restart="Always", cores=10)])
    cs = {c.name: c for c in parse_pod(p, D).containers}
    assert cs["setup"].init and not cs["setup"].sidecar
    assert cs["proxy"].init and cs["proxy"].sidecar
    assert not cs["app"].init


@pytest.mark.parametrize("bad", [None, [], "pod", {"spec": {"containers": "x"}},
                                 {"spec": {"containers": [1]}},
                                 {"metadata": {"annotations": []}},
                                 {"spec": {"containers": [{"resources": {}}]}},
                                 {"spec": {"containers": [{"name": "a", "resources": []}]}}])
def test_malformed_pods_raise_request_error(bad: object) -> None:
    with pytest.raises(RequestError):
        parse_pod(bad, D)  # type: ignore[arg-type]
