"""Which resources a node serves, and in what unit (vgpud.plugin.resources): pure."""

from __future__ import annotations

import dataclasses

import pytest

from vgpud.config import parse_settings
from vgpud.core.model import DeviceGrant
from vgpud.node.allocations import DEFAULT_RESOURCE
from vgpud.plugin.resources import (
    PERCENT_IDS,
    VGPU_IDS,
    ServedResource,
    served,
    socket_for,
)


def test_the_default_serves_vgpu_number_on_its_old_socket() -> None:
    assert served("vgpu-manager", split=10) == (
        ServedResource("nvidia.com/vgpu-number", "vgpud-vgpu-number.sock", 10, VGPU_IDS),)
    assert DEFAULT_RESOURCE == "nvidia.com/vgpu-number"


@pytest.mark.parametrize(("preset", "name", "socket"), [
    ("hami", "nvidia.com/gpu", "vgpud-nvidia.com-gpu.sock"),
    ("volcano", "volcano.sh/vgpu-number", "vgpud-volcano.sh-vgpu-number.sock"),
    ("tke", "tencent.com/vcuda-core", "vgpud-tencent.com-vcuda-core.sock"),
])
def test_each_preset_serves_its_number_name_only(preset: str, name: str, socket: str) -> None:
    (r,) = served(preset, split=4)
    assert (r.name, r.socket) == (name, socket)
    assert socket_for(name) == socket


def test_compat_presets_follow_the_preset_deduplicated() -> None:
    got = served("hami", ("vgpu-manager", "hami", "tke", "vgpu-manager"), split=6)
    assert [(r.name, r.replicas, r.per_gpu) for r in got] == [
        ("nvidia.com/gpu", 6, VGPU_IDS), ("nvidia.com/vgpu-number", 6, VGPU_IDS),
        ("tencent.com/vcuda-core", 100, PERCENT_IDS)]
    assert len({r.socket for r in got}) == 3


def test_memory_and_cores_names_are_never_served() -> None:
    names = {r.name for r in served("vgpu-manager", ("hami", "volcano", "tke"), split=10)}
    assert names == {"nvidia.com/vgpu-number", "nvidia.com/gpu", "volcano.sh/vgpu-number",
                     "tencent.com/vcuda-core"}


@pytest.mark.parametrize(("scaling", "replicas"), [(1.0, 100), (0.5, 100), (1.15, 115),
                                                   (2.0, 200)])
def test_tke_advertises_one_id_per_percent_of_the_cores_capacity(scaling: float,
                                                                 replicas: int) -> None:
    (r,) = served("tke", split=10, core_scaling=scaling)
    assert r.percent and r.replicas == replicas
    # the split does not bound percent IDs (it bounds containers, in the scheduler)
    assert served("tke", split=3, core_scaling=scaling) == (r,)


def test_ids_per_grant() -> None:
    vgpu, (tke,) = served("vgpu-manager", split=10)[0], served("tke", split=10)
    assert not vgpu.percent
    assert vgpu.ids_for(DeviceGrant("g", 3000, 30)) == 1
    assert tke.ids_for(DeviceGrant("g", 3000, 30)) == 30
    assert tke.ids_for(DeviceGrant("g", 0, 100)) == 100
    assert tke.ids_for(DeviceGrant("g", 0, 0)) == 1  # a granted GPU is never left unnamed


def test_the_settings_presets_are_the_ones_served() -> None:
    s = parse_settings({"resourcePreset": "volcano", "compatPresets": ["tke"],
                        "deviceSplitCount": 7, "deviceCoreScaling": 1.5})
    got = served(s.resourcePreset, s.compatPresets, split=s.deviceSplitCount,
                 core_scaling=s.deviceCoreScaling)
    assert [(r.name, r.replicas) for r in got] == [("volcano.sh/vgpu-number", 7),
                                                  ("tencent.com/vcuda-core", 150)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].replicas = 1  # type: ignore[misc]


def test_renamed_presets_are_served_under_their_names() -> None:
    s = parse_settings({"resourcePreset": "tke", "compatPresets": ["hami", "vgpu-manager"],
                        "resourceNames": {"tke": {"domain": "inspur.com"},
                                          "hami": {"resourceName": "example.com/gpu"}}})
    presets = s.presets()
    got = served(presets[0], presets[1:], split=5, profiles=["1g.10gb"])
    assert [(r.name, r.socket, r.replicas, r.per_gpu) for r in got] == [
        ("inspur.com/vcuda-core", "vgpud-inspur.com-vcuda-core.sock", 100, PERCENT_IDS),
        ("example.com/gpu", "vgpud-example.com-gpu.sock", 5, VGPU_IDS),
        ("nvidia.com/vgpu-number", "vgpud-vgpu-number.sock", 5, VGPU_IDS),
        ("nvidia.com/mig-1g.10gb", "vgpud-nvidia.com-mig-1g.10gb.sock", 1, VGPU_IDS)]
    # the names the settings replaced are not served
    assert not {"tencent.com/vcuda-core", "nvidia.com/gpu"} & {r.name for r in got}
