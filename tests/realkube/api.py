"""A small synchronous client for the test's own calls to the real API server.

The tests drive the cluster as a user or an administrator would (create, apply, patch,
delete, wait); vgpud's own client is what is under test, so the harness keeps to the
standard library. Every error carries the server's status and message."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

Obj = dict[str, Any]
T = TypeVar("T")

# kind -> (API path prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Event": ("/api/v1", "events", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", False),
}


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, code: int, body: Obj | str) -> None:
        self.code = code
        self.body = body
        self.message = body.get("message", "") if isinstance(body, dict) else str(body)
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        super().__init__(f"{method} {path}: {code} {self.reason}: {self.message}")


def path_of(kind: str, name: str | None = None, namespace: str | None = None,
            sub: str | None = None) -> str:
    prefix, plural, namespaced = KINDS[kind]
    p = prefix
    if namespaced and namespace:
        p += f"/namespaces/{namespace}"
    p += f"/{plural}"
    if name:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p


class Api:
    def __init__(self, server: str, ca: Path, *, cert: tuple[Path, Path] | None = None,
                 token: str | None = None, user_agent: str = "vgpud-realkube-tests") -> None:
        self.server = server.rstrip("/")
        self.ca, self.cert, self.token = ca, cert, token
        ctx = ssl.create_default_context(cafile=str(ca))
        if cert:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        self._ctx = ctx
        self.user_agent = user_agent

    def as_token(self, token: str) -> Api:
        return Api(self.server, self.ca, token=token)

    # -- raw ---------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str = "application/json",
                timeout: float = 30) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", self.user_agent)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed: Obj | str = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise ApiError(method, path, e.code, parsed) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def watch(self, path: str, query: dict[str, str] | None = None, *,
              timeout: float = 3600) -> Iterator[Obj]:
        """The events of a watch (``?watch=1``), one dict each, until the server ends it."""
        url = self.server + path + "?" + urllib.parse.urlencode({**(query or {}),
                                                                 "watch": "1"})
        req = urllib.request.Request(url, method="GET")
        req.add_header("Accept", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)

    # -- objects -----------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        out: Obj = self.request("GET", path_of(kind, name, namespace))
        return out

    def find(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(kind, name, namespace)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, **query: str) -> list[Obj]:
        out: list[Obj] = self.request("GET", path_of(kind, namespace=namespace),
                                      query=query or None)["items"]
        return out

    def create(self, obj: Obj, *, namespace: str | None = None, **query: str) -> Obj:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        out: Obj = self.request("POST", path_of(obj["kind"], namespace=ns), obj,
                                query=query or None)
        return out

    def apply(self, obj: Obj, *, manager: str = "kubectl", force: bool = True) -> Obj:
        """Server-side apply, as ``kubectl apply --server-side`` sends it."""
        meta = obj["metadata"]
        query = {"fieldManager": manager}
        if force:
            query["force"] = "true"
        out: Obj = self.request(
            "PATCH", path_of(obj["kind"], meta["name"], meta.get("namespace")),
            # JSON is YAML, and unlike PyYAML's output it has no 1.1 surprises (a name
            # `y` reads as true in the server's YAML decoder)
            json.dumps(obj).encode(), query=query,
            content_type="application/apply-patch+yaml")
        return out

    def patch(self, kind: str, name: str, patch: Obj, namespace: str | None = None, *,
              sub: str | None = None, patch_type: str = "merge") -> Obj:
        ctype = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}[patch_type]
        out: Obj = self.request("PATCH", path_of(kind, name, namespace, sub), patch,
                                content_type=ctype)
        return out

    def delete(self, kind: str, name: str, namespace: str | None = None, *,
               grace: int | None = None, missing_ok: bool = True) -> None:
        body = None if grace is None else {"gracePeriodSeconds": grace}
        try:
            self.request("DELETE", path_of(kind, name, namespace), body)
        except ApiError as e:
            if not (missing_ok and e.code == 404):
                raise


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float = 60,
             every: float = 0.2, detail: Callable[[], str] | None = None) -> T:
    """Poll ``probe`` until it returns something other than None/False; fail with ``what``
    (and ``detail()``, say the logs) when ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            got = probe()
        except (ApiError, OSError) as e:  # OSError: not listening yet (URLError)
            got, last_error = None, e
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            extra = f"\nlast error: {last_error}" if last_error else ""
            if detail is not None:
                extra += "\n" + detail()
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(every)
