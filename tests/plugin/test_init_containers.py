"""Which regular init container kubelet is starting, when PodResources cannot say.

The real kubelet (1.37, ``pkg/kubelet/apis/podresources/server_v1.go``) lists only app
containers and restartable (sidecar) init containers, and its device manager
(``devicemanager/manager.go``, ``devicesToReuse``) hands a regular init container's IDs on
to the pod's later containers. PreStartContainer for such an init container used to find
no holder of its IDs and fail forever, and GetPreferredAllocation never steered one
(tests/realkube/test_kubelet.py shows both on the real kubelet):
:func:`vgpud.node.startup.starting_init_container` finds it from the active pods'
assignments and statuses, and :func:`vgpud.node.startup.wanted` counts the init
containers of a pod being admitted as waiting.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import container, gpu_pod
from tests.fakekubelet import FakePod
from tests.fakekubelet.kubelet import Admitted
from tests.plugin.harness import NODE, Harness, node_harness, uuid_of
from vgpud.core.codec import ASSIGNMENT, assignment_of, decode_assignment
from vgpud.core.limits import parse
from vgpud.core.model import ContainerGrant, DeviceGrant, Placement
from vgpud.node.allocations import AllocationStore
from vgpud.node.cluster import view
from vgpud.node.startup import ActivePod, Assignment, starting_init_container, wanted

# (name, init, sidecar, [gpu index per vGPU])
Spec = tuple[str, bool, bool, list[int]]


def active(name: str, containers: list[Spec], *, done: frozenset[str] = frozenset(),
           held: set[str] | None = None, namespace: str = "ns") -> ActivePod:
    p = Placement(node=NODE, containers=tuple(
        ContainerGrant(c, init, tuple(DeviceGrant(uuid_of(g), 1000, 0) for g in gpus), sidecar)
        for c, init, sidecar, gpus in containers), time="2026-01-01T00:00:00Z")
    return ActivePod(namespace, name, p, done,
                     frozenset(held or ()))


def ids(*pairs: tuple[int, int]) -> list[str]:
    return [f"{uuid_of(g)}::{i}" for g, i in pairs]


def test_the_only_pod_with_a_waiting_init_container_of_that_size() -> None:
    pods = [active("web", [("main", False, False, [0])], held=set(ids((0, 5)))),
            active("job", [("prep", True, False, [1]), ("main", False, False, [])])]
    assert starting_init_container(pods, ids((1, 3))) == ("ns", "job", "prep")


def test_a_pod_whose_containers_hold_some_of_the_ids_owns_them() -> None:
    # kubelet handed prep's ID on to main and gave main one more: main holds a superset
    pods = [active("other", [("prep", True, False, [1])]),
            active("job", [("prep", True, False, [1]), ("main", False, False, [0, 1])],
                   held=set(ids((1, 3), (0, 7))))]
    assert starting_init_container(pods, ids((1, 3))) == ("ns", "job", "prep")


def test_init_containers_run_in_order_the_completed_ones_are_skipped() -> None:
    pod = [("a", True, False, [0]), ("b", True, False, [0]), ("main", False, False, [])]
    assert starting_init_container([active("p", pod)], ids((0, 1))) == ("ns", "p", "a")
    assert starting_init_container([active("p", pod, done=frozenset({"a"}))],
                                   ids((0, 1))) == ("ns", "p", "b")
    # all done (a sandbox made anew runs them again, the status not yet saying so)
    why = starting_init_container([active("p", pod, done=frozenset({"a", "b"}))], ids((0, 1)))
    assert why == "no active pod has an init container waiting for 1 of them"


def test_sidecars_and_other_sizes_are_not_candidates() -> None:
    pod = [("side", True, True, [0]), ("two", True, False, [0, 1]), ("main", False, False, [])]
    assert isinstance(starting_init_container([active("p", pod)], ids((0, 1))), str)
    assert starting_init_container([active("p", pod)], ids((0, 1), (1, 1))) == ("ns", "p", "two")


def test_several_pods_the_gpus_decide_else_nobody_is_guessed() -> None:
    a = active("a", [("prep", True, False, [0])])
    b = active("b", [("prep", True, False, [1])])
    assert starting_init_container([a, b], ids((1, 2))) == ("ns", "b", "prep")
    c = active("c", [("prep", True, False, [1])])
    why = starting_init_container([a, b, c], ids((1, 2)))
    assert isinstance(why, str)
    assert "pod ns/b container 'prep'" in why and "pod ns/c container 'prep'" in why
    # no assignment, or one that cannot be read: never a candidate
    bare = ActivePod("ns", "bare", {}, frozenset(), frozenset())
    junk = ActivePod("ns", "junk", assignment_of({ASSIGNMENT: "{"}), frozenset(),
                     frozenset())
    assert starting_init_container([bare, junk, a], ids((0, 2))) == ("ns", "a", "prep")


def test_percent_ids_count_the_cores() -> None:
    p = Placement(node=NODE, containers=(
        ContainerGrant("prep", True, (DeviceGrant(uuid_of(0), 1000, 30),)),), time="t")
    pod = ActivePod("ns", "p", p, frozenset(), frozenset())
    assert starting_init_container([pod], ids(*[(0, i) for i in range(30)]),
                                   per_gpu=100) == ("ns", "p", "prep")
    assert isinstance(starting_init_container([pod], ids((0, 1)), per_gpu=100), str)


def test_the_init_containers_of_a_pod_being_admitted_are_steered_first() -> None:
    """GetPreferredAllocation: kubelet allocates a pod's regular init containers before
    its app containers, and PodResources lists none of them."""
    def notes(containers: list[Spec]) -> Assignment:
        return active("x", containers).assignment

    job = notes([("side", True, True, [2]), ("prep", True, False, [1]),
                 ("main", False, False, [0, 2])])
    solo = notes([("prep", True, False, [2]), ("main", False, False, [])])
    table = {("ns", "job"): job, ("ns", "solo"): solo}
    # "job" is being admitted, in kubelet's order: the sidecar (listed) first...
    admitting = [("ns", "job")]
    assert wanted({("ns", "job"): {"main", "side"}}, table, 1, init_waiting=admitting) == [
        uuid_of(2)]
    # ... then the regular init container (never listed) ...
    waiting = {("ns", "job"): {"main"}}
    assert wanted(waiting, table, 1, init_waiting=admitting) == [uuid_of(1)]
    assert wanted(waiting, table, 1) == []  # as it was: nobody waits for one vGPU
    # ... then the app container
    assert wanted(waiting, table, 2, init_waiting=admitting) == [uuid_of(0), uuid_of(2)]
    # an app container holding IDs already: the init containers had theirs before
    two = {("ns", "two"): notes([("prep", True, False, [1]), ("a", False, False, [0]),
                                 ("b", False, False, [2])])}
    assert wanted({("ns", "two"): {"b"}}, two, 1, init_waiting=[("ns", "two")]) == [
        uuid_of(2)]
    # a pod whose app containers ask for nothing, kubelet not having reported it yet; pods
    # with waiting containers come before it
    assert wanted({}, table, 1, init_waiting=[("ns", "solo")]) == [uuid_of(2)]
    assert wanted(waiting, table, 1, init_waiting=[("ns", "solo"), ("ns", "job")]) == [
        uuid_of(1)]


def test_an_init_container_before_a_sidecar_holding_ids_waits_no_more() -> None:
    """kubelet allocates in spec order: once a sidecar declared after a regular init
    container holds IDs, that init container has its IDs too (kubelet gave them to the
    sidecar as well). The app container asking for as many used to be steered to the
    init container's GPU (and then reassigned there, or refused when it had no room)."""
    table = {("ns", "p"): active("x", [("prep", True, False, [1]),
                                             ("side", True, True, [2]),
                                       ("main", False, False, [0])]).assignment}
    admitting = [("ns", "p")]
    # kubelet is allocating prep: nobody holds anything
    assert wanted({("ns", "p"): {"side", "main"}}, table, 1, init_waiting=admitting) == [
        uuid_of(1)]
    # side has prep's ID (reused: no preference asked); now main is being allocated
    assert wanted({("ns", "p"): {"main"}}, table, 1, init_waiting=admitting) == [uuid_of(0)]


def test_a_pod_view_knows_which_init_containers_completed() -> None:
    v = view({"metadata": {"name": "p", "namespace": "ns"}, "status": {
        "initContainerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "b", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            {"name": "c", "state": {"running": {}}}, {"name": "d"}, "junk"]}})
    assert v.init_done == frozenset({"a"}) and v.reported
    bare = view({"metadata": {}, "status": {"phase": "Pending"}})
    assert bare.init_done == frozenset() and not bare.reported


# -- through the fake kubelet, which reuses init containers' IDs as kubelet does ----------


def _pod(name: str, containers: list[Spec], assignment: Placement) -> dict[str, Any]:
    def spec(c: Spec) -> dict[str, Any]:
        return container(c[0], {"nvidia.com/vgpu-number": str(len(c[3]))} if c[3] else {},
                         image="cuda", restart="Always" if c[2] else None)

    return gpu_pod(name, assignment=assignment, node=NODE, phase="Pending",
                   init=[spec(c) for c in containers if c[1]],
                   containers=[spec(c) for c in containers if not c[1]])


async def _run(h: Harness, name: str, containers: list[Spec]) -> Admitted:
    grant = Placement(node=NODE, containers=tuple(
        ContainerGrant(c, init, tuple(DeviceGrant(uuid_of(g), 1000 * (k + 1), 0)
                                      for g in gpus), sidecar)
        for k, (c, init, sidecar, gpus) in enumerate(containers)), time="2026-01-01T00:00:00Z")
    h.api.create("pods", _pod(name, containers, grant), "default")
    pod = FakePod("default", name, [(c[0], len(c[3])) for c in containers],
                  init=frozenset(c[0] for c in containers if c[1]),
                  sidecars=frozenset(c[0] for c in containers if c[2]))
    a: Admitted = await h.kubelet_call(h.kubelet.run, pod)
    return a


def _limits(h: Harness, ids: list[str]) -> tuple[str, list[tuple[str, int]]]:
    got = parse((AllocationStore(h.state_dir).path(ids) / "etc" / "config").read_text())
    return got.container, [(d.uuid, d.memory_limit >> 20) for d in got.devices]


@pytest.mark.anyio
async def test_each_container_of_a_pod_with_gpu_init_containers_gets_its_own_limits() -> None:
    """A sidecar, a regular init container and an app container with two vGPUs (the pod
    of tests/realkube/test_fakekubelet_agrees.py): kubelet hands the init container's ID
    on to the app container, and PodResources never lists the init container."""
    async with node_harness(2) as h:
        a = await _run(h, "job", [("side", True, True, [1]), ("prep", True, False, [0]),
                                  ("main", False, False, [0, 1])])
        side, prep, main = (a.ids[c] for c in ("side", "prep", "main"))
        assert set(prep) < set(main) and not set(side) & set(main)
        assert [c.container for c in h.kubelet.calls if c.rpc == "PreStartContainer"] == [
            "side", "prep", "main"]
        assert _limits(h, side) == ("side", [(uuid_of(1), 1000)])
        assert _limits(h, prep) == ("prep", [(uuid_of(0), 2000)])
        assert _limits(h, main) == ("main", [(uuid_of(0), 3000), (uuid_of(1), 3000)])
        assert not [e for e in h.api.objects("events") if e["reason"] == "VgpuReassigned"]
        # the plugin steered each container to its GPUs: kubelet asked three times
        assert [(c.container, c.size, c.must_include) for c in h.kubelet.calls
                if c.rpc == "GetPreferredAllocation"] == [
            ("side", 1, ()), ("prep", 1, ()), ("main", 2, tuple(prep))]


@pytest.mark.anyio
async def test_a_sidecar_after_an_init_container_gets_its_ids_the_app_container_its_own(
        ) -> None:
    """kubelet hands a regular init container's IDs to a sidecar declared after it too;
    the app container is then steered to its own GPU, not to the init container's. (The
    init container, whose IDs the sidecar holds exactly, is configured as the sidecar:
    docs/plugin.md, Known limits.)"""
    async with node_harness(2) as h:
        a = await _run(h, "p", [("prep", True, False, [0]), ("side", True, True, [1]),
                                ("main", False, False, [1])])
        assert a.ids["side"] == a.ids["prep"]
        assert [i.split("::")[0] for i in a.ids["main"]] == [uuid_of(1)]
        assert _limits(h, a.ids["main"]) == ("main", [(uuid_of(1), 3000)])
        assert [e["message"].split(" runs on")[0] for e in h.api.objects("events")
                if e["reason"] == "VgpuReassigned"] == ["container 'side'"]


@pytest.mark.anyio
async def test_a_second_init_container_gets_the_first_ones_ids_and_its_own_limits() -> None:
    """kubelet gives a regular init container the IDs of one before it (reuse covers it:
    no GetPreferredAllocation); which of them is starting, the pod's status tells (the
    first has completed), and the second runs on the first one's GPU with its own
    limits, its assignment rewritten to that GPU."""
    async with node_harness(2) as h:
        a = await _run(h, "two", [("first", True, False, [0]), ("second", True, False, [1]),
                                  ("main", False, False, [])])
        assert a.ids["second"] == a.ids["first"]
        assert [(c.rpc, c.container) for c in h.kubelet.calls] == [
            ("GetPreferredAllocation", "first"), ("Allocate", "first"),
            ("Allocate", "second"), ("PreStartContainer", "first"),
            ("PreStartContainer", "second")]
        # the same allocation directory: the second wrote it last
        assert _limits(h, a.ids["second"]) == ("second", [(uuid_of(0), 2000)])
        got = decode_assignment(h.assignment("two")).container("second")
        assert got is not None and [d.uuid for d in got.devices] == [uuid_of(0)]
        assert [e["involvedObject"]["name"] for e in h.api.objects("events")
                if e["reason"] == "VgpuReassigned"] == ["two"]
