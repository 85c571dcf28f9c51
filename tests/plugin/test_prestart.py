"""The plugin's pure decisions (vgpud.node.startup), without kubelet or an API."""

from __future__ import annotations

from tests.plugin.harness import NODE, placement, uuid_of
from vgpud.core.codec import ASSIGNMENT, assignment_of, encode_assignment
from vgpud.core.limits import DeviceLimits
from vgpud.core.model import ComputePolicy, Gpu, GpuUsage, NodeInventory, Placement
from vgpud.node.startup import (
    NEEDS_OTHERS,
    Assignment,
    Configure,
    Refuse,
    held_by_others,
    plan,
    stale,
    wanted,
)

INV = NodeInventory(devices=tuple(Gpu(uuid_of(i), i, "m", 10000, split=4) for i in range(3)))
WHERE = "pod default/p container 'main'"


def annotations(p: Placement | str | None) -> Assignment:
    """The pod's assignment as its projection decodes it from the annotation."""
    if p is None:
        return None
    return assignment_of({ASSIGNMENT: encode_assignment(p) if isinstance(p, Placement) else p})


def decide(p: Placement | str | None, chosen: list[str], *, container: str = "main",
           others: dict[str, GpuUsage] | None = None, per_gpu: int = 1) -> object:
    return plan(WHERE, annotations(p), node=NODE, container=container, chosen=chosen,
                inventory=INV, state_dir="/var/run/vgpud", others=others, per_gpu=per_gpu)


def test_kubelet_followed_the_assignment_write_its_limits() -> None:
    p = placement({"main": [(2, 3000, 100), (0, 1000, 0)]})
    got = decide(p, [uuid_of(0), uuid_of(2)])
    assert isinstance(got, Configure) and not got.rewrite and got.placement == p
    assert got.limits.devices == (  # in the node's index order: CUDA's order
        DeviceLimits(uuid_of(0), 1000 << 20, 0, ComputePolicy.FIXED),
        DeviceLimits(uuid_of(2), 3000 << 20, 100, ComputePolicy.FIXED))
    assert got.limits.state_dir == "/var/run/vgpud" and got.limits.container == "main"


def test_kubelet_chose_other_gpus_ask_what_the_others_hold_then_rewrite() -> None:
    p = placement({"main": [(0, 4000, 20)]})
    assert decide(p, [uuid_of(1)]) is NEEDS_OTHERS
    got = decide(p, [uuid_of(1)], others={uuid_of(1): GpuUsage(1, 6000, 80)})
    assert isinstance(got, Configure) and got.rewrite
    assert [d.uuid for d in got.grant.devices] == [uuid_of(1)]
    full = decide(p, [uuid_of(1)], others={uuid_of(1): GpuUsage(1, 6001, 0)})
    assert isinstance(full, Refuse) and "3999 MiB free, needs 4000" in full.message
    assert full.message.startswith(WHERE)


def test_refusals_name_the_pod_and_what_is_wrong() -> None:
    cases = [
        (None, [uuid_of(0)], "has no vgpud.io/assignment"),
        ('{"v": 1, "node": "gpu-node-1", "con', [uuid_of(0)], "malformed assignment"),
        (placement({"main": [(0, 1, 1)]}, node="elsewhere"), [uuid_of(0)], "for node"),
        (placement({"other": [(0, 1, 1)]}), [uuid_of(0)], "no GPU for container"),
        (placement({"main": [(0, 1, 1), (1, 1, 1)]}), [uuid_of(0), uuid_of(0)], "distinct"),
        (placement({"main": [(0, 1, 1)]}), [uuid_of(0), uuid_of(1)], "2 vGPUs"),
        (placement({"main": [(0, 1, 1)]}), ["GPU-gone"], "does not report"),
    ]
    for p, chosen, why in cases:
        got = decide(p, chosen)  # none of these needs to know about the other pods
        assert isinstance(got, Refuse), (p, got)
        assert why in got.message and got.message.startswith(WHERE)


def test_percent_ids_name_each_gpu_once_and_must_match_the_grant() -> None:
    p = placement({"main": [(1, 3072, 30)]})
    got = decide(p, [uuid_of(1)] * 30, per_gpu=100)  # TKE vcuda-core 30: one GPU, 30 %
    assert isinstance(got, Configure) and not got.rewrite
    assert [(d.uuid, d.memory_limit, d.core_limit) for d in got.limits.devices] == [
        (uuid_of(1), 3072 << 20, 30)]
    whole = placement({"main": [(0, 10000, 100), (2, 10000, 100)]})
    got = decide(whole, [uuid_of(2)] * 100 + [uuid_of(0)] * 100, per_gpu=100)
    assert isinstance(got, Configure)
    assert [d.uuid for d in got.limits.devices] == [uuid_of(0), uuid_of(2)]
    # the same IDs counted as vGPUs are 30 vGPUs of one GPU: refused
    assert isinstance(decide(p, [uuid_of(1)] * 30), Refuse)
    # kubelet's IDs of a GPU disagree with the grant there
    short = decide(whole, [uuid_of(2)] * 150 + [uuid_of(0)] * 50, per_gpu=100)
    assert isinstance(short, Refuse)
    assert f"50 device IDs of GPU {uuid_of(0)} (50 % of it)" in short.message
    assert "grants 100 %" in short.message and short.message.startswith(WHERE)
    # moved onto another GPU with room: the move is checked like a vGPU's
    assert decide(p, [uuid_of(2)] * 30, per_gpu=100) is NEEDS_OTHERS
    moved = decide(p, [uuid_of(2)] * 30, per_gpu=100, others={})
    assert isinstance(moved, Configure) and moved.rewrite
    assert [d.uuid for d in moved.grant.devices] == [uuid_of(2)]


def test_what_other_pods_hold_leaves_out_me_ended_pods_and_garbage() -> None:
    a = encode_assignment(placement({"x": [(0, 1000, 10)], "y": [(0, 2000, 20)]}))
    b = encode_assignment(placement({"x": [(0, 500, 5)]}))
    pods = [(ns, name, phase, assignment_of(notes)) for ns, name, phase, notes in [
        ("ns", "a", "Running", {ASSIGNMENT: a}), ("ns", "me", "Pending", {ASSIGNMENT: b}),
        ("ns", "done", "Succeeded", {ASSIGNMENT: b}), ("ns", "bad", "Running", {ASSIGNMENT: "{"}),
        ("ns", "plain", "Running", {}), ("other", "b", "Pending", {ASSIGNMENT: b})]]
    assert held_by_others(pods, ("ns", "me")) == {uuid_of(0): GpuUsage(3, 3500, 35, 0)}


def test_wanted_follows_the_waiting_container_with_that_many_vgpus() -> None:
    notes = {("ns", "a"): annotations(placement({"one": [(1, 1, 1)], "two": [(0, 1, 1),
                                                                          (2, 1, 1)]})),
             ("ns", "b"): annotations("{")}
    waiting = {("ns", "b"): {"x"}, ("ns", "a"): {"two", "one"}}
    assert wanted(waiting, notes, 2) == [uuid_of(0), uuid_of(2)]
    assert wanted(waiting, notes, 1) == [uuid_of(1)]
    assert wanted(waiting, notes, 3) == []


def test_wanted_in_percent_ids_repeats_each_gpu_by_its_cores() -> None:
    notes = {("ns", "a"): annotations(placement({"one": [(1, 1, 30)],
                                                 "two": [(0, 1, 100), (2, 1, 100)]}))}
    waiting = {("ns", "a"): {"one", "two"}}
    assert wanted(waiting, notes, 30, per_gpu=100) == [uuid_of(1)] * 30
    assert wanted(waiting, notes, 200, per_gpu=100) == [uuid_of(0)] * 100 + [uuid_of(2)] * 100
    assert wanted(waiting, notes, 1, per_gpu=100) == []


def test_stale_allocations_are_unlisted_and_old_enough() -> None:
    live = {frozenset({"g::1"})}
    allocs = [("kept", frozenset({"g::1"}), 0.0), ("young", frozenset({"g::2"}), 90.0),
              ("old", frozenset({"g::3"}), 10.0)]
    assert stale(allocs, live, now=100.0, grace=30.0) == ["old"]
    # keyed with their resource: the same IDs of another resource are not kept alive
    by = [("vgpu", ("nvidia.com/vgpu-number", frozenset({"g::1"})), 0.0),
          ("hami", ("nvidia.com/gpu", frozenset({"g::1"})), 0.0)]
    assert stale(by, {("nvidia.com/vgpu-number", frozenset({"g::1"}))}, now=100.0,
                 grace=30.0) == ["hami"]
