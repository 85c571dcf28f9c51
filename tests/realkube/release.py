"""vgpud installed on a real control plane as its Helm chart installs it.

The chart is rendered (``helm template``, with the test's ``--set`` values) and its
objects are applied to the real API server: service accounts, (cluster) roles and their
bindings, the settings and kube-scheduler ConfigMaps, the webhook configurations. The
webhook configurations keep every field but ``clientConfig``, which names a local URL and
the test CA's ``caBundle`` instead of the in-cluster Service. The Deployments become
processes here, each with the credentials its pod would have:

- ``vgpud webhook`` and ``vgpud scheduler`` with a token of their own ServiceAccount (so a
  call their RBAC does not allow fails as it would in a cluster);
- kube-scheduler with the rendered KubeSchedulerConfiguration (only ``urlPrefix`` moved to
  the local extender and ``clientConnection.kubeconfig`` set: in-cluster config is what the
  pod uses) and the Deployment's own flags, also with the scheduler's ServiceAccount token.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.rendered import Manifests, load_render
from tests.realkube.api import ApiError, Obj, wait_for
from tests.realkube.controlplane import ControlPlane, Proc, free_port, kubeconfig
from vgpud.core.dra import DRIVER

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "kube-system"
APPLIED = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ConfigMap", "PriorityClass")


def render(sets: tuple[str, ...] = ()) -> Manifests:
    """The chart rendered with ``--set`` values; the committed manifests without any."""
    if not sets:
        return Manifests.committed()
    r = load_render()
    return Manifests.parse(r.render(r.obtain_helm(), sets, lint=False))


def _args_of(m: Manifests, workload: str, container: str) -> list[str]:
    for c in m.pod_spec("Deployment", workload)["containers"]:
        if c["name"] == container:
            return list(c.get("command") or []) + list(c.get("args") or [])
    raise AssertionError(f"no container {container} in {workload}")


def _flag_dropped(args: list[str], *names: str) -> list[str]:
    return [a for a in args if not any(a.startswith(f"--{n}=") for n in names)]


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Release:
    cp: ControlPlane
    dir: Path
    sets: tuple[str, ...] = ()
    manifests: Manifests = field(init=False)
    webhook: Proc | None = None
    extender: Proc | None = None
    kube_scheduler: Proc | None = None
    cpus: str | None = None  # the CPUs its processes run on (taskset's list), None: any

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifests = render(self.sets)
        self.extender_port, self.extender_ops = free_port(), free_port()
        self.webhook_port, self.webhook_ops = free_port(), free_port()
        self.webhook_tls = self.cp.pki.serving("webhook")

    # -- the chart's objects -----------------------------------------------------------

    def apply_objects(self, *, webhooks: bool = True) -> None:
        for doc in self.manifests.docs:
            if doc["kind"] in APPLIED:
                self.cp.admin.apply(doc, manager="helm")
        for doc in self.manifests.docs if webhooks else ():
            if doc["kind"].endswith("WebhookConfiguration"):
                self.cp.admin.apply(self.local_webhook(doc), manager="helm")

    def local_webhook(self, doc: Obj) -> Obj:
        out = copy.deepcopy(doc)
        ca = base64.b64encode(self.cp.pki.ca_pem).decode()
        for hook in out["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}",
                                    "caBundle": ca}
        out["metadata"].pop("annotations", None)
        return out

    def settings(self) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load(
            self.manifests.configmap_file("vgpud-settings", "vgpud.yaml"))
        return data

    # -- the processes -----------------------------------------------------------------

    def _vgpud(self, name: str, args: list[str], service_account: str) -> Proc:
        settings = self.dir / "vgpud.yaml"
        settings.write_text(yaml.safe_dump(self.settings()))
        kc = self.cp.kubeconfig_for_service_account(NAMESPACE, service_account)
        args = _flag_dropped(args, "config", "listen", "metrics-listen", "tls-cert", "tls-key",
                             "bootstrap-secret", "service-name", "webhook-configuration")
        return Proc(name, [sys.executable, "-m", "vgpud", *args, f"--config={settings}",
                           f"--kubeconfig={kc}"], self.dir,
                    env={"PYTHONPATH": str(ROOT), "VGPUD_LOG_FORMAT": "console"},
                    cpus=self.cpus)

    def start_webhook(self) -> Proc:
        args = _args_of(self.manifests, "vgpud-webhook", "webhook")
        p = self._vgpud("vgpud-webhook", args, "vgpud-webhook")
        p.argv += [f"--listen=127.0.0.1:{self.webhook_port}",
                   f"--metrics-listen=127.0.0.1:{self.webhook_ops}",
                   f"--tls-cert={self.webhook_tls.cert}", f"--tls-key={self.webhook_tls.key}"]
        p.start()
        self.webhook = p
        self._wait_ops(p, self.webhook_ops)
        return p

    def start_extender(self) -> Proc:
        args = _args_of(self.manifests, "vgpud-scheduler", "extender")
        p = self._vgpud("vgpud-scheduler", args, "vgpud-scheduler")
        p.argv += [f"--listen=127.0.0.1:{self.extender_port}",
                   f"--metrics-listen=127.0.0.1:{self.extender_ops}"]
        p.start()
        self.extender = p
        self._wait_ops(p, self.extender_ops)
        return p

    def _wait_ops(self, p: Proc, port: int, timeout: float = 60) -> None:
        def ready() -> bool:
            p.check_alive()
            return _get_ok(f"http://127.0.0.1:{port}/readyz")
        wait_for(f"{p.name} /readyz", ready, timeout=timeout, detail=lambda: p.tail())

    def scheduler_configuration(self) -> dict[str, Any]:
        cfg = self.manifests.scheduler_config()
        (ext,) = cfg["extenders"]
        ext["urlPrefix"] = f"http://127.0.0.1:{self.extender_port}"
        cfg["clientConnection"] = {**(cfg.get("clientConnection") or {}),
                                   "kubeconfig": str(self._scheduler_kubeconfig())}
        return cfg

    def _scheduler_kubeconfig(self) -> Path:
        return self.cp.kubeconfig_for_service_account(NAMESPACE, "vgpud-scheduler")

    def kube_scheduler_flags(self) -> list[str]:
        """The Deployment's kube-scheduler flags, but ``--config`` and ``--secure-port``."""
        args = _flag_dropped(_args_of(self.manifests, "vgpud-scheduler", "kube-scheduler"),
                             "config", "secure-port")
        assert args[0] == "kube-scheduler", args
        return args[1:]

    def start_kube_scheduler(self) -> Proc:
        cfg_path = self.dir / "kube-scheduler-config.yaml"
        cfg_path.write_text(yaml.safe_dump(self.scheduler_configuration()))
        kc = self._scheduler_kubeconfig()
        p = Proc("kube-scheduler", [
            str(self.cp.bin_dir / "kube-scheduler"), *self.kube_scheduler_flags(),
            f"--config={cfg_path}",
            f"--secure-port={free_port()}", "--bind-address=127.0.0.1",
            # what in-cluster configuration gives the pod's delegated authn/authz
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"],
            self.dir, cpus=self.cpus)
        p.start()
        self.kube_scheduler = p
        lease = self.scheduler_configuration()["leaderElection"]

        def leading() -> bool:
            p.check_alive()
            if not lease.get("leaderElect"):
                return True
            got = self.cp.admin.find("Lease", lease["resourceName"],
                                     lease["resourceNamespace"])
            return bool(got and (got.get("spec") or {}).get("holderIdentity"))
        wait_for("kube-scheduler to lead", leading, timeout=90, detail=lambda: p.tail())
        return p

    # -- all of it -----------------------------------------------------------------------

    def start(self, *, webhook: bool = True, scheduler: bool = True) -> Release:
        self.apply_objects()
        if webhook:
            self.start_webhook()
        if scheduler:
            self.start_extender()
            self.start_kube_scheduler()
        return self

    @property
    def procs(self) -> list[Proc]:
        return [p for p in (self.kube_scheduler, self.extender, self.webhook) if p]

    def stop(self) -> None:
        for p in self.procs:
            p.stop()
        self.kube_scheduler = self.extender = self.webhook = None

    def uninstall(self) -> None:
        """Stop the processes and delete the webhook configurations (so another release,
        or none, admits the next pods)."""
        self.stop()
        for doc in self.manifests.docs:
            if doc["kind"].endswith("WebhookConfiguration"):
                self.cp.admin.delete(doc["kind"], doc["metadata"]["name"])

    def tails(self) -> str:
        return "\n".join(p.tail(50) for p in self.procs)

    def extender_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.extender_ops}/metrics",
                                    timeout=10) as r:
            return str(r.read().decode())


def lease_released(cp: ControlPlane, name: str) -> None:
    """Drop a leader Lease left behind, so the next kube-scheduler leads at once."""
    try:
        cp.admin.delete("Lease", name, NAMESPACE)
    except ApiError:
        pass


# -- the identity of `vgpud dra` (dra.enabled=true) ----------------------------------------

DRA_ACCOUNT = "vgpud-dra"
DRA_USER = f"system:serviceaccount:{NAMESPACE}:{DRA_ACCOUNT}"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# what holds the DRA role's writes to its own node: its ResourceSlices (the DRA scope) and
# its Node and that node's pods (the device plugin's scope, which names the DRA account too)
DRA_POLICIES = ("vgpud-dra-scope", "vgpud-plugin-scope")
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def driver_pod(cp: ControlPlane, node: str) -> Obj:
    """A pod of the DRA ServiceAccount on ``node``, as the chart's DaemonSet makes one (no
    token mounted: a test asks for its token). A token bound to it names the node."""
    pod: Obj = cp.admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{node}-dra", "namespace": NAMESPACE}, "spec": {
        "nodeName": node, "serviceAccountName": DRA_ACCOUNT,
        "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "dra", "image": "registry.invalid/vgpud"}]}})
    return pod


def driver_kubeconfig(cp: ControlPlane, pod: Obj, path: Path) -> Path:
    """A kubeconfig with the DRA ServiceAccount's token bound to ``pod`` (what the
    DaemonSet's pod reads in-cluster)."""
    return kubeconfig(path, cp.server, cp.pki.ca, token=cp.token(NAMESPACE, DRA_ACCOUNT, pod=pod),
                      user=DRA_USER)


def _probe_slice(node: str) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-probe"},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": [],
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def _dra_policies_enforced(cp: ControlPlane, node: str) -> tuple[bool | None, bool | None]:
    """Whether admission holds the DRA account to a node now: its ResourceSlice writes
    (the DRA scope) and its node writes (the plugin scope), probed with a token that
    names no node (which either policy refuses; None: refused otherwise, as while RBAC has
    not seen the new binding yet); what a probe wrote is undone."""
    unbound = cp.as_service_account(NAMESPACE, DRA_ACCOUNT)

    def probe(write: Any, undo: Any = None) -> bool | None:
        try:
            write()
        except ApiError as e:
            return True if e.code == 403 and "names no node" in e.message else None
        if undo is not None:
            undo()
        return False

    slice_ = _probe_slice(node)
    return (probe(lambda: unbound.create(slice_),
                  lambda: cp.admin.delete("ResourceSlice", slice_["metadata"]["name"])),
            probe(lambda: unbound.patch("Node", node, {"metadata": {"annotations": {
                "vgpud.io/probe": "x"}}})))


@contextlib.contextmanager
def dra_identity(cp: ControlPlane) -> Iterator[Manifests]:
    """The chart's identity of ``vgpud dra`` (rendered with ``dra.enabled=true``) on
    ``cp``: its ServiceAccount, ClusterRole and binding, and the admission policies that
    hold its writes to its own node (``DRA_POLICIES``), in force when this yields the
    rendered chart; afterwards the policies are gone, and out of admission too (the probes'
    refusals are the harness's own: the audit check skips them)."""
    chart = render(("dra.enabled=true",))
    rbac = [d for d in chart.docs if d["kind"] in ("ServiceAccount", "ClusterRole",
                                                   "ClusterRoleBinding")
            and d["metadata"]["name"] == DRA_ACCOUNT]
    policies = [d for d in chart.docs if d["kind"] in POLICY_KINDS
                and d["metadata"]["name"] in DRA_POLICIES]
    assert len(rbac) == 3 and len(policies) == 2 * len(DRA_POLICIES), "dra.enabled renders them"
    probe = f"dra-identity-probe-{free_port()}"  # a Node no test selects
    _, start = cp.audit()
    cp.add_node(probe)
    try:
        for d in rbac + policies:
            cp.admin.apply(d, manager="helm")
        wait_for("the DRA scope policies to take effect",
                 lambda: _dra_policies_enforced(cp, probe) == (True, True), timeout=30)
        cp.audit_forget(start)
        yield chart
    finally:
        _, start = cp.audit()
        for d in reversed(policies):
            cp.admin.delete(d["kind"], d["metadata"]["name"])
        wait_for("the DRA scope policies to leave admission",
                 lambda: _dra_policies_enforced(cp, probe) == (False, False), timeout=30)
        cp.admin.delete("Node", probe)
        cp.audit_forget(start)
