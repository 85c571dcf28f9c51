"""Every peer's names moved as its own system allows, set in the chart's values
(``config.resourceNames``), end to end on the real control plane: the webhook reads the
pods under those names (the chart's matchConditions send them to it), the chart's
kube-scheduler leaves them to the extender (managedResources), and the extender places
the slice they meant. The names the settings replaced are no GPU names any more."""

from __future__ import annotations

import pytest

from tests.realkube.cluster import Scenario, placed_slice
from tests.realkube.release import Release


@pytest.fixture(scope="module")
def chart_values() -> tuple[str, ...]:
    return ("config.compatPresets={hami,volcano,tke}",
            "config.resourceNames.tke.domain=inspur.com",  # seed 004
            "config.resourceNames.volcano.domain=gpu.example.org",
            "config.resourceNames.hami.resourceName=example.com/vgpu",
            "config.resourceNames.hami.resourceMem=example.com/vgpu-memory",
            "config.resourceNames.hami.resourceCores=example.com/vgpu-cores",
            "config.resourceNames.hami.resourceMemPercentage=example.com/vgpu-memory-share")


@pytest.fixture(autouse=True)
def _release(release: Release) -> Release:
    return release


@pytest.mark.parametrize(("limits", "memory", "cores"), [
    ({"example.com/vgpu": "1", "example.com/vgpu-memory": "3000",
      "example.com/vgpu-cores": "30"}, 3000, 30),
    ({"example.com/vgpu-memory-share": "50"}, 8192, 0),
    ({"gpu.example.org/vgpu-number": "1", "gpu.example.org/vgpu-memory": "2000",
      "gpu.example.org/vgpu-cores": "25"}, 2000, 25),
    ({"gpu.example.org/vgpu-memory-percentage": "25"}, 4096, 0),
    ({"inspur.com/vcuda-core": "50", "inspur.com/vcuda-memory": "30"}, 30 * 256, 50),
], ids=["hami", "hami-share-only", "volcano", "volcano-percentage-only", "tke-inspur"])
def test_a_peers_pod_under_renamed_names_is_placed_with_the_slice_it_meant(
        scenario: Scenario, release: Release, limits: dict[str, str], memory: int,
        cores: int) -> None:
    scenario.gpu_node("a", gpus=2, memory=16384)
    _, got_memory, got_cores = placed_slice(scenario, limits, release.tails)
    assert (got_memory, got_cores) == (memory, cores)


@pytest.mark.parametrize("limits", [
    {"tencent.com/vcuda-core": "50"}, {"nvidia.com/gpumem": "3000"},
    {"volcano.sh/vgpu-memory-percentage": "25"},
], ids=["tke", "hami", "volcano"])
def test_a_pod_in_the_names_the_settings_replaced_is_left_alone(
        scenario: Scenario, limits: dict[str, str]) -> None:
    scenario.gpu_node("a")
    created = scenario.apply(scenario.pod("old", limits))
    assert created["spec"].get("schedulerName") == "default-scheduler"
    assert set(created["spec"]["containers"][0]["resources"]["limits"]) == set(limits)
