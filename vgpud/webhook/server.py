"""The webhook's HTTP servers (aiohttp).

The *review* app (HTTPS): ``POST /mutate`` and ``POST /validate``, each an
``AdmissionReview`` v1 in and out. The *ops* app: ``GET /healthz``, ``/readyz``,
``/metrics`` — on the HTTPS port too, unless ``--metrics-listen`` puts them apart.

A review whose pod cannot be read (``spec.containers`` not a list, ``resources`` not an
object, …) or, on ``/mutate`` as on ``/validate``, a GPU pod whose request is malformed
(a quantity that is not one) is answered ``allowed: false`` with the reason. A body that
is not a review gets a 400 with the reason (whatever it holds: not JSON,
nested too deep, not what its ``Content-Encoding`` says), a body over :data:`MAX_BODY` a
413; an unexpected failure is logged and answered with a 500-free
``allowed: false`` review naming it, so the API server shows the user a reason (and
the server keeps serving).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from vgpud.core.admission import (
    AdmissionPolicy,
    Catalogue,
    Verdict,
    admit,
    admit_for_dra,
    validate,
)
from vgpud.core.translate import Shape
from vgpud.ops import Guard
from vgpud.process import BadBody, add_probes, read_body
from vgpud.webhook.wire import Review, WireError, answer, parse_review

log = structlog.get_logger(__name__)

# The API server sends at most an object and its old version; etcd holds objects up to
# 1.5 MiB, so 4 MiB bounds every real review and refuses junk early.
MAX_BODY = 4 << 20


class _Count(Collector):
    """A counter whose value someone else keeps (read at scrape time)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.source: Callable[[], float] = lambda: 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=self.source())


ENDPOINTS = ("mutate", "validate")
OUTCOMES = ("allowed", "patched", "denied", "skipped", "bad_request", "error")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "vgpud_webhook_reviews", "Admission reviews answered, by endpoint and outcome "
            "(allowed, patched, denied, skipped: not a Pod CREATE, bad_request, error).",
            ["endpoint", "outcome"], registry=self.registry)
        self.seconds = Histogram(
            "vgpud_webhook_review_duration_seconds",
            "Time to answer one review, body read included.",
            ["endpoint"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.gpu_nodes = Gauge(
            "vgpud_webhook_gpu_nodes", "Nodes with a GPU inventory the webhook knows of "
            "(requests larger than any of their GPUs are denied).", registry=self.registry)
        self.tls_loads = _Count(
            "vgpud_webhook_tls_loads", "Times the serving certificate was loaded (1 at start, "
            "+1 per rotation).")
        self.registry.register(self.tls_loads)
        for endpoint in ENDPOINTS:  # known label values start at 0
            self.seconds.labels(endpoint)
            for outcome in OUTCOMES:
                self.reviews.labels(endpoint, outcome)


# makes the ResourceClaimTemplates a pod headed to DRA nodes names, in its namespace (run.py:
# ClaimTemplates); raises TemplateError with the reason when it cannot
Templates = Callable[[str, tuple[Shape, ...]], Awaitable[None]]


class TemplateError(Exception):
    """A claim template could not be made; ``str()`` says why, for the user."""


async def _review(r: Review, endpoint: str, policy: AdmissionPolicy,
                  catalogue: Callable[[], Catalogue], templates: Templates | None,
                  ) -> tuple[dict[str, Any], str]:
    if not r.is_pod_create:
        return answer(r.uid, Verdict(True)), "skipped"
    dra = admit_for_dra(r.obj, policy) if endpoint == "mutate" else None
    if dra is not None:
        verdict, ops, shapes = dra
        if verdict.allowed and shapes and not r.dry_run:
            try:
                if templates is None:
                    raise TemplateError("this webhook has no API client to make them with")
                await templates(r.namespace, shapes)
            except TemplateError as e:
                verdict, ops = Verdict(False, f"vgpud: the pod's ResourceClaimTemplates "
                                              f"cannot be made: {e}"), []
        if not verdict.allowed:
            return answer(r.uid, verdict), "denied"
        return answer(r.uid, verdict, ops), "patched"
    if endpoint == "mutate":
        verdict, ops = admit(r.obj, policy)
        if not verdict.allowed:
            return answer(r.uid, verdict), "denied"
        return answer(r.uid, verdict, ops), "patched" if ops else "allowed"
    verdict = validate(r.obj, policy, catalogue())
    return answer(r.uid, verdict), "allowed" if verdict.allowed else "denied"


def make_app(policy: AdmissionPolicy, catalogue: Callable[[], Catalogue], metrics: Metrics,
             ready: Callable[[], bool], *, reviews: bool = True,
             ops: bool = True, guard: Guard | None = None,
             templates: Templates | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    if guard is not None and ops:  # /metrics; the reviews never (the API server sends no token)
        guard.install(app, exempt=("/mutate", "/validate") if reviews else ())

    def endpoint(name: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            start = time.perf_counter()
            outcome = "error"
            try:
                review = parse_review(await read_body(request, MAX_BODY))
                try:
                    doc, outcome = await _review(review, name, policy, catalogue, templates)
                except Exception as e:  # a bug must not become a 5xx and a blocked pod
                    log.exception("webhook_review_failed", endpoint=name, uid=review.uid)
                    doc = answer(review.uid, Verdict(False, (
                        f"vgpud webhook: internal error ({type(e).__name__}: {e}); "
                        "please report it")))
                if outcome == "denied":
                    log.info("pod_denied", namespace=review.namespace,
                             reason=doc["response"]["status"]["message"])
                return web.json_response(doc, dumps=_dumps)
            except BadBody as e:
                outcome = "bad_request"
                return web.json_response({"error": f"bad AdmissionReview: {e}"},
                                         status=e.status)
            except WireError as e:
                outcome = "bad_request"
                return web.json_response({"error": f"bad AdmissionReview: {e}"}, status=400)
            finally:
                metrics.reviews.labels(name, outcome).inc()
                metrics.seconds.labels(name).observe(time.perf_counter() - start)

        return handler

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    if reviews:
        app.router.add_post("/mutate", endpoint("mutate"))
        app.router.add_post("/validate", endpoint("validate"))
    if ops:
        add_probes(app, ready, "not ready: certificates not loaded yet")
        app.router.add_get("/metrics", metrics_page)
    return app


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))
