"""The container edits the node builds, by visibility mode and piece."""

from __future__ import annotations

from pathlib import Path

from vgpud.core.model import Gpu
from vgpud.node import edits
from vgpud.node.allocations import Allocation
from vgpud.node.devices import DeviceInfo
from vgpud.node.shim import ShimFiles
from vgpud.node.vendors import NVIDIA_CONTROL_DEVICES, Nvidia

GPUS = [DeviceInfo(Gpu(f"GPU-{i}", i, "A100", 40960), minor=i + 3) for i in range(2)]


class _NoSource:
    """The edits never ask the source."""


NVIDIA = Nvidia(_NoSource())  # type: ignore[arg-type]


def test_each_mode_names_the_gpus_its_own_way_and_orders_cuda_by_bus() -> None:
    env = NVIDIA.gpu_edits(GPUS, "env")
    assert dict(env.env) == {"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1",
                             "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert env.devices == () and env.cdi_devices == ()
    cdi = NVIDIA.gpu_edits(GPUS, "cdi")
    assert cdi.cdi_devices == ("nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1")
    assert "NVIDIA_VISIBLE_DEVICES" not in dict(cdi.env)
    specs = NVIDIA.gpu_edits(GPUS, "device-specs")
    assert [d.host_path for d in specs.devices] == [
        "/dev/nvidia3", "/dev/nvidia4", *NVIDIA_CONTROL_DEVICES]
    assert {d.permissions for d in specs.devices} == {"rw"}


def test_shim_and_directories_are_read_only_but_the_state() -> None:
    files = ShimFiles("0.1.0", Path("/usr/local/vgpud/libvgpu.so.0.1.0"),
                      "/usr/local/vgpud/libvgpu.so.0.1.0", Path("/usr/local/vgpud/preload"))
    alloc = Allocation(key="k", ids=("GPU-0::0",), dir=Path("/var/lib/vgpud/allocations/k"),
                       owner=None, configured=0.0)
    e = (edits.shim(files) + edits.allocation_dirs(alloc, Path("/var/lib/vgpud/arbiter")))
    mounts = {m.container_path: (m.host_path, m.read_only) for m in e.mounts}
    assert mounts == {
        "/usr/local/vgpud/libvgpu.so.0.1.0": ("/usr/local/vgpud/libvgpu.so.0.1.0", True),
        edits.PRELOAD: ("/usr/local/vgpud/preload", True),
        edits.CONFIG_DIR: ("/var/lib/vgpud/allocations/k/etc", True),
        edits.STATE_DIR: ("/var/lib/vgpud/allocations/k/state", False),
        edits.ARBITER_DIR: ("/var/lib/vgpud/arbiter", True),
    }
    assert edits.shim(None) == edits.ContainerEdits()
    assert not any(k.startswith("VGPUD_") for k, _ in e.env)  # no limit by env


def test_the_backend_is_chosen_in_one_place() -> None:
    """The fake file's devices are NVIDIA-shaped, with NVIDIA's edits; without one,
    NVML's (not started here: discovery runs only when the plugin starts)."""
    from vgpud.node.fakegpus import FakeGpus
    from vgpud.node.nvml import NvmlGpus
    from vgpud.node.vendors import backend

    fake = backend("/nonexistent/devices.json")
    assert (fake.name, fake.cdi_kind) == ("fake", "nvidia.com/gpu")
    assert isinstance(fake.source, FakeGpus)
    real = backend(None)
    assert real.name == "nvidia" and isinstance(real.source, NvmlGpus)
    assert fake.gpu_edits(GPUS, "cdi") == NVIDIA.gpu_edits(GPUS, "cdi")
