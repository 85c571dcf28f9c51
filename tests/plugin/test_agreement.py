"""The scheduler and the plugin judge one GPU by the same rules.

The scheduler decides where a pod goes; the plugin re-checks when kubelet picks other
GPUs, and publishes the node's capacity. If the two disagree on a GPU's capacity, one
admits what the other refuses.
"""

from __future__ import annotations

from tests.plugin.harness import placement, uuid_of
from vgpud.core.allocate import Allocator
from vgpud.core.model import Gpu, GpuUsage, Node, NodeInventory, Placement
from vgpud.core.requests import parse_pod
from vgpud.node.inventory import extended_resources
from vgpud.node.startup import reconcile


def _inventory(core_scaling: float) -> NodeInventory:
    return NodeInventory(devices=tuple(Gpu(uuid_of(i), i, "m", 10000, split=4)
                                       for i in range(2)), core_scaling=core_scaling)


def test_core_scaling_1_15_gives_115_percent_to_scheduler_and_plugin() -> None:
    inv = _inventory(1.15)
    alloc = Allocator()
    alloc.set_node(Node("n", inv))
    # the scheduler: 60 % + 40 % are held on GPU 1; 15 % more fits
    alloc.confirm("u0", "default/a", placement({"main": [(1, 1000, 60)]}, node="n"))
    alloc.confirm("u1", "default/b", placement({"main": [(1, 1000, 40)]}, node="n"))
    assert alloc.cluster.capacity("n", uuid_of(1)) == GpuUsage(4, 10000, 115, 1)
    pod15 = {"metadata": {"name": "p15", "uid": "u15", "annotations": {
                 "nvidia.com/include-gpu-uuid": uuid_of(1)}},
             "spec": {"containers": [{"name": "main", "resources": {"limits": {
                 "nvidia.com/vgpu-memory": "1000", "nvidia.com/vgpu-cores": "15"}}}]}}
    assert alloc.filter(parse_pod(pod15, alloc.defaults), ["n"]).feasible == ["n"]

    # the plugin: kubelet put a 15 % container on GPU 1 instead of GPU 0
    moved = placement({"main": [(0, 1000, 15)]}, node="n")
    got = reconcile(moved, "main", [uuid_of(1)], inv,
                    {uuid_of(1): GpuUsage(vgpus=2, memory=2000, cores=100)})
    assert isinstance(got, Placement), got
    # and the capacity it publishes
    assert extended_resources(inv, cores=True, memory=False) == {"nvidia.com/vgpu-cores": "230"}
    # the vgpu-manager preset's names, as the settings' resourceNames move them
    assert extended_resources(inv, cores=True, memory=False,
                              names=("corp.example/vgpu-cores", "corp.example/vgpu-memory"),
                              ) == {"corp.example/vgpu-cores": "230"}
