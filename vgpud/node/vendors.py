"""GPU vendors: where a node's GPUs come from, and what a container needs to use them.

A :class:`Backend` pairs a source of devices (:class:`~vgpud.node.devices.GpuSource`:
discovery, health, memory and process queries) with its vendor's container edits for
those devices (environment, device nodes, CDI names). The node runtime and the adapters
(the device plugin today, a DRA driver next) ask the backend and never name a vendor;
:func:`backend` is the one place that chooses.

NVIDIA is the first vendor (:class:`Nvidia`): NVML's devices, made visible by the
NVIDIA container runtime's ``NVIDIA_VISIBLE_DEVICES`` (``env``), by CDI names
``nvidia.com/gpu=<uuid>`` (``cdi``), or by their device nodes (``device-specs``:
``/dev/nvidiaN``, a MIG instance's ``/dev/nvidia-caps/nvidia-capN`` access devices, and
the control devices), with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's ordinals follow
the limits file's order. The fake file (``--fake-devices``) is the second source, of
NVIDIA-shaped devices with NVIDIA's edits, so a test node takes every path a real one
does. MIG is NVIDIA's, in its source and its edits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from vgpud.node.devices import DeviceInfo, GpuSource
from vgpud.node.edits import ContainerEdits, DeviceNode

VisibleMode = Literal["env", "cdi", "device-specs"]

NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NVIDIA_CAPS = "/dev/nvidia-caps"  # a MIG instance's access devices: nvidia-cap<minor>


class Backend(Protocol):
    """A vendor's devices on this node, and how a container is given some of them."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> GpuSource: ...

    @property
    def cdi_kind(self) -> str:
        """The CDI kind of its devices (``vendor.com/class``)."""
        ...

    def gpu_edits(self, gpus: Sequence[DeviceInfo], mode: VisibleMode) -> ContainerEdits:
        """The edits that make ``gpus`` (in index order) visible, by ``mode``."""
        ...


@dataclass(frozen=True, slots=True)
class Nvidia:
    """NVIDIA GPUs from ``source`` (NVML on a node, the fake file in tests)."""

    source: GpuSource
    name: str = "nvidia"
    cdi_kind: str = "nvidia.com/gpu"

    def gpu_edits(self, gpus: Sequence[DeviceInfo], mode: VisibleMode) -> ContainerEdits:
        order = (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)
        if mode == "env":
            return ContainerEdits(env=(("NVIDIA_VISIBLE_DEVICES",
                                        ",".join(d.gpu.uuid for d in gpus)), *order))
        if mode == "cdi":
            return ContainerEdits(env=order, cdi_devices=tuple(
                f"{self.cdi_kind}={d.gpu.uuid}" for d in gpus))
        paths = list(dict.fromkeys(
            [f"/dev/nvidia{d.minor}" for d in gpus]
            + [f"{NVIDIA_CAPS}/nvidia-cap{c}" for d in gpus for c in d.caps]))
        paths += NVIDIA_CONTROL_DEVICES
        return ContainerEdits(env=order, devices=tuple(DeviceNode(p, p) for p in paths))


def backend(fake_devices: str | None = None) -> Backend:
    """The node's backend: the fake file's devices when one is named, else NVML's."""
    if fake_devices:
        from vgpud.node.fakegpus import FakeGpus

        return Nvidia(FakeGpus(fake_devices), name="fake")
    from vgpud.node.nvml import NvmlGpus

    return Nvidia(NvmlGpus())
