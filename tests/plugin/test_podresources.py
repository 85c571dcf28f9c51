"""The PodResources client turns every way a kubelet call can fail into
PodResourcesError, so the plugin's housekeeping skips a round instead of stopping."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from grpclib.client import Channel

from tests.fakekubelet import FakeKubelet
from tests.fakekubelet.protos import load
from vgpud.node._pb import v1 as pr
from vgpud.node.podresources import PodDecoder, PodResourcesClient, PodResourcesError


@pytest.mark.anyio
async def test_a_missing_socket_is_a_pod_resources_error(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), "nvidia.com/vgpu-number",
                                timeout=2)
    with pytest.raises(PodResourcesError, match="cannot list pod resources"):
        await client.pods()


@pytest.mark.anyio
async def test_grpclibs_lost_transport_race_is_a_pod_resources_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """grpclib raises AttributeError ('Connection' object has no attribute '_transport')
    when kubelet's socket closes as a request starts; it stopped the plugin's whole task
    group once (seen in a full test run)."""

    def lost(self: object, *args: object, **kwargs: object) -> None:
        raise AttributeError("'Connection' object has no attribute '_transport'")

    monkeypatch.setattr(Channel, "request", lost)
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), "nvidia.com/vgpu-number")
    with pytest.raises(PodResourcesError, match="_transport"):
        await client.live()


@pytest.mark.anyio
async def test_one_list_call_answers_both_questions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's collection asks which IDs are live and which pods are listed: both
    from one List (before: two calls, two instants of kubelet's view)."""
    calls = 0
    listing = (pr.PodResources(name="p", namespace="ns", containers=[
        pr.ContainerResources(name="main", devices=[
            pr.ContainerDevices(resource_name="nvidia.com/vgpu-number",
                                device_ids=["GPU-a::0", "GPU-a::1"])]),
        pr.ContainerResources(name="side", devices=[])]),
        pr.PodResources(name="q", namespace="ns", containers=[]))

    async def pods(self: object) -> tuple[pr.PodResources, ...]:
        nonlocal calls
        calls += 1
        return listing

    monkeypatch.setattr(PodResourcesClient, "_pods", pods)
    client = PodResourcesClient("/nonexistent", "nvidia.com/vgpu-number")
    live, listed = await client.snapshot()
    assert calls == 1
    assert live == {("nvidia.com/vgpu-number", frozenset({"GPU-a::0", "GPU-a::1"}))}
    assert listed == {("ns", "p"), ("ns", "q")}


@pytest.mark.anyio
async def test_one_connection_serves_the_calls_and_a_kubelet_restart_fails_none(
        tmp_path: Path) -> None:
    """The client keeps its connection between calls; a kubelet restart (its socket
    closed and served anew) fails no call."""
    kubelet = FakeKubelet(tmp_path)
    kubelet.start_servers()
    try:
        client = PodResourcesClient(str(kubelet.podres_socket), "nvidia.com/vgpu-number",
                                    timeout=5)
        assert await client.list() == []
        channel = client._channel
        assert await client.list() == [] and client._channel is channel  # reused
        await anyio.to_thread.run_sync(kubelet.stop)
        await anyio.to_thread.run_sync(kubelet.start_servers)
        # no error: grpclib reconnects a channel whose connection was lost, and a call that
        # fails on the old connection anyway is made again on a new one
        assert await client.list() == []
        client.close()
    finally:
        kubelet.stop()


@pytest.mark.anyio
async def test_a_call_that_fails_on_the_kept_connection_is_made_once_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    channels: list[object] = []

    async def flaky(self: PodResourcesClient, channel: object) -> tuple[pr.PodResources, ...]:
        channels.append(channel)
        if len(channels) == 2:  # the second call, on the kept connection: kubelet restarted
            raise ConnectionResetError("reset by peer")
        return ()

    monkeypatch.setattr(PodResourcesClient, "_list", flaky)
    client = PodResourcesClient("/nonexistent", "nvidia.com/vgpu-number")
    await client.list()
    await client.list()  # fails once on the kept connection, then succeeds on a new one
    assert len(channels) == 3 and channels[0] is channels[1] and channels[2] is not channels[1]
    channels.clear()

    async def down(self: PodResourcesClient, channel: object) -> tuple[pr.PodResources, ...]:
        channels.append(channel)
        raise ConnectionRefusedError("no kubelet")

    monkeypatch.setattr(PodResourcesClient, "_list", down)
    with pytest.raises(PodResourcesError, match="no kubelet"):
        await client.list()
    assert len(channels) == 2  # the kept connection, then one new one: no more
    client.close()



def _encoded(pods: list[tuple[str, list[str]]], unknown: bool = False) -> bytes:
    """A List reply as kubelet's own encoder (Google's protobuf, not betterproto2) writes
    it, ``unknown``: with a field of a later version ahead of the pods."""
    _, _, gpr, _ = load()
    reply = gpr.ListPodResourcesResponse(pod_resources=[
        gpr.PodResources(name=name, namespace="ns", containers=[gpr.ContainerResources(
            name="main", devices=[gpr.ContainerDevices(resource_name="nvidia.com/vgpu-number",
                                                       device_ids=ids)])])
        for name, ids in pods])
    data: bytes = reply.SerializeToString()
    return (bytes([0x12, 0x03]) + b"new" + data) if unknown else data  # field 2, 3 bytes


def test_a_pod_listed_again_unchanged_is_not_decoded_again() -> None:
    """kubelet's list changes by a pod between two of the plugin's calls: only that pod
    is decoded (a reply of 200 pods took 16 ms to decode whole), and the pods are those
    decoding the whole reply gives."""
    decode = PodDecoder()
    first = [(f"p{i}", [f"GPU-a::{i}"]) for i in range(3)]
    got = decode(_encoded(first))
    assert decode.decoded == 3
    assert list(got) == pr.ListPodResourcesResponse.FromString(_encoded(first)).pod_resources
    second = [*first, ("p3", ["GPU-a::3"])]
    got = decode(_encoded(second, unknown=True))
    assert decode.decoded == 4  # p3 only; the unknown field skipped
    assert list(got) == list(pr.ListPodResourcesResponse.FromString(
        _encoded(second)).pod_resources)
    assert [p.name for p in got] == ["p0", "p1", "p2", "p3"]
    # a pod whose devices changed is decoded anew; a pod gone is forgotten
    third = [("p1", ["GPU-a::1", "GPU-a::9"]), ("p3", ["GPU-a::3"])]
    got = decode(_encoded(third))
    assert decode.decoded == 5
    assert [list(p.containers[0].devices[0].device_ids) for p in got] == [
        ["GPU-a::1", "GPU-a::9"], ["GPU-a::3"]]
    assert len(decode._known) == 2
