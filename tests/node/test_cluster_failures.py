"""The node's API client when the API fails, through the in-memory doubles
(tests/doubles.py): no API server.

- ``KubeCluster.rewrite_assignment`` (the plugin's one pod write) over the in-memory
  API (``MemoryKube``): a resourceVersion conflict that left the assignment as it was is
  re-read and written again; a changed assignment, a replaced or deleting pod is a
  ``Conflict`` (the plugin decides again); a pod gone is ``NotFound``; transient failures
  are retried, then raised. Nothing is written that the precondition did not allow.
- ``publish_inventory`` over ``MemoryCluster``: a refused or failed node write is
  retried until the node carries the inventory.
- ``NodePods.views`` over ``MemoryCluster.get_pod``: a pod the API no longer has is
  left out, one it cannot be asked about keeps its cached view.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.builders import gpu_pod
from tests.doubles import (
    Faults,
    MemoryCluster,
    MemoryKube,
    Objects,
    forbidden,
    modified,
    reset,
    timeout,
)
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES
from vgpud.core.model import Gpu
from vgpud.kube.errors import Conflict, ConnectionFailed, NotFound, ServerError
from vgpud.kube.writes import PodWriter, RetryPolicy
from vgpud.node.cluster import KubeCluster, PodView, view
from vgpud.node.devices import DeviceInfo, NodeDevices
from vgpud.node.inventory import publish_inventory
from vgpud.node.pods import NodePods

pytestmark = pytest.mark.anyio

NS = "team"
FAST = RetryPolicy(attempts=3, initial=0.001, jitter=0.0)


def bound_pod(name: str, assignment: str = "old") -> dict[str, Any]:
    return gpu_pod(name, namespace=NS, assignment=assignment, scheduler=None, node="n1",
                   image=None, phase="Pending")


def cluster() -> tuple[KubeCluster, Objects, Faults]:
    objects, faults = Objects(), Faults()
    kube = MemoryKube(objects, faults)
    c = KubeCluster(kube)  # type: ignore[arg-type]
    c.writer = PodWriter(kube, retry=FAST, max_conflicts=3)  # type: ignore[arg-type]
    return c, objects, faults


def assignment(objects: Objects, name: str = "a") -> str:
    return str(objects.pod(NS, name)["metadata"]["annotations"].get(ASSIGNMENT))


# -- rewrite_assignment -------------------------------------------------------------------


async def test_a_rewrite_writes_over_the_assignment_it_read() -> None:
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    written = await c.rewrite_assignment(seen, "new")
    assert written.annotations[ASSIGNMENT] == "new" == assignment(objects)
    assert written.resource_version != seen.resource_version
    assert faults.calls["PATCH pods"] == 1


async def test_a_resource_version_conflict_with_the_assignment_unchanged_is_written_again(
) -> None:
    """The kubelet (or anyone) changed the pod, not its assignment: re-read, re-applied."""
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    objects.change_pod(NS, "a", **{"example.com/other": "x"})
    written = await c.rewrite_assignment(seen, "new")
    assert written.annotations[ASSIGNMENT] == "new" == assignment(objects)
    assert written.annotations["example.com/other"] == "x"
    assert faults.calls["PATCH pods"] == 2 and faults.calls["GET pods"] == 1


@pytest.mark.parametrize("change", ["assignment", "replaced", "deleting"])
async def test_a_pod_that_changed_under_the_rewrite_is_a_conflict(change: str) -> None:
    """The plugin's decision no longer applies: Conflict, and nothing written."""
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    if change == "assignment":
        objects.change_pod(NS, "a", **{ASSIGNMENT: "someone else's"})
    elif change == "replaced":
        objects.delete_pod(NS, "a")
        objects.add_pod(bound_pod("a"))
    else:
        objects.mark_deleting(NS, "a")
    before = assignment(objects)
    with pytest.raises(Conflict):
        await c.rewrite_assignment(seen, "new")
    assert assignment(objects) == before
    assert faults.calls["PATCH pods"] == 1


async def test_a_pod_gone_is_not_found() -> None:
    c, objects, _ = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    objects.delete_pod(NS, "a")
    with pytest.raises(NotFound):
        await c.rewrite_assignment(seen, "new")
    assert await c.get_pod(NS, "a") is None


async def test_conflicts_without_end_give_up() -> None:
    """A pod that changes at every attempt: max_conflicts re-reads, then Conflict."""
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    faults.fail("PATCH pods", modified("a"), times=100)
    with pytest.raises(Conflict, match="the object has been modified"):
        await c.rewrite_assignment(seen, "new")
    assert faults.calls["PATCH pods"] == 4 and faults.calls["GET pods"] == 3
    assert assignment(objects) == "old"


async def test_a_reset_is_retried_and_a_lasting_one_raised() -> None:
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    faults.fail("PATCH pods", reset())
    assert (await c.rewrite_assignment(seen, "new")).annotations[ASSIGNMENT] == "new"
    assert faults.calls["PATCH pods"] == 2

    seen = view(objects.pod(NS, "a"))
    faults.fail("PATCH pods", reset, times=FAST.attempts)
    with pytest.raises(ConnectionFailed):
        await c.rewrite_assignment(seen, "newer")
    assert assignment(objects) == "new"


async def test_a_rewrite_whose_answer_was_lost_is_not_written_twice() -> None:
    """The PATCH applied, its answer lost: the retry's resourceVersion is stale (409),
    the re-read shows the assignment no longer the one the rewrite was based on: the
    plugin is told Conflict and decides again, over the pod as it now is."""
    c, objects, faults = cluster()
    seen = view(objects.add_pod(bound_pod("a")))
    faults.fail("PATCH pods", reset(), applied=True)
    with pytest.raises(Conflict):
        await c.rewrite_assignment(seen, "new")
    assert assignment(objects) == "new"  # written once: what the plugin reads next
    assert faults.calls["PATCH pods"] == 2


async def test_get_pod_raises_what_is_not_a_404() -> None:
    c, objects, faults = cluster()
    objects.add_pod(bound_pod("a"))
    faults.fail("GET pods", timeout, times=FAST.attempts)
    with pytest.raises(ServerError, match="504"):
        await c.get_pod(NS, "a")
    assert (await c.get_pod(NS, "a")) is not None


# -- publish_inventory --------------------------------------------------------------------


def devices() -> NodeDevices:
    found = (DeviceInfo(Gpu("GPU-0", 0, "A100", 81920), minor=0),)
    return NodeDevices(found, split=4, memory_scaling=1.0, core_scaling=1.0)


@pytest.mark.parametrize("failure", ["forbidden", "reset", "no node yet"])
async def test_the_inventory_is_published_through_failed_node_writes(failure: str) -> None:
    api = MemoryCluster()
    if failure == "forbidden":
        api.objects.add_node("n1")
        api.faults.fail("set_node_annotation",
                        forbidden("patch", "nodes", "n1"), times=2)
    elif failure == "reset":
        api.objects.add_node("n1")
        api.faults.fail("node_annotation", reset, times=2)
    else:  # the node object is not there yet: 404 until it is
        api.faults.fail("node_annotation", lambda: NotFound(404, "NotFound",
                                                            'nodes "n1" not found'), times=2)
        api.objects.add_node("n1")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: publish_inventory(
                "n1", devices(), api, memory=True, retry=0.001))
            node = api.objects.nodes["n1"]
            while NODE_DEVICES not in node["metadata"]["annotations"] \
                    or not node["status"]["capacity"]:
                await api.next_write()
            tg.cancel_scope.cancel()
    assert "GPU-0" in api.objects.nodes["n1"]["metadata"]["annotations"][NODE_DEVICES]
    assert api.faults.calls["node_annotation"] == 3


# -- NodePods.views -----------------------------------------------------------------------


class Cache:
    """An informer's reads, over a dict (NodePods asks no more of it here)."""

    def __init__(self, pods: dict[str, PodView]) -> None:
        self.pods = pods

    def get(self, key: str) -> PodView | None:
        return self.pods.get(key)

    def snapshot(self) -> dict[str, PodView]:
        return dict(self.pods)


async def test_node_pods_read_again_drop_the_gone_and_keep_the_unreadable() -> None:
    api = MemoryCluster()
    stale = {k: view(api.objects.add_pod(bound_pod(k))) for k in ("gone", "unread", "fresh")}
    api.objects.delete_pod(NS, "gone")
    api.objects.change_pod(NS, "fresh", **{ASSIGNMENT: "rewritten"})
    pods = NodePods(Cache({f"{NS}/{k}": v for k, v in stale.items()}),  # type: ignore[arg-type]
                    api.get_pod)

    async def get_pod(namespace: str, name: str) -> PodView | None:
        if name == "unread":
            raise timeout()
        return await api.get_pod(namespace, name)

    pods.get_pod = get_pod
    got = await pods.views([(NS, k) for k in stale], trusted=lambda p: False)
    assert (NS, "gone") not in got
    assert got[(NS, "unread")] == stale["unread"]
    assert got[(NS, "fresh")].annotations[ASSIGNMENT] == "rewritten"
    assert pods.reads == 3
