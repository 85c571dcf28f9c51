"""The extender's HTTP servers (aiohttp).

The *verbs* app: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` in
kube-scheduler's extender v1 JSON. Until the caches have synced every verb answers an ``Error``
("not ready"): a filter before the ledger is rebuilt would see GPUs as empty.
The *ops* app: ``GET /healthz`` (alive), ``/readyz`` (caches synced and the ledger
rebuilt), ``/metrics`` (Prometheus), and the status page with its JSON API
(``/``, ``/api/v1/…``: :mod:`vgpud.extender.status`). They listen apart so the verbs can stay on
localhost beside kube-scheduler while probes and Prometheus reach the ops port. A
:class:`~vgpud.ops.Guard` (settings ``ops``) stands in front of the ops routes but the probes:
a bearer token when one is configured, a rate per client and a cap on renders at once. The
verbs never pass through it, on a shared app either: kube-scheduler sends no token.

Bodies are bounded; a malformed body gets ``400`` and a JSON ``{"Error": ...}`` that
says what was wrong; an unexpected failure is logged and answered in ``Error``
(never a 5xx, never a dropped connection).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vgpud.extender.metrics import allocation_chunks, snapshot
from vgpud.extender.routes import Extender, timed
from vgpud.extender.status import add_status_routes
from vgpud.extender.wire import (
    RawJson,
    WireError,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
)
from vgpud.ops import Guard
from vgpud.process import BadBody, add_probes, read_body

log = structlog.get_logger()

MAX_BODY = 64 << 20  # 5,000 full Node objects fit comfortably


def _json(doc: Any, status: int = 200) -> web.Response:
    body = doc if isinstance(doc, RawJson) else json.dumps(doc, separators=(",", ":"))
    return web.Response(text=body, status=status, content_type="application/json")


NOT_READY = "vgpud scheduler is still syncing its caches (the ledger is not rebuilt yet)"


VERBS = ("/filter", "/prioritize", "/bind", "/preempt")


def make_app(ext: Extender, ready: Callable[[], bool], *, verbs: bool = True,
             ops: bool = True, guard: Guard | None = None,
             shown: Callable[[], bool] | None = None) -> web.Application:
    """The verbs (``verbs``) and the ops routes (``ops``: probes, metrics, the status
    page). ``ready``: the verbs may decide (and ``/readyz``); ``shown``: what the status
    page shows is complete (``ready`` when not given)."""
    app = web.Application(client_max_size=MAX_BODY)
    if guard is not None and ops:
        guard.install(app, exempt=VERBS if verbs else ())

    def verb(name: str, handle: Callable[[bytes], Awaitable[Any]]) -> Callable[
            [web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            done = timed(ext.metrics, name)
            try:
                raw = await read_body(request, MAX_BODY)
                if not ready():
                    ext.metrics.requests.labels(name, "not_ready").inc()
                    return _json({"Error": NOT_READY})
                doc = await handle(raw)
                outcome = "error" if isinstance(doc, dict) and doc.get("Error") else "ok"
                ext.metrics.requests.labels(name, outcome).inc()
                return _json(doc)
            except BadBody as e:
                ext.metrics.requests.labels(name, "bad_request").inc()
                return _json({"Error": f"bad {name} request: {e}"}, e.status)
            except WireError as e:
                ext.metrics.requests.labels(name, "bad_request").inc()
                return _json({"Error": f"bad {name} request: {e}"}, 400)
            except Exception as e:  # the server keeps serving; the caller gets a reason
                log.exception("extender_verb_failed", verb=name)
                ext.metrics.requests.labels(name, "internal_error").inc()
                return _json({"Error": f"internal error in {name}: {type(e).__name__}: {e}"})
            finally:
                done()

        return handler

    async def do_filter(raw: bytes) -> Any:
        return await ext.filter(parse_extender_args(raw))

    async def do_prioritize(raw: bytes) -> Any:
        return ext.prioritize(parse_extender_args(raw))

    async def do_bind(raw: bytes) -> Any:
        return await ext.bind(parse_binding_args(raw))

    async def do_preempt(raw: bytes) -> Any:
        return await ext.preempt(parse_preemption_args(raw))

    async def metrics(request: web.Request) -> web.StreamResponse:
        snap = snapshot(ext.alloc)  # consistent: array copies, well under a ms
        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        await resp.prepare(request)
        await resp.write(generate_latest(ext.metrics.registry))
        # Formatted on the loop in chunks of 50 nodes (about 0.2 ms each at 8 GPUs a
        # node), yielding between them, so a filter waits at most one chunk. A worker
        # thread would hold the GIL for up to its 5 ms switch interval at a time, and
        # its malloc arena kept a few MiB resident after every scrape.
        for chunk in allocation_chunks(snap, nodes_per_chunk=50):
            await resp.write(chunk.encode())
            await anyio.lowlevel.checkpoint()
        await resp.write_eof()
        return resp

    if verbs:
        app.router.add_post("/filter", verb("filter", do_filter))
        app.router.add_post("/prioritize", verb("prioritize", do_prioritize))
        app.router.add_post("/bind", verb("bind", do_bind))
        app.router.add_post("/preempt", verb("preempt", do_preempt))
    if ops:
        add_probes(app, ready, "caches not synced yet")
        app.router.add_get("/metrics", metrics)
        add_status_routes(app, ext, shown or ready)
    return app
