"""The PodResources client turns every way a kubelet call can fail into
PodResourcesError, so the plugin's housekeeping skips a round instead of stopping."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpud.plugin._pb import v1 as pr
from vgpud.plugin.podresources import PodResourcesClient, PodResourcesError


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

    async def lost(self: object, *args: object, **kwargs: object) -> None:
        raise AttributeError("'Connection' object has no attribute '_transport'")

    monkeypatch.setattr(pr.PodResourcesListerStub, "list", lost)
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
