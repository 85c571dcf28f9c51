"""The pure decisions: replica IDs, the preferred choice, reconciliation."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from tests.plugin.harness import placement, uuid_of
from vgpud.core.model import Gpu, GpuUsage, NodeInventory, Placement, Reason
from vgpud.node.allocations import allocation_key
from vgpud.node.ids import ReplicaIdError, parse_id, replica_id
from vgpud.node.startup import reconcile
from vgpud.plugin.replicas import advertised, preferred

INV = NodeInventory(devices=tuple(Gpu(uuid_of(i), i, "m", 10000, split=4, numa=i % 2)
                                  for i in range(3)))


def ids(*pairs: tuple[int, int]) -> list[str]:
    return [replica_id(uuid_of(g), i) for g, i in pairs]


def test_ids_round_trip_and_reject_garbage() -> None:
    assert parse_id(replica_id(uuid_of(1), 7)) == (uuid_of(1), 7)
    for bad in ("GPU-x", "GPU-x::", "::3", "GPU-x::a"):
        with pytest.raises(ReplicaIdError):
            parse_id(bad)
    with pytest.raises(ReplicaIdError, match="63"):
        replica_id("G" * 70, 1)


def test_allocation_key_is_order_insensitive() -> None:
    a = ids((0, 1), (2, 3))
    assert allocation_key(a) == allocation_key(reversed(a))
    assert allocation_key(a) != allocation_key(ids((0, 1), (2, 2)))


def test_allocation_key_tells_resources_apart_and_keeps_the_old_default() -> None:
    a = ids((0, 1), (2, 3))
    # the key before several resources: sha256 of the sorted IDs, one a line
    old = hashlib.sha256("\n".join(sorted(a)).encode()).hexdigest()[:24]
    assert allocation_key(a) == allocation_key(a, "nvidia.com/vgpu-number") == old
    keys = {allocation_key(a, r) for r in ("nvidia.com/vgpu-number", "nvidia.com/gpu",
                                           "volcano.sh/vgpu-number", "tencent.com/vcuda-core")}
    assert len(keys) == 4
    assert allocation_key(reversed(a), "nvidia.com/gpu") == allocation_key(a, "nvidia.com/gpu")


def test_advertised_replicas_carry_health_and_numa() -> None:
    sick = NodeInventory(devices=(INV.devices[0], Gpu(uuid_of(1), 1, "m", 1, split=2,
                                                       healthy=False, numa=1)))
    reps = advertised(sick)
    assert [r.id for r in reps][-2:] == ids((1, 0), (1, 1))
    assert [r.healthy for r in reps] == [True] * 4 + [False] * 2
    assert {r.numa for r in reps if r.uuid == uuid_of(1)} == {1}
    assert len(advertised(INV, 100)) == 300  # percent IDs: as many as asked, not split


def test_preferred_percent_ids_take_the_wanted_counts() -> None:
    avail = [replica_id(uuid_of(g), i) for g in range(3) for i in range(100)]

    def gpus(chosen: list[str]) -> dict[str, int]:
        return dict(Counter(parse_id(i)[0] for i in chosen))

    # vcuda-core 30 on GPU 1: 30 IDs there, the lowest numbers
    got = preferred(avail, [], 30, [uuid_of(1)] * 30, per_gpu=100)
    assert got == ids(*((1, i) for i in range(30)))
    # vcuda-core 200 on GPUs 2 and 0: 100 of each
    assert gpus(preferred(avail, [], 200, [uuid_of(2)] * 100 + [uuid_of(0)] * 100,
                          per_gpu=100)) == {uuid_of(2): 100, uuid_of(0): 100}
    # no hint: whole GPUs first, from the GPUs with the most free IDs
    taken = set(ids(*((0, i) for i in range(50))))
    rest = [i for i in avail if i not in taken]
    assert gpus(preferred(rest, [], 30, per_gpu=100)) == {uuid_of(1): 30}
    assert gpus(preferred(rest, [], 200, per_gpu=100)) == {uuid_of(1): 100, uuid_of(2): 100}
    # a GPU without enough free IDs: the rest elsewhere (PreStartContainer judges it)
    few = ids(*((1, i) for i in range(10))) + ids(*((2, i) for i in range(100)))
    assert gpus(preferred(few, [], 30, [uuid_of(1)] * 30, per_gpu=100)) == {
        uuid_of(1): 10, uuid_of(2): 20}


def test_preferred_takes_the_wanted_gpus_then_distinct_ones() -> None:
    avail = ids((0, 0), (0, 1), (1, 0), (1, 2), (2, 3))
    assert preferred(avail, [], 1, [uuid_of(1)]) == ids((1, 0))
    assert preferred(avail, [], 2, [uuid_of(2), uuid_of(0)]) == ids((2, 3), (0, 0))
    two = preferred(avail, [], 2)
    assert len({parse_id(i)[0] for i in two}) == 2  # distinct GPUs when possible
    assert preferred(avail, ids((2, 3)), 2, [uuid_of(2), uuid_of(1)]) == ids((2, 3), (1, 0))
    assert len(preferred(ids((0, 0), (0, 1)), [], 2)) == 2  # falls back to one GPU


def test_reconcile_same_choice_returns_the_placement() -> None:
    p = placement({"main": [(0, 1000, 10)]})
    assert reconcile(p, "main", [uuid_of(0)], INV, {}) is p


def test_reconcile_moves_to_a_gpu_with_room() -> None:
    p = placement({"main": [(0, 1000, 10), (1, 2000, 20)]})
    got = reconcile(p, "main", [uuid_of(0), uuid_of(2)], INV,
                    {uuid_of(2): GpuUsage(vgpus=1, memory=8000, cores=50)})
    assert isinstance(got, Placement)
    assert [(d.uuid, d.memory) for d in got.containers[0].devices] == [
        (uuid_of(0), 1000), (uuid_of(2), 2000)]


@pytest.mark.parametrize(("held", "why"), [
    (GpuUsage(vgpus=1, memory=9500, cores=0), "MiB free"),
    (GpuUsage(vgpus=4, memory=0, cores=0), "no free vGPU"),
    (GpuUsage(vgpus=1, memory=0, cores=95), "cores free"),
    (GpuUsage(vgpus=1, memory=0, cores=0, exclusive=1), "held whole"),
])
def test_reconcile_refuses_a_full_gpu(held: GpuUsage, why: str) -> None:
    p = placement({"main": [(0, 1000, 10)]})
    got = reconcile(p, "main", [uuid_of(2)], INV, {uuid_of(2): held})
    assert isinstance(got, Reason) and why in got.message and got.code == "no-room"


def test_reconcile_rejects_impossible_choices() -> None:
    p = placement({"main": [(0, 1000, 10), (1, 1000, 10)]})
    for chosen, code in (([uuid_of(0), uuid_of(0)], "same-gpu"), ([uuid_of(0)], "count"),
                         ([uuid_of(0), "GPU-nope"], "unknown-gpu")):
        got = reconcile(p, "main", chosen, INV, {})
        assert isinstance(got, Reason) and got.code == code
    got = reconcile(p, "other", [uuid_of(0)], INV, {})
    assert isinstance(got, Reason) and got.code == "no-grant"
