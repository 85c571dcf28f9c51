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
