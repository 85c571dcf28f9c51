"""The webhook's /metrics behind the ops guard (vgpud/ops.py): with ``ops.tokenFile`` set
a scrape needs the bearer token; the API server's reviews and kubelet's probes do not
(issue 23, finding 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.builders import pod

pytestmark = pytest.mark.anyio


async def test_webhook_metrics_need_the_token_and_reviews_do_not(
        webhook_factory: Any, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("webhook-token\n")
    webhook = await webhook_factory(
        settings={"ops": {"tokenFile": str(token), "trustLoopback": False}})
    s = webhook.session
    async with s.get(webhook.ops_url + "/metrics") as r:
        assert r.status == 401 and "bearer token" in await r.text()
    async with s.get(webhook.ops_url + "/metrics",
                     headers={"Authorization": "Bearer webhook-token"}) as r:
        assert r.status == 200 and "vgpud_webhook" in await r.text()
    for probe in ("/healthz", "/readyz"):
        async with s.get(webhook.ops_url + probe) as r:
            assert r.status == 200
    resp = await webhook.admit("/mutate", pod("p", number=1))  # no token: the API server's
    assert resp["allowed"] is True
