"""A real control plane for tests: etcd, kube-apiserver, and, where a test needs them,
kube-controller-manager and kube-scheduler, as processes on loopback ports.

kube-apiserver runs as envtest runs it (secure serving, client certificates, RBAC and the
Node authorizer, service-account keys) with NodeRestriction on; an administrator client
(``system:masters``) drives the test. Each process logs to a file in the control plane's
directory; a failed wait shows the tails of those logs.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.realkube.api import Api, ApiError, Obj, wait_for
from tests.realkube.pki import Pki


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """One component as a process that can be stopped, frozen and started again."""

    name: str
    argv: list[str]
    log_dir: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    cpus: str | None = None  # run on these CPUs only (taskset's list: "0", "1-3")

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> Proc:
        assert self.proc is None, f"{self.name} is running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            argv = ["taskset", "-c", self.cpus, *self.argv] if self.cpus else self.argv
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(self.env or {})},
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)  # a frozen one must hear SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace)
        self.proc = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"({self.name}: no log)"
        return f"--- {self.name} (last {lines} lines of {self.log_path})\n" + "\n".join(
            text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            code = None if self.proc is None else self.proc.returncode
            raise AssertionError(f"{self.name} is not running (exit {code})\n{self.tail()}")


def kubeconfig(path: Path, server: str, ca: Path, *, token: str | None = None,
               cert: tuple[Path, Path] | None = None, user: str = "user") -> Path:
    creds: dict[str, Any] = {}
    if token:
        creds["token"] = token
    if cert:
        creds["client-certificate"] = str(cert[0])
        creds["client-key"] = str(cert[1])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "realkube",
        "clusters": [{"name": "realkube", "cluster": {
            "server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "realkube", "context": {"cluster": "realkube", "user": user}}],
    }))
    return path


@dataclass
class ControlPlane:
    bin_dir: Path
    dir: Path
    apiserver_flags: Sequence[str] = ()
    audited: bool = True  # the audit log (every request, blocking): tests need it, benchmarks not
    pki: Pki = field(init=False)
    etcd: Proc = field(init=False)
    apiserver: Proc = field(init=False)
    controller_manager: Proc | None = None
    controllers: set[str] = field(default_factory=set)  # what the controller manager runs
    procs: list[Proc] = field(default_factory=list)
    audit_checked: int = 0  # the audit log's offset up to which refusals were expected

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.dir / "pki")
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        serving = self.pki.serving("apiserver")
        self.admin_cert = self.pki.client("admin", "system:masters")
        self.admin = Api(self.server, self.pki.ca, cert=(self.admin_cert.cert,
                                                         self.admin_cert.key))
        self.etcd = Proc("etcd", [
            str(self.bin_dir / "etcd"), "--name=realkube", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer}",
            f"--initial-cluster=realkube=http://127.0.0.1:{self.etcd_peer}",
            "--unsafe-no-fsync", "--log-level=warn"], self.dir)
        self.audit_log = self.dir / "audit.log"
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived", "ResponseStarted"],
            "rules": [{"level": "Metadata"}]}))
        self.apiserver = Proc("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}", f"--secure-port={self.port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca}",
            "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--profiling=false", "--endpoint-reconciler-type=none",
            *self.apiserver_flags], self.dir)
        if self.audited:  # every request with its user and response code: who was refused
            self.apiserver.argv += [
                f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking", "--audit-log-maxsize=0"]
        self.procs = [self.etcd, self.apiserver]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.etcd.start()
        self.apiserver.start()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        def ready() -> bool:
            self.etcd.check_alive()
            self.apiserver.check_alive()
            return self.admin.request("GET", "/readyz") == "ok"
        wait_for("kube-apiserver /readyz", ready, timeout=timeout, every=0.3,
                 detail=self.tails)
        # the bootstrap RBAC policy and the system namespaces exist once ready
        wait_for("namespace kube-system", lambda: self.admin.find("Namespace", "kube-system"),
                 timeout=30, detail=self.tails)

    def restart_apiserver(self) -> None:
        self.apiserver.stop()
        self.apiserver.start()
        self.wait_ready()

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def tails(self) -> str:
        return "\n".join(p.tail(40) for p in self.procs)

    def audit(self, since: int = 0) -> tuple[list[Obj], int]:
        """Audit events written after byte offset ``since``, and the new offset."""
        import json
        try:
            with self.audit_log.open("rb") as f:
                f.seek(since)
                data = f.read()
        except FileNotFoundError:
            return [], since
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return events, since + end

    def audit_forget(self, until: int) -> None:
        """Tests that provoke refusals on purpose: the refusal check starts after
        them (see conftest's ``_no_role_was_refused``)."""
        _, end = self.audit(until)
        self.audit_checked = end

    # -- credentials -------------------------------------------------------------------

    def kubeconfig_for_cert(self, name: str, user: str, group: str | None = None) -> Path:
        pair = self.pki.client(user, *([group] if group else []))
        return kubeconfig(self.dir / f"{name}.kubeconfig", self.server, self.pki.ca,
                          cert=(pair.cert, pair.key), user=user)

    def token(self, namespace: str, service_account: str, seconds: int = 86400, *,
              pod: Obj | None = None) -> str:
        """A token of the ServiceAccount; bound to ``pod`` (as a pod's projected token
        is), it carries the pod's node in ``authentication.kubernetes.io/node-name``."""
        spec: Obj = {"expirationSeconds": seconds}
        if pod is not None:
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod",
                                      "name": pod["metadata"]["name"],
                                      "uid": pod["metadata"]["uid"]}
        review = self.admin.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        token: str = review["status"]["token"]
        return token

    def kubeconfig_for_service_account(self, namespace: str, name: str) -> Path:
        return kubeconfig(self.dir / f"sa-{namespace}-{name}.kubeconfig", self.server,
                          self.pki.ca, token=self.token(namespace, name),
                          user=f"system:serviceaccount:{namespace}:{name}")

    def as_service_account(self, namespace: str, name: str) -> Api:
        return self.admin.as_token(self.token(namespace, name))

    # -- components a test may add -----------------------------------------------------

    def start_controller_manager(self, controllers: str) -> Proc:
        """kube-controller-manager running ``controllers`` (comma list, as its flag) and
        those earlier callers asked for: one that runs fewer is restarted with all."""
        wanted = set(filter(None, controllers.split(",")))
        if self.controller_manager is not None:
            if wanted <= self.controllers:
                return self.controller_manager
            self.controller_manager.stop()
            self.procs.remove(self.controller_manager)
            self.controller_manager = None
        self.controllers |= wanted
        controllers = ",".join(sorted(self.controllers))
        kc = self.kubeconfig_for_cert("kube-controller-manager",
                                      "system:kube-controller-manager")
        p = Proc("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            f"--controllers={controllers}", "--leader-elect=false",
            f"--secure-port={free_port()}", "--bind-address=127.0.0.1",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca}", "--use-service-account-credentials=true",
            "--concurrent-gc-syncs=2", "--v=1"], self.dir)
        p.start()
        self.controller_manager = p
        self.procs.append(p)
        return p

    # -- objects -----------------------------------------------------------------------

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create a namespace and its ``default`` service account (no controller
        manager makes it here); idempotent."""
        with contextlib.suppress(ApiError):
            self.admin.create({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": name, "labels": labels or {}}})
        with contextlib.suppress(ApiError):
            self.admin.create({"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": "default", "namespace": name}})
        return name

    def add_node(self, name: str, *, annotations: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None,
                 allocatable: dict[str, str] | None = None) -> Obj:
        """A Node as a kubelet would report it, without a kubelet: Ready, untainted (the
        TaintNodesByCondition admission adds not-ready at creation), with ``allocatable``
        (cpu, memory, pods by default, plus what a device plugin would advertise)."""
        self.admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "annotations": annotations or {},
            "labels": {"kubernetes.io/hostname": name, **(labels or {})}}})
        self.admin.patch("Node", name, {"spec": {"taints": None}})
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self.admin.patch("Node", name, {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "no kubelet: a test's node", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}}, sub="status")

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (physically); returns the revision."""
        import json
        import urllib.request

        def post(path: str, body: dict[str, Any]) -> Any:
            req = urllib.request.Request(self.etcd_url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())

        rev = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode(),
                                        "limit": 1})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev
