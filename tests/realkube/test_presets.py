"""Pods written for HAMi, Volcano and TKE, end to end on the real control plane: the
chart rendered with ``compatPresets`` (the webhook accepts their names, the chart's
kube-scheduler leaves them to the extender), and the three peers' spellings placed with
the slice they meant."""

from __future__ import annotations

import pytest

from tests.realkube.cluster import Scenario, placed_slice
from tests.realkube.release import Release


@pytest.fixture(scope="module")
def chart_values() -> tuple[str, ...]:
    return ("config.compatPresets={hami,volcano,tke}",)


@pytest.fixture(autouse=True)
def _release(release: Release) -> Release:
    return release


@pytest.mark.parametrize(("limits", "memory", "cores"), [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
     3000, 30),
    ({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "2000",
      "volcano.sh/vgpu-cores": "25"}, 2000, 25),
    # TKE: vcuda-core is in hundredths of a GPU, vcuda-memory in 256 MiB units
    ({"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "8"}, 2048, 50),
    # a share of the memory only is a GPU pod too: the webhook adds the count
    ({"volcano.sh/vgpu-memory-percentage": "25"}, 4096, 0),
], ids=["hami", "volcano", "tke", "volcano-percentage-only"])
def test_a_peers_pod_is_placed_with_the_slice_it_meant(
        scenario: Scenario, release: Release, limits: dict[str, str], memory: int,
        cores: int) -> None:
    scenario.gpu_node("a", gpus=2, memory=16384)
    pod, got_memory, got_cores = placed_slice(scenario, limits, release.tails)
    assert (got_memory, got_cores) == (memory, cores)
    # The pod keeps the peer's names (the plugin registers each enabled preset's count
    # with kubelet); the API server writes quantities canonically ("3000" is "3k"), and
    # the assignment above still reads 3,000 MiB.
    got = pod["spec"]["containers"][0]["resources"]["limits"]
    assert set(got) - set(limits) <= {"volcano.sh/vgpu-number"}, got


def test_a_hami_pod_asking_more_cores_than_a_gpu_is_refused(scenario: Scenario) -> None:
    from tests.realkube.api import ApiError

    scenario.gpu_node("a")
    with pytest.raises(ApiError) as refused:
        scenario.apply(scenario.pod("greedy", {"nvidia.com/gpu": "1",
                                               "nvidia.com/gpucores": "120"}))
    assert "nvidia.com/gpucores: 120 is more than 100" in refused.value.message
