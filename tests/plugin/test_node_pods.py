"""The node's pods, watched (vgpud/node/pods.py), and the allocation path that reads them:
no LIST per call, and a pod the cache has not caught up with read by one GET."""

from __future__ import annotations

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.plugin.harness import (
    NODE,
    VGPU,
    kubelet_picks_a_full_gpu,
    node_harness,
    placement,
    pod_manifest,
    uuid_of,
)
from tests.standin import ApiServer
from vgpud.core.codec import ASSIGNMENT, decode_assignment, encode_assignment
from vgpud.kube.client import KubeClient
from vgpud.node.cluster import KubeCluster
from vgpud.node.pods import NodePods

pytestmark = pytest.mark.anyio


def _pod(name: str, node: str = NODE, assignment: str | None = None) -> dict[str, object]:
    return pod_manifest(name, {"main": 1}, assignment, node=node)


async def test_the_cache_holds_the_pods_the_list_returned_and_follows_them() -> None:
    async with ApiServer() as api, KubeClient.for_url(api.url) as kube, \
            anyio.create_task_group() as tg:
        cluster = KubeCluster(kube)
        api.create("pods", _pod("here"), "default")
        api.create("pods", _pod("elsewhere", node="other-node"), "default")
        pods = NodePods.of(cluster, NODE)
        await tg.start(pods.run)
        listed = {(p.namespace, p.name) for p in await cluster.pods_on_node(NODE)}
        assert set(pods.all()) == listed == {("default", "here")}
        api.create("pods", _pod("later"), "default")
        assert await pods.wait_until("default", "later", lambda p: p is not None, 5.0)
        api.delete("pods", "here")
        assert await pods.wait_until("default", "here", lambda p: p is None, 5.0)
        assert not await pods.wait_until("default", "never", lambda p: p is not None, 0.05)
        tg.cancel_scope.cancel()


async def test_views_read_what_the_cache_lacks_or_cannot_be_trusted_with() -> None:
    async with ApiServer() as api, KubeClient.for_url(api.url) as kube:
        cluster = KubeCluster(kube)
        pods = NodePods.of(cluster, NODE)  # never started: an empty cache, a lagging one
        api.create("pods", _pod("p", assignment="x"), "default")
        got = await pods.views([("default", "p"), ("default", "gone")])
        assert set(got) == {("default", "p")}  # read; a pod the API lacks is left out
        assert got[("default", "p")].annotations[ASSIGNMENT] == "x"
        assert pods.reads == 2 and api.count("get", "pods") == 2
        assert api.count("list", "pods") == 0


async def test_the_allocation_path_lists_no_pods() -> None:
    async with node_harness(4) as h:
        lists = h.api.count("list", "pods")
        for i in range(4):
            h.add_pod(f"p{i}", {"main": 1}, placement({"main": [(i, 1000, 10)]}))
            a = await h.kubelet_call(h.kubelet.run, FakePod("default", f"p{i}", [("main", 1)]))
            assert [x.split("::")[0] for x in a.ids["main"]] == [uuid_of(i)]
        # kubelet chose another GPU: the neighbours come from the cache too
        h.add_pod("moved", {"main": 1}, placement({"main": [(0, 1000, 10)]}))

        def other_gpu(name, free, preferred, n):  # type: ignore[no-untyped-def]
            return [f"{uuid_of(3)}::7"]

        await h.kubelet_call(h.kubelet.run, FakePod("default", "moved", [("main", 1)]),
                             other_gpu)
        assert decode_assignment(h.assignment("moved")).containers[0].devices[0].uuid == \
            uuid_of(3)
        assert h.api.count("list", "pods") == lists


async def _lagging(h, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Make the plugin's watch of pods lag: end it, and hold its next one back."""
    h.api.slow("watch", "pods", seconds, times=1)
    h.api.drop_watches("pods")
    await anyio.sleep(0.2)  # the informer is now waiting for its new watch


async def test_a_pod_the_cache_has_not_seen_is_steered_and_configured() -> None:
    async with node_harness(4) as h:
        await _lagging(h, 3.0)
        h.add_pod("p", {"main": 1}, placement({"main": [(2, 3000, 30)]}))
        assert h.running is not None
        service = h.running.service
        assert service.pods.cached("default", "p") is None
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p", [("main", 1)]))
        assert [x.split("::")[0] for x in a.ids["main"]] == [uuid_of(2)]  # steered: read
        assert service.pods.reads >= 1


async def test_a_neighbour_the_cache_has_not_seen_is_counted() -> None:
    async with node_harness(2) as h:
        await _lagging(h, 3.0)
        refused = await kubelet_picks_a_full_gpu(h)
        assert "MiB free" in refused.message


async def test_an_assignment_written_after_the_pod_was_seen_is_read() -> None:
    """A pod the cache shows without its assignment (it came later) is read again."""
    async with node_harness(4) as h:
        asks = {"main": {VGPU: 1, "nvidia.com/vgpu-memory": 2000, "nvidia.com/vgpu-cores": 20}}
        h.api.create("pods", pod_manifest("p", asks, None), "default")
        assert h.running is not None
        service = h.running.service
        assert await service.pods.wait_until("default", "p", lambda v: v is not None, 5.0)
        await _lagging(h, 3.0)
        p = placement({"main": [(3, 2000, 20)]})
        h.api.patch("pods", "p", {"metadata": {"annotations": {
            ASSIGNMENT: encode_assignment(p)}}}, "default")
        cached = service.pods.cached("default", "p")
        assert cached is not None and ASSIGNMENT not in cached.annotations
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p", [("main", 1)]))
        assert [x.split("::")[0] for x in a.ids["main"]] == [uuid_of(3)]
