"""What a container needs from the node to use its GPU slice, as one value.

:class:`ContainerEdits` is the union of everything kubelet (or, later, a DRA driver's
CDI spec) applies to a container: environment, device nodes, CDI device names and
mounts. It is built here, per vendor and per piece, and only *translated* by the
kubelet-facing adapter (:mod:`vgpud.plugin.service` into a ``ContainerAllocateResponse``),
so a second adapter or a second vendor adds a builder, not a servicer.

* :func:`nvidia_gpus` — the GPUs themselves: ``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA
  container runtime's ``env`` mode), CDI names ``nvidia.com/gpu=<uuid>`` (``cdi``), or
  the device nodes ``/dev/nvidiaN`` plus the control devices (``device-specs``; a MIG
  instance adds its ``/dev/nvidia-caps/nvidia-capN`` access devices), and
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's ordinals follow the limits file's order;
* :func:`shim` — the shim library and the read-only ``/etc/ld.so.preload`` naming it;
* :func:`allocation_dirs` — the per-allocation directories: the read-only config
  (limits file, registration socket), the writable usage state, and the node's
  read-only priority records.

No limit travels by environment: a pod's own env is applied after the node's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vgpud.node.allocations import Allocation
from vgpud.node.devices import DeviceInfo
from vgpud.node.registration import SOCKET_NAME
from vgpud.node.shim import ShimFiles

CONFIG_DIR = "/etc/vgpud"
STATE_DIR = "/var/run/vgpud"
REGISTER = f"{CONFIG_DIR}/{SOCKET_NAME}"
ARBITER_DIR = "/var/run/vgpud-arbiter"
PRELOAD = "/etc/ld.so.preload"
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NVIDIA_CAPS = "/dev/nvidia-caps"  # a MIG instance's access devices: nvidia-cap<minor>

VisibleMode = Literal["env", "cdi", "device-specs"]


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: tuple[tuple[str, str], ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits(self.env + other.env, self.devices + other.devices,
                              self.cdi_devices + other.cdi_devices, self.mounts + other.mounts)


def nvidia_gpus(gpus: Sequence[DeviceInfo], mode: VisibleMode) -> ContainerEdits:
    """The edits that make ``gpus`` (in index order) visible, by ``mode``."""
    order = (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)
    if mode == "env":
        return ContainerEdits(env=(("NVIDIA_VISIBLE_DEVICES",
                                    ",".join(d.gpu.uuid for d in gpus)), *order))
    if mode == "cdi":
        return ContainerEdits(env=order,
                              cdi_devices=tuple(f"nvidia.com/gpu={d.gpu.uuid}" for d in gpus))
    paths = list(dict.fromkeys(
        [f"/dev/nvidia{d.minor}" for d in gpus]
        + [f"{NVIDIA_CAPS}/nvidia-cap{c}" for d in gpus for c in d.caps]))
    paths += NVIDIA_CONTROL_DEVICES
    return ContainerEdits(env=order, devices=tuple(DeviceNode(p, p) for p in paths))


def shim(files: ShimFiles | None) -> ContainerEdits:
    """The shim library and the preload file naming it (nothing without a shim)."""
    if files is None:
        return ContainerEdits()
    return ContainerEdits(mounts=(
        Mount(files.container_lib, str(files.host_lib), True),
        Mount(PRELOAD, str(files.host_preload), True)))


def allocation_dirs(alloc: Allocation, arbiter: Path | None) -> ContainerEdits:
    """The allocation's config (read-only) and state (writable) directories, and the
    node's priority records (read-only) when the arbiter runs."""
    mounts = [Mount(CONFIG_DIR, str(alloc.etc), True), Mount(STATE_DIR, str(alloc.state), False)]
    if arbiter is not None:
        mounts.append(Mount(ARBITER_DIR, str(arbiter), True))
    return ContainerEdits(mounts=tuple(mounts))
