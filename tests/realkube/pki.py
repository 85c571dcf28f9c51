"""The certificates and keys of a test control plane, written to one directory.

One CA signs everything: the API server's serving certificate (127.0.0.1), the admin's
client certificate (group ``system:masters``), kubelets' client certificates
(``system:node:NAME`` in ``system:nodes``), the front proxy's, and the webhook's serving
certificate. The service-account signing key is a separate RSA key (kube-apiserver signs
tokens with RS256)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name="vgpud-realkube")
        self.ca = self.dir / "ca.crt"
        self._ca.cert_pem.write_to_path(str(self.ca))
        self.ca_pem = self._ca.cert_pem.bytes()
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = self.dir / "sa.key"
        self.sa_key.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        self.sa_pub = self.dir / "sa.pub"
        self.sa_pub.write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def issue(self, name: str, *identities: str, common_name: str | None = None,
              groups: str | None = None) -> Pair:
        """A leaf certificate (server and client use) and its key, as two files."""
        leaf = self._ca.issue_cert(*identities, common_name=common_name,
                                   organization_name=groups)
        pair = Pair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        leaf.cert_chain_pems[0].write_to_path(str(pair.cert))
        leaf.private_key_pem.write_to_path(str(pair.key))
        return pair

    def serving(self, name: str) -> Pair:
        return self.issue(name, "127.0.0.1", "localhost", common_name=name)

    def client(self, user: str, *groups: str) -> Pair:
        # trustme puts one organization in the subject: one group is enough here
        assert len(groups) <= 1, "one group per client certificate"
        return self.issue(f"client-{user.replace(':', '-')}", "client.invalid",
                          common_name=user, groups=groups[0] if groups else None)
