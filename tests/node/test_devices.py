"""The node's device model without a kubelet: how a second discovery changes it
(added, gone then dropped, back, swapped in place), how the MIG strategy shapes what is
offered, and the pieces of MIG discovery that read the driver's files and attributes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio
import anyio.lowlevel
import pytest

from vgpud.core.model import Gpu
from vgpud.node.devices import Changes, DeviceInfo, NodeDevices
from vgpud.node.nvml import cap_minor, mig_profile


def gpu(i: int, uuid: str | None = None, **kw: object) -> DeviceInfo:
    return DeviceInfo(Gpu(uuid or f"GPU-{i}", i, "A100", 81920, **kw), minor=i)  # type: ignore[arg-type]


def instance(parent: int, k: int, profile: str, memory: int) -> DeviceInfo:
    return DeviceInfo(Gpu(f"MIG-{parent}-{k}", parent, f"A100 MIG {profile}", memory,
                          profile=profile, parent=f"GPU-{parent}"), minor=parent, caps=(k,))


def node(found: tuple[DeviceInfo, ...], mig: str = "none") -> NodeDevices:
    return NodeDevices(found, split=4, memory_scaling=1.0, core_scaling=1.0, mig=mig)


def test_a_gone_gpu_is_unhealthy_then_dropped_and_a_new_one_added() -> None:
    d = node((gpu(0), gpu(1), gpu(2)))
    v0 = d.version
    got = d.update((gpu(0), gpu(2), gpu(3)))
    assert got == Changes(added=("GPU-3",), gone=("GPU-1",))
    assert d.version > v0
    inv = {g.uuid: g for g in d.inventory().devices}
    assert not inv["GPU-1"].healthy and "no longer found" in d.reason("GPU-1")
    assert inv["GPU-3"].healthy and inv["GPU-0"].healthy
    v1 = d.version
    assert d.update((gpu(0), gpu(2), gpu(3))) == Changes()  # nothing new: no version bump
    assert d.version == v1
    assert d.drop(("GPU-1",)) and "GPU-1" not in d.uuids
    assert d.changes == {"added": 1, "removed": 1, "replaced": 0}


def test_a_gpu_found_again_before_the_drop_comes_back_healthy() -> None:
    d = node((gpu(0), gpu(1)))
    d.update((gpu(0),))
    assert not d.healthy("GPU-1")
    d.update((gpu(0), gpu(1)))
    assert d.healthy("GPU-1") and d.reason("GPU-1") == ""
    assert not d.drop(("GPU-1",))  # it is back: not dropped
    assert d.uuids == ["GPU-0", "GPU-1"]


def test_a_new_uuid_at_a_gone_gpus_index_is_a_swap() -> None:
    d = node((gpu(0), gpu(1)))
    got = d.update((gpu(0), gpu(1, "GPU-1-new")))
    assert got.replaced == (("GPU-1", "GPU-1-new"),) and got.gone == ("GPU-1",)
    assert d.info("GPU-1-new") is not None and d.healthy("GPU-1-new")
    assert d.changes["replaced"] == 1 and d.changes["added"] == 0


def test_health_events_of_a_gone_gpu_change_nothing() -> None:
    from vgpud.node.devices import HealthEvent

    d = node((gpu(0), gpu(1)))
    d.update((gpu(0),))
    v = d.version
    assert not d.apply(HealthEvent("GPU-1", True, "probe passed"))
    assert d.version == v and not d.healthy("GPU-1")


@pytest.mark.parametrize(("strategy", "offered", "profiles", "splits"), [
    ("none", ["GPU-0"], [""], [4]),
    ("single", ["GPU-0", "MIG-0-0", "MIG-0-1"], ["", "", ""], [4, 4, 4]),
    ("mixed", ["GPU-0", "MIG-0-0", "MIG-0-1"], ["", "1g.10gb", "3g.40gb"], [4, 1, 1]),
])
def test_the_mig_strategy_shapes_what_is_offered(strategy: str, offered: list[str],
                                                  profiles: list[str], splits: list[int]) -> None:
    found = (gpu(0, mig=True), instance(0, 0, "1g.10gb", 9728), instance(0, 1, "3g.40gb", 38912))
    inv = node(found, strategy).inventory()
    assert [g.uuid for g in inv.devices] == offered
    assert [g.profile for g in inv.devices] == profiles
    assert [g.split for g in inv.devices] == splits
    assert inv.devices[0].mig


def test_cap_minors_come_from_the_drivers_capability_files(tmp_path: Path) -> None:
    gi = tmp_path / "gpu3" / "mig" / "gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 30\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 31\n")
    assert cap_minor(3, "gi2/access", tmp_path) == 30
    assert cap_minor(3, "gi2/ci0/access", tmp_path) == 31
    assert cap_minor(3, "gi9/access", tmp_path) is None
    (gi / "access").write_text("garbage\n")
    assert cap_minor(3, "gi2/access", tmp_path) is None


def test_profile_names_follow_nvidias_rule() -> None:
    def attrs(g: int, c: int, mib: int) -> SimpleNamespace:
        return SimpleNamespace(gpuInstanceSliceCount=g, computeInstanceSliceCount=c,
                               memorySizeMB=mib)

    # a real A100 80GB (81920 MiB) and A100 40GB (40960 MiB): the names nvidia-smi prints
    for g, mib, name in [(1, 9728, "1g.10gb"), (2, 19968, "2g.20gb"), (3, 40192, "3g.40gb"),
                         (4, 40192, "4g.40gb"), (7, 80896, "7g.80gb")]:
        assert mig_profile(attrs(g, g, mib), 81920) == name
    for g, mib, name in [(1, 4864, "1g.5gb"), (2, 9984, "2g.10gb"), (3, 20096, "3g.20gb"),
                         (7, 40192, "7g.40gb")]:
        assert mig_profile(attrs(g, g, mib), 40960) == name
    assert mig_profile(attrs(2, 1, 19968), 81920) == "1c.2g.20gb"  # a CI of a 2g


@pytest.mark.anyio
async def test_wait_change_wakes_on_update() -> None:
    d = node((gpu(0),))
    seen = d.version
    got: list[int] = []

    async def waiter() -> None:
        got.append(await d.wait_change(seen))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            d.update((gpu(0), gpu(1)))
    assert got == [d.version] and d.version > seen


def test_a_known_gpu_whose_index_shifted_is_updated_not_replaced() -> None:
    d = node((gpu(0), gpu(1), gpu(2)))
    shifted = DeviceInfo(Gpu("GPU-2", 1, "A100", 81920), minor=2)  # GPU 1 left the bus
    v = d.version
    got = d.update((gpu(0), shifted))
    assert got == Changes(gone=("GPU-1",))
    assert {g.uuid: g.index for g in d.inventory().devices}["GPU-2"] == 1
    assert d.version > v
