"""The plugin's /metrics behind the ops guard (vgpud/ops.py): with ``ops.tokenFile`` set a
scrape needs the bearer token; kubelet's liveness probe (/healthz) does not (issue 23,
finding 3)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.plugin.harness import node_harness

pytestmark = pytest.mark.anyio


async def test_plugin_metrics_need_the_token_when_one_is_set(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("plugin-token\n")
    ops = {"tokenFile": str(token), "trustLoopback": False}
    async with node_harness(1, settings={"ops": ops}) as h, aiohttp.ClientSession() as s:
        assert h.running is not None
        url = f"http://127.0.0.1:{h.running.metrics_port}"
        async with s.get(url + "/metrics") as r:
            assert r.status == 401
            assert "bearer token" in await r.text()
        async with s.get(url + "/metrics",
                         headers={"Authorization": "Bearer plugin-token"}) as r:
            assert r.status == 200
            assert "vgpud_gpu_containers" in await r.text()
        async with s.get(url + "/healthz") as r:
            assert r.status == 200
