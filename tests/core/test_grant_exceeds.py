"""A grant is believed only within what the pod asks (issue 23, finding 1)."""

from __future__ import annotations

from vgpud.core.fit import grant_exceeds
from vgpud.core.model import (
    ContainerGrant,
    ContainerRequest,
    DeviceGrant,
    Gpu,
    NodeInventory,
    Placement,
    PodRequest,
)

INV = NodeInventory((Gpu("GPU-a", 0, "A", 16384), Gpu("GPU-b", 1, "A", 24576)),
                    memory_scaling=1.0)


def pod(*containers: ContainerRequest) -> PodRequest:
    return PodRequest("ns", "p", "uid", containers)


def grant(*devices: tuple[str, int, int], name: str = "main") -> Placement:
    return Placement("n", (ContainerGrant(name, False, tuple(
        DeviceGrant(u, m, c) for u, m, c in devices)),))


def test_a_grant_as_asked_is_believed() -> None:
    asks = pod(ContainerRequest("main", 2, memory=4000, cores=30))
    assert grant_exceeds(grant(("GPU-a", 4000, 30), ("GPU-b", 4000, 30)), asks, INV) is None
    assert grant_exceeds(grant(("GPU-a", 3000, 20)), asks, INV) is None  # less: fine


def test_more_vgpus_memory_or_cores_than_asked_is_not() -> None:
    asks = pod(ContainerRequest("main", 1, memory=4000, cores=30))
    assert "asks for 1 vGPU" in str(grant_exceeds(
        grant(("GPU-a", 4000, 30), ("GPU-b", 4000, 30)), asks, INV))
    assert "at most 4000 MiB" in str(grant_exceeds(grant(("GPU-a", 4001, 30)), asks, INV))
    assert "30 % of GPU GPU-a" in str(grant_exceeds(grant(("GPU-a", 4000, 31)), asks, INV))
    assert "asks for no vGPU" in str(grant_exceeds(
        grant(("GPU-a", 1, 0), name="sidecar"), asks, INV))


def test_a_percentage_is_of_the_largest_gpu_since_a_move_keeps_the_mib() -> None:
    """50 % placed on the 24 GiB GPU is 12,288 MiB; kubelet moving the vGPU to the 16 GiB
    one keeps the MiB (the plugin's reassignment), which is still within the request;
    more than half the largest GPU is not."""
    asks = pod(ContainerRequest("main", 1, memory_percent=50))
    assert grant_exceeds(grant(("GPU-a", 12288, 0)), asks, INV) is None
    assert grant_exceeds(grant(("GPU-a", 12289, 0)), asks, INV) is not None


def test_a_container_granted_nothing_needs_no_request() -> None:
    asks = pod(ContainerRequest("main", 1, memory=1000))
    both = Placement("n", (ContainerGrant("main", False, (DeviceGrant("GPU-a", 1000, 0),)),
                           ContainerGrant("init", True, ())))
    assert grant_exceeds(both, asks, INV) is None
