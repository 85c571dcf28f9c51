"""A pod's whole path on one node, each step by the real role: ``vgpud webhook`` over
HTTPS (its patch applied to the pod before it is created, as the API server does),
the extender over HTTP driven the way kube-scheduler drives it, then the plugin
through the fake kubelet (tests/plugin/harness.py)."""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import jsonpatch
import trustme
from aiohttp import web

from tests.e2e.cluster import Driver, Outcome
from tests.plugin.harness import Harness
from tests.webhook.conftest import kubeconfig_for, review, server_cert
from vgpud.core.allocate import Allocator
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.kube.cache import Informer
from vgpud.kube.resources import NODES, PODS
from vgpud.kube.writes import PodBinder
from vgpud.scheduling.projections import project_node, project_pod
from vgpud.scheduling.state import SchedulerState
from vgpud.webhook.run import run_webhook


class Denied(Exception):
    pass


class Cluster:
    """The control plane around a :class:`Harness` node: webhook and scheduler."""

    def __init__(self, h: Harness, session: aiohttp.ClientSession, webhook: str,
                 ctx: ssl.SSLContext, driver: Driver, alloc: Allocator) -> None:
        self.h, self.session, self.webhook, self.ctx, self.driver = h, session, webhook, ctx, driver
        self.alloc = alloc  # the extender's
        self.warnings: list[str] = []

    async def _admit(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.webhook + path, json=review(obj), ssl=self.ctx) as r:
            assert r.status == 200, await r.text()
            return dict((await r.json())["response"])

    async def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Admit ``pod`` as the API server would (mutate, apply, validate), then create it."""
        resp = await self._admit("/mutate", pod)
        ops = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
        pod = jsonpatch.apply_patch(pod, ops)
        resp = await self._admit("/validate", pod)
        self.warnings += resp.get("warnings", [])
        if not resp["allowed"]:
            raise Denied(resp["status"]["message"])
        ns = pod["metadata"].get("namespace", "default")
        return dict(self.h.api.create("pods", pod, ns))

    async def schedule(self, pod: dict[str, Any], nodes: list[str]) -> Outcome:
        return await self.driver.schedule(pod, nodes, retries=3)


@asynccontextmanager
async def control_plane(h: Harness) -> AsyncIterator[Cluster]:
    """``vgpud webhook`` and the extender (with the harness's settings) for node ``h``."""
    root = Path(tempfile.mkdtemp(prefix="vgpud-flow-"))
    ca = trustme.CA()
    server_cert(ca, root)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    kubeconfig = kubeconfig_for(h.api.url, root / "kubeconfig")
    alloc = Allocator(h.settings.defaults())
    nodes: Informer[Any] = Informer(h.kube, NODES, project=project_node)
    pods: Informer[Any] = Informer(h.kube, PODS, project=project_pod)
    state = SchedulerState(alloc, pod_lookup=pods.get)
    nodes.subscribe(state.on_node)
    pods.subscribe(state.on_pod)
    ext = Extender(state, writer=PodBinder(h.kube), events=None, metrics=Metrics(alloc))
    runner = web.AppRunner(make_app(ext, ready=lambda: nodes.has_synced and pods.has_synced))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    ext_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with anyio.create_task_group() as tg, aiohttp.ClientSession() as s:
            serving = await tg.start(lambda task_status: run_webhook(
                h.settings, kubeconfig=str(kubeconfig), listen="127.0.0.1:0",
                tls_cert=root / "tls.crt", tls_key=root / "tls.key", handle_signals=False,
                task_status=task_status))
            await tg.start(nodes.run)
            await tg.start(pods.run)
            yield Cluster(h, s, f"https://127.0.0.1:{serving.port}", ctx,
                          Driver(s, h.api.url, ext_url), alloc)
            tg.cancel_scope.cancel()
    finally:
        await runner.cleanup()
