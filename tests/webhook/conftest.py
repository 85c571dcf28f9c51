"""A running ``vgpud webhook`` (in this process, its own task group) over HTTPS with a
test CA (trustme), against the API stand-in; a client that speaks AdmissionReview."""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import uuid as uuidlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import trustme
import yaml

from tests.standin.apiserver import ApiServer
from vgpud.config import Settings, parse_settings
from vgpud.webhook.run import BootstrapOptions, Serving, run_webhook


def kubeconfig_for(url: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": url}}],
        "users": [{"name": "standin", "user": {"token": "t"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}]}))
    return path


def review(obj: Any, *, operation: str = "CREATE", kind: str = "Pod", group: str = "",
           namespace: str = "team", dry_run: bool = False) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuidlib.uuid4()), "dryRun": dry_run,
                        "kind": {"group": group, "version": "v1", "kind": kind},
                        "resource": {"group": group, "version": "v1", "resource": "pods"},
                        "namespace": namespace, "operation": operation, "object": obj,
                        "userInfo": {"username": "alice"}}}


@dataclass
class Webhook:
    api: ApiServer
    url: str
    ops_url: str
    session: aiohttp.ClientSession
    ssl: ssl.SSLContext
    tls_dir: Path
    serving: Serving

    async def post(self, path: str, body: Any, *, raw: bytes | None = None
                   ) -> tuple[int, dict[str, Any]]:
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.url + path, data=data, ssl=self.ssl,
                                     headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json(content_type=None)

    async def admit(self, path: str, obj: Any, **kw: Any) -> dict[str, Any]:
        sent = review(obj, **kw)
        status, doc = await self.post(path, sent)
        assert status == 200, doc
        assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
        assert doc["response"]["uid"] == sent["request"]["uid"]
        return dict(doc["response"])

    async def patch_of(self, obj: Any) -> list[dict[str, Any]]:
        resp = await self.admit("/mutate", obj)
        assert resp["allowed"] is True
        if "patch" not in resp:
            return []
        assert resp["patchType"] == "JSONPatch"
        return list(json.loads(base64.b64decode(resp["patch"])))


def server_cert(ca: trustme.CA, directory: Path) -> None:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(directory / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))


@pytest.fixture
async def webhook_factory() -> AsyncIterator[Any]:
    """``await start(settings={}, bootstrap=None)`` starts a webhook; all stop at the end."""
    root = Path(tempfile.mkdtemp(prefix="vgpud-webhook-"))
    async with ApiServer() as api, aiohttp.ClientSession() as session, \
            anyio.create_task_group() as tg:
        kubeconfig = kubeconfig_for(api.url, root / "kubeconfig")
        count = 0

        async def start(settings: dict[str, Any] | None = None,
                        bootstrap: BootstrapOptions | None = None,
                        ca: trustme.CA | None = None) -> Webhook:
            nonlocal count
            count += 1
            tls_dir = root / f"tls{count}"
            tls_dir.mkdir()
            ctx = ssl.create_default_context()
            if bootstrap is None:
                ca = ca or trustme.CA()
                server_cert(ca, tls_dir)
                ca.configure_trust(ctx)
            s: Settings = parse_settings(settings or {})
            serving = await tg.start(lambda task_status: run_webhook(
                s, kubeconfig=str(kubeconfig), listen="127.0.0.1:0",
                metrics_listen="127.0.0.1:0", tls_cert=tls_dir / "tls.crt",
                tls_key=tls_dir / "tls.key", bootstrap=bootstrap, handle_signals=False,
                tls_poll=0.05, task_status=task_status))
            return Webhook(api, f"https://127.0.0.1:{serving.port}",
                           f"http://127.0.0.1:{serving.ops_port}", session, ctx, tls_dir,
                           serving)

        try:
            yield start
        finally:
            tg.cancel_scope.cancel()


@pytest.fixture
async def webhook(webhook_factory: Any) -> Webhook:
    return await webhook_factory()  # type: ignore[no-any-return]
