"""What one container is told: the shim's limits file and the visible devices.

Pure: takes the scheduler's :class:`~vgpud.core.model.ContainerGrant` and the node's
inventory, returns text and names. The plugin writes them (``vgpud.plugin``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpud.core.model import ComputePolicy, ContainerGrant, NodeInventory

MIB = 1 << 20
CONFIG_VERSION = 1


class GrantError(ValueError):
    """The grant names a GPU this node does not have."""


@dataclass(frozen=True, slots=True)
class ShimConfig:
    """The per-container limits, in CUDA ordinal order inside the container."""

    text: str
    visible_uuids: tuple[str, ...]


def render_shim_config(
    grant: ContainerGrant,
    inventory: NodeInventory,
    *,
    compute_policy: ComputePolicy,
    priority: int,
    state_dir: str,
) -> ShimConfig:
    """The limits file of DESIGN.md for one container.

    Devices are listed in the node's GPU index order, which is the order CUDA
    enumerates them in the container (the plugin sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    and the shim also matches each entry by UUID).
    """
    by_uuid = {g.uuid: g for g in inventory.devices}
    missing = [d.uuid for d in grant.devices if d.uuid not in by_uuid]
    if missing:
        raise GrantError(f"container {grant.name!r} was assigned GPUs this node does not have: "
                         + ", ".join(missing))
    devices = sorted(grant.devices, key=lambda d: by_uuid[d.uuid].index)
    oversubscribe = 1 if inventory.memory_scaling > 1.0 else 0
    lines = [f"version={CONFIG_VERSION}", f"# container {grant.name}"]
    for i, d in enumerate(devices):
        cores = 0 if d.cores >= 100 else d.cores
        lines += [
            f"device.{i}.uuid={d.uuid}",
            f"device.{i}.memory_limit={d.memory * MIB}",
            f"device.{i}.core_limit={cores}",
            f"device.{i}.core_policy={compute_policy.value}",
            f"device.{i}.oversubscribe={oversubscribe}",
        ]
    lines += [f"priority={priority}", f"state_dir={state_dir}", ""]
    return ShimConfig(text="\n".join(lines), visible_uuids=tuple(d.uuid for d in devices))
