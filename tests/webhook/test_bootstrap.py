"""Built-in certificates against the API stand-in: the Secret is created once and shared
by replicas, the caBundle is set on both webhook configurations, the served
certificate verifies against that CA under the Service's DNS name, and a renewal keeps
the CA."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.kube.clocks import ManualClock
from tests.standin.apiserver import ApiServer
from tests.webhook.conftest import review
from vgpud.kube.client import KubeClient
from vgpud.webhook.bootstrap import (
    RENEW_BEFORE,
    SERVING_LIFETIME,
    Bootstrap,
    issue_ca,
    issue_serving,
    service_names,
    still_good,
)
from vgpud.webhook.run import BootstrapOptions

pytestmark = pytest.mark.anyio
NS, SECRET, CONF = "vgpud-system", "vgpud-webhook-tls", "vgpud-webhook"
HOST = "vgpud-webhook.vgpud-system.svc"


def configurations(api: ApiServer) -> None:
    for resource, kind in (("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
                           ("validatingwebhookconfigurations",
                            "ValidatingWebhookConfiguration")):
        api.create(resource, {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": CONF},
            "webhooks": [{"name": f"{w}.vgpud.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None",
                          "clientConfig": {"service": {"name": "vgpud-webhook",
                                                       "namespace": NS, "path": f"/{w}"}}}
                         for w in ("pods", "pods-again")]})


def bundles(api: ApiServer) -> set[str]:
    out = set()
    for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for hook in api.get(resource, CONF, namespace="")["webhooks"]:
            out.add(hook["clientConfig"].get("caBundle"))
    return out


async def test_replicas_share_one_secret_and_the_ca_bundle_is_set(webhook_factory: Any) -> None:
    boot = BootstrapOptions(SECRET, NS, "vgpud-webhook", CONF)
    first = await webhook_factory(bootstrap=boot)
    api = first.api
    configurations(api)
    second = await webhook_factory(bootstrap=boot)  # sets the bundle now they exist
    secret = api.get("secrets", SECRET, namespace=NS)
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    assert bundles(api) == {secret["data"]["ca.crt"]}
    for w in (first, second):
        served = (w.tls_dir / "tls.crt").read_bytes()
        assert served == base64.b64decode(secret["data"]["tls.crt"])  # one certificate
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        async with w.session.post(
                w.url + "/validate", json=review({"spec": {"containers": []}}), ssl=ctx,
                server_hostname=HOST) as r:
            assert r.status == 200 and (await r.json())["response"]["allowed"] is True
    assert (first.tls_dir / "tls.key").stat().st_mode & 0o077 == 0


async def test_renewal_keeps_the_ca_and_replaces_an_expiring_certificate(
        tmp_path: Path) -> None:
    now = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
    clock = ManualClock(wall=now)
    async with ApiServer() as api, KubeClient.for_url(api.url) as kube:
        b = Bootstrap(kube, NS, SECRET, service_names("vgpud-webhook", NS),
                      tmp_path / "tls.crt", tmp_path / "tls.key", None, clock=clock)
        ca, serving = await b.ensure_secret()
        assert await b.ensure_secret() == (ca, serving)  # still good: untouched
        clock.set_wall(now + SERVING_LIFETIME - RENEW_BEFORE + dt.timedelta(days=1))
        ca2, serving2 = await b.ensure_secret()
        assert ca2 == ca and serving2 != serving
        cert = serving2.certificate()
        cert.verify_directly_issued_by(ca.certificate())
        assert cert.not_valid_after_utc > clock.wall() + RENEW_BEFORE
        stored = api.get("secrets", SECRET, namespace=NS)
        assert base64.b64decode(stored["data"]["tls.crt"]) == serving2.cert


def test_still_good_checks_issuer_names_and_time() -> None:
    now = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
    ca, other = issue_ca(now), issue_ca(now)
    names = service_names("w", "ns")
    serving = issue_serving(ca, names, now)
    assert still_good(serving, ca, names, now)
    assert not still_good(serving, other, names, now)  # another CA
    assert not still_good(serving, ca, [*names, "w.elsewhere.svc"], now)
    assert not still_good(serving, ca, names, now + SERVING_LIFETIME)
    sans = serving.certificate().extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == names
