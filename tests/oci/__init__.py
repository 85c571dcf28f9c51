"""A harness that runs programs in real OCI containers (runc) with what vgpud's device
plugin returns from ``Allocate`` applied the way kubelet and containerd apply it.

- :mod:`tests.oci.kubelet`: the plugin's ``ContainerAllocateResponse`` → container options
  (pure; the kubelet/containerd behaviour it follows is listed there);
- :mod:`tests.oci.runtime`: bundles, ``runc run``/``exec``/``kill``/``delete``, cgroups;
- ``conftest.py``: the ``runc``, ``node``, ``compile_c`` and ``probe`` fixtures.
"""

from tests.oci.kubelet import Bind, DeviceRunOptions, DeviceSpec, HarnessError
from tests.oci.runtime import (
    DRIVER_DIR,
    Completed,
    Container,
    Node,
    Process,
    Runc,
    RuncUnavailable,
)

__all__ = [
    "DRIVER_DIR",
    "Bind",
    "Completed",
    "Container",
    "DeviceRunOptions",
    "DeviceSpec",
    "HarnessError",
    "Node",
    "Process",
    "Runc",
    "RuncUnavailable",
]
