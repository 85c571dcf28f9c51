"""What a container needs from the node to use its GPU slice, as one value.

:class:`ContainerEdits` is the union of everything kubelet (or, later, a DRA driver's
CDI spec) applies to a container: environment, device nodes, CDI device names and
mounts. It is built here and by the vendor's backend (:mod:`vgpud.node.vendors`: the
GPUs themselves), piece by piece, and only *translated* by the kubelet-facing adapter
(:mod:`vgpud.plugin.service` into a ``ContainerAllocateResponse``), so a second adapter
or a second vendor adds a builder, not a servicer.

* :func:`shim` — the shim library and the read-only ``/etc/ld.so.preload`` naming it;
* :func:`allocation_dirs` — the per-allocation directories: the read-only config
  (limits file, registration socket), the writable usage state, and the node's
  read-only priority records.

No limit travels by environment: a pod's own env is applied after the node's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpud.node.allocations import Allocation
from vgpud.node.registration import SOCKET_NAME
from vgpud.node.shim import ShimFiles

CONFIG_DIR = "/etc/vgpud"
STATE_DIR = "/var/run/vgpud"
REGISTER = f"{CONFIG_DIR}/{SOCKET_NAME}"
ARBITER_DIR = "/var/run/vgpud-arbiter"
PRELOAD = "/etc/ld.so.preload"


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
