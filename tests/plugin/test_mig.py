"""MIG ``mixed`` and ``single`` over a fake-devices file, under vgpud's own names and
HAMi's (the scenarios: mig.py)."""

from __future__ import annotations

import pytest

from tests.plugin.harness import VGPU, node_harness
from tests.plugin.mig import mig_devices, mixed_scenario, single_scenario

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("preset", ["vgpu-manager", "hami"])
async def test_mixed_offers_each_instance_whole_under_its_profile(preset: str) -> None:
    number = VGPU if preset == "vgpu-manager" else "nvidia.com/gpu"
    settings = {"resourcePreset": preset, "plugin": {"migStrategy": "mixed"}}
    async with node_harness(settings=settings, devices=mig_devices(), resources=[number]) as h:
        await mixed_scenario(h, number)


@pytest.mark.parametrize("preset", ["vgpu-manager", "hami"])
async def test_single_shares_instances_like_gpus(preset: str) -> None:
    number, memory = ((VGPU, "nvidia.com/vgpu-memory") if preset == "vgpu-manager"
                      else ("nvidia.com/gpu", "nvidia.com/gpumem"))
    settings = {"resourcePreset": preset, "deviceSplitCount": 4,
                "plugin": {"migStrategy": "single"}}
    async with node_harness(settings=settings, devices=mig_devices(), resources=[number]) as h:
        await single_scenario(h, number, memory)


async def test_none_advertises_mig_gpus_unhealthy_and_offers_no_instance() -> None:
    async with node_harness(devices=mig_devices()) as h:
        inv = await h.published_inventory()
        assert [g.mig for g in inv.devices] == [True, True]  # no instance published
        devs = h.kubelet.devices()
        assert len(devs) == 20 and set(devs.values()) == {"Unhealthy"}
