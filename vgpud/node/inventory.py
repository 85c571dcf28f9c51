"""Publishing the node's inventory: the ``vgpud.io/node-devices`` annotation and,
behind the CorePlugin / MemoryPlugin feature gates, the extended resources
``nvidia.com/vgpu-cores`` and ``nvidia.com/vgpu-memory`` in the node's capacity (the
vgpu-manager preset's cores and memory names: the settings' ``resourceNames`` may move
them, ``example.com/vgpu-memory``).

The annotation is written only when it differs from what the node carries. The
extended resources are set in ``status.capacity`` (kubelet copies them to
allocatable), not through device-plugin sockets: one device per MiB would exceed
kubelet's gRPC message limit on any large GPU. ResourceQuota can then bound
``requests.nvidia.com/vgpu-memory`` and kubelet admission checks the node total.
"""

from __future__ import annotations

import dataclasses

import anyio
import structlog

from vgpud.core.codec import NODE_DEVICES, encode_node_devices
from vgpud.core.model import NodeInventory
from vgpud.kube.errors import KubeError
from vgpud.node.cluster import ClusterApi
from vgpud.node.devices import NodeDevices

log = structlog.get_logger(__name__)

CORES = "nvidia.com/vgpu-cores"
MEMORY = "nvidia.com/vgpu-memory"


def extended_resources(inv: NodeInventory, *, cores: bool, memory: bool,
                       names: tuple[str, str] = (CORES, MEMORY)) -> dict[str, str]:
    """The node's totals over healthy GPUs, as quantity strings, under ``names`` (cores,
    memory)."""
    caps = [inv.capacity(g) for g in inv.devices if g.healthy and not g.mig]
    out = {}
    if cores:
        out[names[0]] = str(sum(c.cores for c in caps))
    if memory:
        out[names[1]] = str(sum(c.memory for c in caps))
    return out


async def publish_inventory(
    node: str,
    devices: NodeDevices,
    cluster: ClusterApi,
    *,
    cores: bool = False,
    memory: bool = False,
    links: bool = True,
    names: tuple[str, str] = (CORES, MEMORY),
    recheck: float = 60.0,
    retry: float = 5.0,
) -> None:
    """Keep the node's annotation (and extended resources) equal to ``devices``. Forever.

    Each round reads the node once; a round runs on every inventory change and after
    ``recheck`` quiet seconds (in case something removed the annotation).
    """
    published: str | None = None
    while True:
        inventory = devices.inventory()
        if not links:  # GPUTopology off: the node's NVLink pairs are not published
            inventory = dataclasses.replace(inventory, devices=tuple(
                dataclasses.replace(g, links=()) for g in inventory.devices))
        text = encode_node_devices(inventory)
        seen = devices.version
        try:
            current = await cluster.node_annotation(node, NODE_DEVICES)
            if current != text:
                await cluster.set_node_annotation(node, NODE_DEVICES, text)
                log.info("inventory_published", node=node, gpus=len(devices.uuids))
            if (cores or memory) and text != published:
                res = extended_resources(devices.inventory(), cores=cores, memory=memory,
                                         names=names)
                await cluster.set_node_resources(node, res)
            published = text
        except KubeError as e:
            log.warning("inventory_publish_failed", node=node, error=str(e))
            await anyio.sleep(retry)
            continue
        with anyio.move_on_after(recheck):
            await devices.wait_change(seen)
