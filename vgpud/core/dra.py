"""Names vgpud's DRA driver shares between its two halves (the ResourceSlices it publishes
and the claims it prepares): the driver, the devices' capacities, the device names.

Pure values only; the slice builder and the claim reader live beside them as they land.
"""

from __future__ import annotations

DRIVER = "gpu.vgpud.io"  # a DNS subdomain, as resource.k8s.io requires of a driver name
CAPACITY_MEMORY = "memory"  # bytes of device memory a claim consumes
CAPACITY_CORES = "cores"  # percent of the GPU's SMs a claim consumes (0-100)
NODE_MODE_LABEL = "vgpud.io/node-mode"  # "device-plugin" (default) or "dra"
MODE_DRA = "dra"
MODE_DEVICE_PLUGIN = "device-plugin"


def device_name(index: int) -> str:
    """The ResourceSlice device name of the node's GPU ``index`` (``gpu-0``, ``gpu-1``)."""
    return f"gpu-{index}"
