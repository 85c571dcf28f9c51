"""Built-in certificates, for clusters without cert-manager.

At start (and then daily) the webhook makes sure a Secret in its namespace holds a
CA and a serving certificate for the webhook Service's DNS names, valid for at
least :data:`RENEW_BEFORE` more; it writes the serving pair to the files the HTTPS
server loads (:class:`vgpud.webhook.tls.TlsFiles` picks them up), and sets the CA
as ``caBundle`` on every webhook of the vgpud Mutating- and
ValidatingWebhookConfiguration.

Several replicas may start together: the Secret is created once (a replica that
loses the race with ``409 AlreadyExists`` reads the winner's) and replaced with its
``resourceVersion`` (a lost race re-reads). The CA outlives serving certificates, so
a renewal does not change ``caBundle``.

The certificates themselves are pure functions of a clock and the names
(:func:`issue_ca`, :func:`issue_serving`); keys are ECDSA P-256.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vgpud.kube.client import KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

log = structlog.get_logger(__name__)

CA_LIFETIME = dt.timedelta(days=3650)
SERVING_LIFETIME = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
JSON_PATCH = "application/json-patch+json"
CHECK_EVERY = 24 * 3600.0


class BootstrapError(RuntimeError):
    """The certificates could not be set up; ``str()`` says which object and why."""


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its key, PEM."""

    cert: bytes
    key: bytes

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert)


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may use for a webhook Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _key() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    k = ec.generate_private_key(ec.SECP256R1())
    pem = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    return k, pem


def issue_ca(now: dt.datetime, *, lifetime: dt.timedelta = CA_LIFETIME) -> Pair:
    key, key_pem = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vgpud-webhook-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return Pair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def issue_serving(ca: Pair, names: Sequence[str], now: dt.datetime, *,
                  lifetime: dt.timedelta = SERVING_LIFETIME) -> Pair:
    ca_cert = ca.certificate()
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key, key_pem = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + lifetime)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Pair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def still_good(serving: Pair, ca: Pair, names: Sequence[str], now: dt.datetime) -> bool:
    """Is ``serving`` signed by ``ca``, for every name, and valid past the renewal margin?"""
    try:
        cert, ca_cert = serving.certificate(), ca.certificate()
        cert.verify_directly_issued_by(ca_cert)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    return (set(names) <= set(sans.get_values_for_type(x509.DNSName))
            and cert.not_valid_after_utc - now > RENEW_BEFORE
            and ca_cert.not_valid_after_utc - now > RENEW_BEFORE)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_pairs(secret: dict[str, Any]) -> tuple[Pair, Pair] | None:
    data = secret.get("data") or {}
    try:
        got = {k: base64.b64decode(data[k], validate=True)
               for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    except (KeyError, ValueError, TypeError):
        return None
    return Pair(got["ca.crt"], got["ca.key"]), Pair(got["tls.crt"], got["tls.key"])


@dataclass
class Bootstrap:
    """Keeps the Secret, the serving files and the ``caBundle`` in step."""

    kube: KubeClient
    namespace: str
    secret: str
    names: Sequence[str]
    cert_file: Path
    key_file: Path
    configuration: str | None
    clock: Clock = SYSTEM_CLOCK

    def _body(self, ca: Pair, serving: Pair, version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.secret, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/name": "vgpud",
                                           "app.kubernetes.io/component": "webhook"}}
        if version:
            meta["resourceVersion"] = version
        return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": meta,
                "data": {"ca.crt": _b64(ca.cert), "ca.key": _b64(ca.key),
                         "tls.crt": _b64(serving.cert), "tls.key": _b64(serving.key)}}

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self.kube.call(self.kube.core.read_namespaced_secret, self.secret,
                                        self.namespace)
        except NotFound:
            return None

    async def ensure_secret(self) -> tuple[Pair, Pair]:
        """The CA and serving pair in the Secret, created or renewed as needed."""
        for _ in range(5):
            now = self.clock.wall()
            current = await self._read()
            pairs = _secret_pairs(current) if current is not None else None
            if pairs is not None and still_good(pairs[1], pairs[0], self.names, now):
                return pairs
            ca = pairs[0] if pairs is not None and _ca_ok(pairs[0], now) else issue_ca(now)
            serving = issue_serving(ca, self.names, now)
            try:
                if current is None:
                    await self.kube.call(self.kube.core.create_namespaced_secret,
                                         self.namespace, self._body(ca, serving, None))
                else:
                    version = (current.get("metadata") or {}).get("resourceVersion")
                    await self.kube.call(self.kube.core.replace_namespaced_secret, self.secret,
                                         self.namespace, self._body(ca, serving, version))
            except (AlreadyExists, Conflict):
                continue  # another replica wrote it first: use theirs
            log.info("webhook_certificate_issued", secret=f"{self.namespace}/{self.secret}",
                     new_ca=pairs is None or ca is not pairs[0],
                     expires=serving.certificate().not_valid_after_utc.isoformat())
            return ca, serving
        raise BootstrapError(f"Secret {self.namespace}/{self.secret} kept changing while "
                             "the webhook certificate was being written")

    def write_files(self, serving: Pair) -> None:
        for path, data, mode in ((self.key_file, serving.key, 0o600),
                                 (self.cert_file, serving.cert, 0o644)):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            tmp.replace(path)

    async def patch_ca_bundle(self, ca: Pair) -> int:
        """Set ``caBundle`` on every webhook of both configurations; how many changed."""
        if not self.configuration:
            return 0
        bundle = _b64(ca.cert)
        adm = self.kube.admission
        changed = 0
        for read, patch in ((adm.read_mutating_webhook_configuration,
                             adm.patch_mutating_webhook_configuration),
                            (adm.read_validating_webhook_configuration,
                             adm.patch_validating_webhook_configuration)):
            try:
                conf = await self.kube.call(read, self.configuration)
            except NotFound:
                log.warning("webhook_configuration_missing", name=self.configuration)
                continue
            ops: list[dict[str, Any]] = []
            for i, hook in enumerate(conf.get("webhooks") or []):
                if (hook.get("clientConfig") or {}).get("caBundle") != bundle:
                    ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]},
                            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                             "value": bundle}]
            if ops:
                await self.kube.call(patch, self.configuration, ops, _content_type=JSON_PATCH)
                changed += len(ops) // 2
        return changed

    async def once(self) -> None:
        ca, serving = await self.ensure_secret()
        await anyio.to_thread.run_sync(self.write_files, serving)
        n = await self.patch_ca_bundle(ca)
        if n:
            log.info("webhook_ca_bundle_set", configuration=self.configuration, webhooks=n)

    async def run(self, every: float = CHECK_EVERY) -> None:
        """Renew as needed, forever (after the first :meth:`once` at start)."""
        while True:
            await self.clock.sleep(every)
            try:
                await self.once()
            except KubeError as e:
                log.warning("webhook_certificate_check_failed", error=str(e))


def _ca_ok(ca: Pair, now: dt.datetime) -> bool:
    try:
        cert = ca.certificate()
        serialization.load_pem_private_key(ca.key, password=None)
    except (ValueError, TypeError):
        return False
    return cert.not_valid_after_utc - now > 2 * SERVING_LIFETIME
