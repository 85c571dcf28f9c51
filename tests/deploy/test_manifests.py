"""The committed manifests (manifests/vgpud.yaml, manifests/kube-scheduler-config.yaml)
against the code they deploy. Pure Python: no helm, no cluster."""

from __future__ import annotations

import posixpath
import re
import time
from typing import Any

import pytest
import yaml

from tests.deploy.rendered import (
    CHART,
    GO_DURATION,
    MANIFEST,
    SCHEDULER_CONFIG,
    Manifests,
    Rule,
    api_needs,
    cli_params,
    flag,
    port_of,
    seconds,
)
from vgpud.config import PluginSettings, Settings, parse_settings
from vgpud.core.allocate import Allocator
from vgpud.core.requests import PRESETS
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.extender.state import SchedulerState
from vgpud.plugin import command as plugin_command
from vgpud.plugin.metrics import metrics_app
from vgpud.plugin.service import RESOURCE
from vgpud.plugin.shim import IMAGE_LIB_DIR

M = Manifests.committed()
NAMESPACE = "kube-system"

# -- RBAC: exactly these grants, nothing more -----------------------------------------------

EXPECTED_RULES: dict[tuple[str, str], dict[Rule, set[str]]] = {
    ("ClusterRole", "vgpud-scheduler"): {
        ("", "nodes", ()): {"list", "watch"},
        ("", "pods", ()): {"get", "list", "watch", "patch"},
        ("", "pods/binding", ()): {"create"},
        ("", "events", ()): {"create", "patch"},
    },
    ("Role", "vgpud-scheduler-leases"): {
        ("coordination.k8s.io", "leases", ()): {"create"},
        ("coordination.k8s.io", "leases", ("vgpu-scheduler",)): {"get", "update"},
    },
    ("ClusterRole", "vgpud-plugin"): {
        ("", "nodes", ()): {"get", "patch"},
        ("", "pods", ()): {"get", "list", "patch"},
        ("", "events", ()): {"create", "patch"},
    },
}

# binding -> (namespace or None, role kind, role name, service account)
EXPECTED_BINDINGS = {
    ("ClusterRoleBinding", "vgpud-scheduler"):
        (None, "ClusterRole", "vgpud-scheduler", "vgpud-scheduler"),
    ("ClusterRoleBinding", "vgpud-scheduler-as-kube-scheduler"):
        (None, "ClusterRole", "system:kube-scheduler", "vgpud-scheduler"),
    ("ClusterRoleBinding", "vgpud-scheduler-as-volume-scheduler"):
        (None, "ClusterRole", "system:volume-scheduler", "vgpud-scheduler"),
    ("RoleBinding", "vgpud-scheduler-auth-reader"):
        ("kube-system", "Role", "extension-apiserver-authentication-reader", "vgpud-scheduler"),
    ("RoleBinding", "vgpud-scheduler-leases"):
        (NAMESPACE, "Role", "vgpud-scheduler-leases", "vgpud-scheduler"),
    ("ClusterRoleBinding", "vgpud-plugin"):
        (None, "ClusterRole", "vgpud-plugin", "vgpud-plugin"),
}


def test_roles_grant_exactly_the_table() -> None:
    roles = {(d["kind"], d["metadata"]["name"]) for d in M.docs
             if d["kind"] in ("Role", "ClusterRole")}
    assert roles == set(EXPECTED_RULES)
    for (kind, name), expected in EXPECTED_RULES.items():
        assert M.rules(kind, name) == expected, f"{kind} {name}"


def test_bindings_tie_each_role_to_its_service_account() -> None:
    found = {(d["kind"], d["metadata"]["name"]): d for d in M.docs
             if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert set(found) == set(EXPECTED_BINDINGS)
    accounts = {d["metadata"]["name"] for d in M.of_kind("ServiceAccount")}
    for key, (ns, role_kind, role, sa) in EXPECTED_BINDINGS.items():
        b = found[key]
        assert b["metadata"].get("namespace") == ns, key
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) == (role_kind, role), key
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
        assert sa in accounts


def test_no_wildcards_anywhere_in_rbac() -> None:
    for d in M.of_kind("Role") + M.of_kind("ClusterRole"):
        for r in d["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in (r.get(field) or []), (d["metadata"]["name"], field)
            assert "nonResourceURLs" not in r


def _granted(*roles: tuple[str, str]) -> set[tuple[str, str]]:
    out = set()
    for kind, name in roles:
        for (_, resource, _), verbs in M.rules(kind, name).items():
            out |= {(resource, v) for v in verbs}
    return out


def test_scheduler_rbac_is_what_its_code_calls() -> None:
    needs = api_needs("extender")
    granted = _granted(("ClusterRole", "vgpud-scheduler"), ("Role", "vgpud-scheduler-leases"))
    assert needs == granted


def test_plugin_rbac_is_what_its_code_calls() -> None:
    needs = api_needs("plugin")
    granted = _granted(("ClusterRole", "vgpud-plugin"))
    # nodes/status is written only behind the CorePlugin/MemoryPlugin gates (off here).
    gates = settings().plugin.featureGates
    assert not (gates.CorePlugin or gates.MemoryPlugin)
    assert ("nodes/status", "patch") in needs
    assert needs - {("nodes/status", "patch")} == granted


def test_workloads_run_as_their_service_accounts() -> None:
    assert M.pod_spec("Deployment")["serviceAccountName"] == "vgpud-scheduler"
    assert M.pod_spec("DaemonSet")["serviceAccountName"] == "vgpud-plugin"


# -- names that must never appear --------------------------------------------------------

def test_nvidia_com_gpu_appears_nowhere() -> None:
    texts = {MANIFEST: MANIFEST.read_text(), SCHEDULER_CONFIG: SCHEDULER_CONFIG.read_text()}
    texts |= {p: p.read_text() for p in CHART.rglob("*") if p.is_file()}
    for path, text in texts.items():
        assert "nvidia.com/gpu" not in text, path


# -- the settings ConfigMap ---------------------------------------------------------------

def settings() -> Settings:
    return parse_settings(yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml")))


def test_settings_file_is_valid_and_lists_every_key() -> None:
    doc = yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml"))
    assert set(doc) == set(Settings.model_fields)
    assert set(doc["plugin"]) == set(PluginSettings.model_fields)
    parse_settings(doc)


def test_chart_values_config_is_what_was_rendered() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert parse_settings(values["config"]) == settings()


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_both_roles_read_the_settings_file(kind: str) -> None:
    container = M.pod_spec(kind)["containers"][-1]
    path = flag(container["args"], "config")
    assert path is not None
    directory, key = posixpath.split(path)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in M.pod_spec(kind)["volumes"]}
    cm = volumes[mounts[directory]]["configMap"]["name"]
    assert cm == "vgpud-settings"
    assert key in M.one("ConfigMap", cm)["data"]


# -- the kube-scheduler configuration -----------------------------------------------------

# The fields of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1/types.go
# and component-base's LeaderElectionConfiguration). kube-scheduler decodes strictly: any
# other key stops it.
V1_FIELDS = {
    "KubeSchedulerConfiguration": {
        "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
        "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
        "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
        "delayCacheUntilActive"},
    "leaderElection": {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod",
                       "resourceLock", "resourceName", "resourceNamespace"},
    "profile": {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"},
    "extender": {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight",
                 "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                 "managedResources", "ignorable"},
    "managedResource": {"name", "ignoredByScheduler"},
}
EXTENDED_RESOURCE = re.compile(r"^(?!requests\.)([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/[-A-Za-z0-9_.]+$")


def sched() -> dict[str, Any]:
    cfg = M.scheduler_config()
    assert cfg == yaml.safe_load(SCHEDULER_CONFIG.read_text()), \
        "manifests/kube-scheduler-config.yaml differs from the chart's: run manifests/render.py"
    return cfg


def test_scheduler_config_has_the_v1_shape() -> None:
    cfg = sched()
    assert (cfg["apiVersion"], cfg["kind"]) == (
        "kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert set(cfg) <= V1_FIELDS["KubeSchedulerConfiguration"]
    assert set(cfg["leaderElection"]) <= V1_FIELDS["leaderElection"]
    for p in cfg["profiles"]:
        assert set(p) <= V1_FIELDS["profile"]
    binders = [e for e in cfg["extenders"] if e.get("bindVerb")]
    assert len(binders) <= 1, "kube-scheduler allows only one binding extender"
    for e in cfg["extenders"]:
        assert set(e) <= V1_FIELDS["extender"]
        if e.get("prioritizeVerb"):
            assert isinstance(e["weight"], int) and e["weight"] > 0
        assert GO_DURATION.match(e["httpTimeout"])
        names = [r["name"] for r in e["managedResources"]]
        assert len(names) == len(set(names))
        for r in e["managedResources"]:
            assert set(r) <= V1_FIELDS["managedResource"]
            assert EXTENDED_RESOURCE.match(r["name"]), r["name"]
            assert "kubernetes.io/" not in r["name"]
            assert isinstance(r["ignoredByScheduler"], bool)


def test_unschedulable_timeout_is_a_flag_not_a_config_field() -> None:
    assert "podMaxInUnschedulablePodsDuration" not in sched()
    ks = M.container("Deployment", "kube-scheduler")
    value = flag(ks["command"], "pod-max-in-unschedulable-pods-duration")
    assert value is not None
    assert 0 < seconds(value) < 300  # below kube-scheduler's 5 min default (kubernetes#122019)


def test_scheduler_profile_is_the_settings_scheduler_name() -> None:
    cfg = sched()
    assert [p["schedulerName"] for p in cfg["profiles"]] == [settings().schedulerName]
    assert settings().schedulerName == Settings().schedulerName == "vgpu-scheduler"


def test_kube_scheduler_reads_this_config() -> None:
    ks = M.container("Deployment", "kube-scheduler")
    path = flag(ks["command"], "config")
    assert path is not None
    directory, key = posixpath.split(path)
    mounts = {m["mountPath"]: m["name"] for m in ks["volumeMounts"]}
    volumes = {v["name"]: v for v in M.pod_spec("Deployment")["volumes"]}
    cm = volumes[mounts[directory]]["configMap"]["name"]
    assert yaml.safe_load(M.configmap_file(cm, key)) == sched()


def _extender_app_routes() -> set[tuple[str, str]]:
    alloc = Allocator(Settings().defaults(), clock=time.monotonic)
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc))
    app = make_app(ext, ready=lambda: True)
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}


def test_extender_urls_are_the_extender_servers_routes() -> None:
    (ext,) = sched()["extenders"]
    routes = _extender_app_routes()
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", ext["urlPrefix"])
    assert m, "kube-scheduler must reach the extender over loopback in its own pod"
    assert ext["enableHTTPS"] is False
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert ("POST", "/" + ext[verb]) in routes, verb
    assert "preemptVerb" not in ext  # no /preempt route yet
    sidecar = M.container("Deployment", "extender")
    listen = flag(sidecar["args"], "listen")
    assert listen is not None and port_of(listen) == int(m.group(1))
    # the verbs listen on loopback only: nothing else in the cluster can call /bind
    assert listen.startswith("127.0.0.1:")
    assert int(m.group(1)) not in [p["containerPort"] for p in sidecar["ports"]]
    ops = flag(sidecar["args"], "metrics-listen")
    assert ops is not None and {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {
        "metrics": port_of(ops)}


def test_extender_contract_flags() -> None:
    (ext,) = sched()["extenders"]
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert 10 <= seconds(ext["httpTimeout"]) <= 60


def test_managed_resources_are_the_codes_resource_names() -> None:
    (ext,) = sched()["extenders"]
    got = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    preset = PRESETS["vgpu-manager"]
    gates = settings().plugin.featureGates
    assert preset.name == settings().resourcePreset
    assert preset.number == RESOURCE  # the one the device plugin advertises
    assert got == {
        preset.number: False,
        preset.memory: not gates.MemoryPlugin,
        preset.cores: not gates.CorePlugin,
        preset.memory_percent: True,
    }


def test_leader_election_has_its_own_lease_in_the_granted_namespace() -> None:
    le = sched()["leaderElection"]
    assert le["leaderElect"] is True
    assert le["resourceLock"] == "leases"
    assert le["resourceName"] != "kube-scheduler"  # the main scheduler's Lease
    role = M.one("Role", "vgpud-scheduler-leases")
    assert le["resourceNamespace"] == role["metadata"]["namespace"]
    rules = M.rules("Role", "vgpud-scheduler-leases")
    assert rules[("coordination.k8s.io", "leases", (le["resourceName"],))] == {"get", "update"}
    assert seconds(le["leaseDuration"]) > seconds(le["renewDeadline"]) > seconds(
        le["retryPeriod"])


def test_extender_runs_without_its_own_election_beside_kube_schedulers() -> None:
    # Two independent Leases could pick different pods; kube-scheduler's one decides.
    args = M.container("Deployment", "extender")["args"]
    assert "--leader-elect" not in args
    assert args[0] == "scheduler"


# -- probes and ports -------------------------------------------------------------------

def _probe_paths(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {k: (v["httpGet"]["path"], v["httpGet"]["port"]) for k, v in container.items()
            if k.endswith("Probe")}


def test_extender_probes_hit_its_health_routes() -> None:
    c = M.container("Deployment", "extender")
    routes = _extender_app_routes()
    probes = _probe_paths(c)
    assert probes["readinessProbe"][0] == "/readyz"
    assert probes["livenessProbe"][0] == "/healthz"
    names = {p["name"] for p in c["ports"]}
    for path, port in probes.values():
        assert ("GET", path) in routes
        assert port in names
    assert ("GET", "/metrics") in routes


def test_scheduler_service_targets_the_extender_port() -> None:
    svc = M.one("Service", "vgpud-scheduler")
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    labels = M.workload("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


def test_plugin_metrics_port_and_probe_match_its_settings() -> None:
    c = M.container("DaemonSet", "plugin")
    port = port_of(PluginSettings().metricsListen)
    assert port_of(settings().plugin.metricsListen) == port
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": port}
    app_paths = {r.resource.canonical for r in metrics_app(_empty_registry()).router.routes()
                 if r.resource}
    assert _probe_paths(c)["livenessProbe"] == ("/healthz", "metrics")
    assert {"/healthz", "/metrics"} <= app_paths
    svc = M.one("Service", "vgpud-plugin")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["port"] == port


def _empty_registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry(auto_describe=False)


# -- the plugin's host paths --------------------------------------------------------------

def _host_mounts(kind: str, container: str) -> dict[str, str]:
    """container mountPath -> host path, for hostPath volumes."""
    volumes = {v["name"]: v["hostPath"]["path"] for v in M.pod_spec(kind)["volumes"]
               if "hostPath" in v}
    return {m["mountPath"]: volumes[m["name"]]
            for m in M.container(kind, container)["volumeMounts"] if m["name"] in volumes}


def test_plugin_mounts_the_paths_its_defaults_use_at_the_same_place() -> None:
    mounts = _host_mounts("DaemonSet", "plugin")
    wanted = {
        plugin_command.DEFAULT_DIR,
        posixpath.dirname(plugin_command.DEFAULT_PODRES),
        plugin_command.DEFAULT_STATE,
        PluginSettings().shimHostDir,
    }
    assert set(mounts) == wanted
    # The plugin hands host paths under the state and shim dirs to kubelet: same inside.
    assert all(inside == host for inside, host in mounts.items())
    assert settings().plugin.shimHostDir == PluginSettings().shimHostDir


def test_plugin_flags_are_its_defaults() -> None:
    args = M.container("DaemonSet", "plugin")["args"]
    assert args[0] == "plugin"
    assert flag(args, "device-plugin-dir") == plugin_command.DEFAULT_DIR
    assert flag(args, "pod-resources-socket") == plugin_command.DEFAULT_PODRES
    assert flag(args, "state-dir") == plugin_command.DEFAULT_STATE


@pytest.mark.parametrize(("kind", "container"), [("Deployment", "extender"),
                                                 ("DaemonSet", "plugin")])
def test_vgpud_cli_accepts_the_rendered_args(kind: str, container: str) -> None:
    args = M.container(kind, container)["args"]
    params = cli_params(args)
    assert str(params["config"]) == flag(args, "config")
    with pytest.raises(Exception, match="No such option"):
        cli_params([*args, "--no-such-flag"])


def test_plugin_gets_its_node_name_from_the_downward_api() -> None:
    env = {e["name"]: e for e in M.container("DaemonSet", "plugin")["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_image_shim_dir_is_not_hidden_by_a_host_mount() -> None:
    for inside in _host_mounts("DaemonSet", "plugin"):
        assert not str(IMAGE_LIB_DIR).startswith(inside.rstrip("/") + "/")
        assert str(IMAGE_LIB_DIR) != inside


# -- security context --------------------------------------------------------------------

def test_plugin_is_root_but_not_privileged() -> None:
    spec = M.pod_spec("DaemonSet")
    # host PIDs: SO_PEERCRED of a registering GPU process, NVML's process list, cgroups
    assert spec["hostPID"] is True
    for host in ("hostNetwork", "hostIPC"):
        assert not spec.get(host)
    sc = M.container("DaemonSet", "plugin")["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsUser"] == 0


def test_scheduler_runs_as_non_root() -> None:
    spec = M.pod_spec("Deployment")
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "runAsUser" not in sc


def test_every_container_has_requests_and_a_tagged_image() -> None:
    for kind in ("Deployment", "DaemonSet"):
        for c in M.pod_spec(kind)["containers"]:
            assert c["resources"]["requests"]["memory"]
            assert re.fullmatch(r"[^:@]+(:[\w.-]+|@sha256:[0-9a-f]{64})", c["image"]), c["image"]


def test_everything_namespaced_is_in_the_release_namespace() -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for d in M.docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] in cluster_scoped:
            assert ns is None
        else:
            assert ns == NAMESPACE, (d["kind"], d["metadata"]["name"])
