"""The committed manifests (manifests/vgpud.yaml, manifests/kube-scheduler-config.yaml)
against the code they deploy. Pure Python: no helm, no cluster."""

from __future__ import annotations

import json
import posixpath
import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from tests.deploy.rendered import (
    CHART,
    GO_DURATION,
    MANIFEST,
    MIG_PROFILES,
    SCHEDULER_CONFIG,
    Manifests,
    Rule,
    api_needs,
    check_match_condition,
    cli_params,
    flag,
    helm_define,
    match_condition,
    port_of,
    seconds,
    selector_matches,
)
from vgpud.config import (
    PluginSettings,
    SchedulerGates,
    SchedulerSettings,
    Settings,
    parse_settings,
)
from vgpud.core.allocate import Allocator
from vgpud.core.requests import PRESETS
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.server import make_app
from vgpud.node.metrics import metrics_app
from vgpud.node.shim import IMAGE_LIB_DIR
from vgpud.plugin import command as plugin_command
from vgpud.plugin.service import RESOURCE
from vgpud.scheduling.state import SchedulerState

M = Manifests.committed()
NAMESPACE = "kube-system"
WORKLOADS = [("Deployment", "vgpud-scheduler"), ("DaemonSet", "vgpud-plugin"),
             ("Deployment", "vgpud-webhook")]

# -- RBAC: exactly these grants, nothing more -----------------------------------------------

EXPECTED_RULES: dict[tuple[str, str], dict[Rule, set[str]]] = {
    ("ClusterRole", "vgpud-scheduler"): {
        ("", "nodes", ()): {"list", "watch"},
        # delete: the Reschedule gate (on by default); create only with rescheduleBarePods
        ("", "pods", ()): {"get", "list", "watch", "delete"},
        ("", "pods/binding", ()): {"create"},
        ("", "events", ()): {"create", "patch"},
        ("policy", "poddisruptionbudgets", ()): {"list", "watch"},  # preemption
        ("", "resourcequotas", ()): {"list", "watch"},  # the vGPU quota
    },
    ("Role", "vgpud-scheduler-leases"): {
        ("coordination.k8s.io", "leases", ()): {"create"},
        ("coordination.k8s.io", "leases", ("vgpu-scheduler",)): {"get", "update"},
    },
    ("ClusterRole", "vgpud-plugin"): {
        ("", "nodes", ()): {"get", "patch"},
        # watch: the node's pods (vgpud/node/pods.py); list when a streaming list is refused
        ("", "pods", ()): {"get", "list", "watch", "patch"},
        ("", "events", ()): {"create", "patch"},
    },
    # bootstrap mode (the default): its own two configurations by name, its Secret
    ("ClusterRole", "vgpud-webhook"): {
        ("", "nodes", ()): {"list", "watch"},
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("vgpud-webhook",)):
            {"get", "patch"},
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations",
         ("vgpud-webhook",)): {"get", "patch"},
    },
    ("Role", "vgpud-webhook"): {
        ("", "secrets", ()): {"create"},  # create cannot be limited by name
        ("", "secrets", ("vgpud-webhook-tls",)): {"get", "update"},
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
    ("ClusterRoleBinding", "vgpud-webhook"):
        (None, "ClusterRole", "vgpud-webhook", "vgpud-webhook"),
    ("RoleBinding", "vgpud-webhook"):
        (NAMESPACE, "Role", "vgpud-webhook", "vgpud-webhook"),
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
    needs = api_needs("extender", "scheduling")  # the scheduler service runs in the extender
    granted = _granted(("ClusterRole", "vgpud-scheduler"), ("Role", "vgpud-scheduler-leases"))
    # pods are created only to recreate bare pods, behind rescheduleBarePods (off here).
    sched = settings().scheduler
    assert sched.featureGates.Reschedule and not sched.rescheduleBarePods
    assert ("pods", "create") in needs
    # the DRA nodes' slices and claims are watched only with dra.enabled (off here; the
    # grant with it on: tests/deploy/test_render.py)
    dra = {(r, v) for r in ("resourceslices", "resourceclaims") for v in ("list", "watch")}
    assert dra <= needs and not settings().dra.enabled
    assert needs - {("pods", "create")} - dra == granted


def test_plugin_rbac_is_what_its_code_calls() -> None:
    needs = api_needs("plugin", "node")  # the node package runs in the plugin
    granted = _granted(("ClusterRole", "vgpud-plugin"))
    # nodes/status is written only behind the CorePlugin/MemoryPlugin gates (off here).
    gates = settings().plugin.featureGates
    assert not (gates.CorePlugin or gates.MemoryPlugin)
    assert ("nodes/status", "patch") in needs
    assert needs - {("nodes/status", "patch")} == granted


def test_webhook_rbac_is_what_its_code_calls() -> None:
    # The default render is bootstrap mode, where the webhook makes every call it can.
    needs = api_needs("webhook")
    granted = _granted(("ClusterRole", "vgpud-webhook"), ("Role", "vgpud-webhook"))
    # claim templates are made only for pods translated for DRA nodes (dra.translate, off
    # here; tests/deploy/test_render.py renders it on)
    dra = {("resourceclaimtemplates", "get"), ("resourceclaimtemplates", "create")}
    assert dra <= needs
    assert needs - dra == granted


def test_webhook_rbac_names_the_objects_its_flags_name() -> None:
    args = M.container("Deployment", "webhook")["args"]
    config = flag(args, "webhook-configuration")
    secret = flag(args, "bootstrap-secret")
    assert config and secret
    configurations = M.of_kind("MutatingWebhookConfiguration") + M.of_kind(
        "ValidatingWebhookConfiguration")
    assert len(configurations) == 2
    assert {d["metadata"]["name"] for d in configurations} == {config}
    for group, resource, names in M.rules("ClusterRole", "vgpud-webhook"):
        if group == "admissionregistration.k8s.io":
            assert names == (config,), resource
    role = M.one("Role", "vgpud-webhook")
    assert role["metadata"]["namespace"] == M.one("Deployment", "vgpud-webhook")["metadata"][
        "namespace"], "the Secret's Role must be in the namespace the webhook runs in"
    named = {names for (_, res, names) in M.rules("Role", "vgpud-webhook") if names}
    assert named == {(secret,)}
    # No list/watch of Secrets: nothing reads them in bulk.
    assert not {"list", "watch"} & {v for vs in M.rules("Role", "vgpud-webhook").values()
                                    for v in vs}


def test_workloads_run_as_their_service_accounts() -> None:
    for kind, name in WORKLOADS:
        assert M.pod_spec(kind, name)["serviceAccountName"] == name


# -- names that must never appear --------------------------------------------------------

def _outside_the_preset_table(path: Path, text: str) -> str:
    if path.name == "_helpers.tpl":  # the preset table names HAMi's resources: only there
        text = text.replace(helm_define(text, "vgpud.presets"), "")
    return text


def test_nvidia_com_gpu_appears_nowhere() -> None:
    # The default render, and the chart outside its preset table: only resourcePreset=hami
    # (or compatPresets with hami) names NVIDIA's resource.
    texts = {MANIFEST: MANIFEST.read_text(), SCHEDULER_CONFIG: SCHEDULER_CONFIG.read_text()}
    texts |= {p: _outside_the_preset_table(p, p.read_text())
              for p in CHART.rglob("*") if p.is_file()}
    for path, text in texts.items():
        assert "nvidia.com/gpu" not in text, path


# -- the resource presets ------------------------------------------------------------------

def chart_presets() -> dict[str, dict[str, str]]:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    table: dict[str, dict[str, str]] = yaml.safe_load(helm_define(text, "vgpud.presets"))
    return table


def test_chart_preset_table_is_the_codes() -> None:
    fields = {"number": "number", "memory": "memory", "cores": "cores",
              "memoryPercent": "memory_percent", "priority": "priority", "mig": "mig"}
    code = {name: {k: getattr(p, attr) for k, attr in fields.items()
                   if getattr(p, attr) is not None} for name, p in PRESETS.items()}
    assert chart_presets() == code


# -- the settings ConfigMap ---------------------------------------------------------------

def settings() -> Settings:
    return parse_settings(yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml")))


def test_settings_file_is_valid_and_lists_every_key() -> None:
    doc = yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml"))
    assert set(doc) == set(Settings.model_fields)
    assert set(doc["plugin"]) == set(PluginSettings.model_fields)
    assert set(doc["scheduler"]) == set(SchedulerSettings.model_fields)
    assert set(doc["scheduler"]["featureGates"]) == set(SchedulerGates.model_fields)
    parse_settings(doc)


def test_chart_values_config_is_what_was_rendered() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert parse_settings(values["config"]) == settings()


@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_every_role_reads_the_settings_file(kind: str, name: str) -> None:
    container = M.pod_spec(kind, name)["containers"][-1]
    path = flag(container["args"], "config")
    assert path is not None
    directory, key = posixpath.split(path)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in M.pod_spec(kind, name)["volumes"]}
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
    volumes = {v["name"]: v for v in M.pod_spec("Deployment", "vgpud-scheduler")["volumes"]}
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
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
        assert ("POST", "/" + ext[verb]) in routes, verb
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
        # the MIG profiles, which the plugin advertises with migStrategy mixed
        **{f"{preset.mig}{p}": False for p in MIG_PROFILES},
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


def test_one_extender_runs_without_its_own_election() -> None:
    # One replica by default: nothing to elect (with more, the chart turns it on).
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
    labels = M.workload("Deployment", "vgpud-scheduler")["spec"]["template"]["metadata"][
        "labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    others = M.workload("Deployment", "vgpud-webhook")["spec"]["template"]["metadata"]["labels"]
    assert not svc["spec"]["selector"].items() <= others.items()


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
                                                 ("DaemonSet", "plugin"),
                                                 ("Deployment", "webhook")])
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
    # KILL alone: the watchdog's hard limit (overLimitAction: kill, the default)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert sc["runAsUser"] == 0


@pytest.mark.parametrize("name", ["vgpud-scheduler", "vgpud-webhook"])
def test_deployments_run_as_non_root(name: str) -> None:
    spec = M.pod_spec("Deployment", name)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "runAsUser" not in sc


def test_every_container_has_requests_and_a_tagged_image() -> None:
    for kind, name in WORKLOADS:
        for c in M.pod_spec(kind, name)["containers"]:
            assert c["resources"]["requests"]["memory"]
            assert re.fullmatch(r"[^:@]+(:[\w.-]+|@sha256:[0-9a-f]{64})", c["image"]), c["image"]


def test_everything_namespaced_is_in_the_release_namespace() -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                      "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}
    for d in M.docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] in cluster_scoped:
            assert ns is None
        else:
            assert ns == NAMESPACE, (d["kind"], d["metadata"]["name"])


# -- the admission webhook ----------------------------------------------------------------

def webhook_configurations() -> dict[str, dict[str, Any]]:
    """{"/mutate": the mutating webhook entry, "/validate": the validating one}."""
    out = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = M.of_kind(kind)
        (hook,) = cfg["webhooks"]
        out[hook["clientConfig"]["service"]["path"]] = hook
    return out


def test_webhook_configurations_call_the_service_at_its_paths() -> None:
    hooks = webhook_configurations()
    assert set(hooks) == {"/mutate", "/validate"}
    svc = M.one("Service", "vgpud-webhook")
    ports = {p["port"]: p for p in svc["spec"]["ports"]}
    for hook in hooks.values():
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == ("vgpud-webhook", NAMESPACE)
        assert ports[ref["port"]]["targetPort"] == "https"
        assert "url" not in hook["clientConfig"]
        assert "caBundle" not in hook["clientConfig"]  # bootstrap mode: the webhook patches it
    # the webhook serves HTTPS on the port the Service targets
    c = M.container("Deployment", "webhook")
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    listen = flag(c["args"], "listen")
    assert listen is not None and named["https"] == port_of(listen)
    # and its certificate is for the Service's names (bootstrap: --service-name)
    assert flag(c["args"], "service-name") == svc["metadata"]["name"]


def _webhook_app_routes() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(routes of the HTTPS app, routes of the plain-HTTP ops app), as `vgpud webhook`
    builds them with --metrics-listen."""
    from vgpud.webhook.server import Metrics as WebhookMetrics
    from vgpud.webhook.server import make_app as make_webhook_app

    def routes(**parts: bool) -> set[tuple[str, str]]:
        # routes only: no review is answered, so no policy or catalogue is needed
        app = make_webhook_app(cast(Any, None), cast(Any, None), WebhookMetrics(),
                               lambda: True, **parts)
        return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}

    return routes(reviews=True, ops=False), routes(reviews=False, ops=True)


def test_webhook_serves_the_rendered_paths() -> None:
    https, ops = _webhook_app_routes()
    assert {("POST", path) for path in webhook_configurations()} <= https
    c = M.container("Deployment", "webhook")
    assert flag(c["args"], "metrics-listen") is not None  # so the probes are on the ops app
    for path, _port in _probe_paths(c).values():
        assert ("GET", path) in ops
    assert ("GET", "/metrics") in ops


def test_webhook_service_targets_the_deployment() -> None:
    svc = M.one("Service", "vgpud-webhook")
    dep = M.workload("Deployment", "vgpud-webhook")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    c = M.container("Deployment", "webhook")
    names = {p["name"] for p in c["ports"]}
    for port in svc["spec"]["ports"]:
        assert port["targetPort"] in names
    https = [p for p in svc["spec"]["ports"] if p["targetPort"] == "https"]
    assert [p["port"] for p in https] == [443]


def test_webhook_probes_hit_the_metrics_port() -> None:
    c = M.container("Deployment", "webhook")
    probes = _probe_paths(c)
    assert probes == {"readinessProbe": ("/readyz", "metrics"),
                      "livenessProbe": ("/healthz", "metrics")}
    ops = flag(c["args"], "metrics-listen")
    assert ops is not None
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == port_of(ops)
    assert port_of(ops) != port_of(flag(c["args"], "listen") or "")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"


def test_webhook_writes_its_bootstrap_certificate_into_an_emptydir() -> None:
    c = M.container("Deployment", "webhook")
    volumes = {v["name"]: v for v in M.pod_spec("Deployment", "vgpud-webhook")["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for name in ("tls-cert", "tls-key"):
        path = flag(c["args"], name)
        assert path is not None
        mount = mounts[posixpath.dirname(path)]
        assert "emptyDir" in volumes[mount["name"]]
        assert not mount.get("readOnly")
    # The Secret's namespace is the pod's own (the Role's namespace).
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert flag(c["args"], "namespace") is None


def test_webhook_takes_its_namespace_from_the_downward_api(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)  # what the fieldRef above gives it
    params = cli_params(M.container("Deployment", "webhook")["args"])
    assert params["namespace"] == NAMESPACE
    assert params["bootstrap_secret"] == "vgpud-webhook-tls"
    assert params["service_name"] == "vgpud-webhook"
    assert params["webhook_configuration"] == "vgpud-webhook"


def test_webhook_has_two_replicas_a_budget_and_spread() -> None:
    dep = M.workload("Deployment", "vgpud-webhook")
    assert dep["spec"]["replicas"] == 2
    pdb = M.one("PodDisruptionBudget", "vgpud-webhook")
    assert pdb["spec"]["maxUnavailable"] == 1
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()


def test_webhook_admission_contract() -> None:
    hooks = webhook_configurations()
    for hook in hooks.values():
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == "Fail"
        assert 1 <= hook["timeoutSeconds"] <= 30
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                  "operations": ["CREATE"], "resources": ["pods"],
                                  "scope": "Namespaced"}]
        assert hook["name"].count(".") >= 2  # a fully qualified name
    assert hooks["/mutate"]["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in hooks["/validate"]


def _namespace(name: str, **labels: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **labels}  # the API server sets the first


def test_webhook_spares_system_and_opted_out_namespaces_but_no_pod_spares_itself() -> None:
    """Issue 22, finding 18: a pod labelled vgpud.io/webhook=disabled skipped the checks
    that keep a GPU container from lifting its limits; opting out is by namespace only."""
    for hook in webhook_configurations().values():
        ns = hook["namespaceSelector"]
        assert selector_matches(ns, _namespace("ml-team"))
        assert selector_matches(ns, _namespace("ml-team", **{"vgpud.io/webhook": "enabled"}))
        assert not selector_matches(ns, _namespace("kube-system"))
        assert not selector_matches(ns, _namespace(NAMESPACE))  # the release namespace
        assert not selector_matches(ns, _namespace("ml-team", **{"vgpud.io/webhook": "disabled"}))
        obj = hook.get("objectSelector", {})
        assert selector_matches(obj, {"app": "train", "vgpud.io/webhook": "disabled"})


def test_webhook_sees_only_gpu_pods() -> None:
    pytest.importorskip("celpy", reason="cel-python (the `test` extra) is not installed")
    for hook in webhook_configurations().values():
        check_match_condition(match_condition(hook), settings().resourcePreset,
                              settings().compatPresets)


def test_webhook_match_condition_text_names_the_enabled_presets() -> None:
    # Without a CEL library, at least: every enabled GPU name is in the expression, no
    # other (a priority alone does not make a GPU pod: is_gpu_pod).
    names = [n for p in [PRESETS[settings().resourcePreset]]
             for n in (p.number, p.memory, p.cores, p.memory_percent, p.mig) if n]
    every = {getattr(p, f) for p in PRESETS.values()
             for f in ("number", "memory", "cores", "memory_percent", "priority")} - {None}
    for hook in webhook_configurations().values():
        text = match_condition(hook)
        quoted = set(re.findall(r'"([^"]+)"', text))
        assert quoted == set(names), quoted
        assert not (every - set(names)) & quoted
        for part in ("object.spec.containers", "object.spec.initContainers",
                     "c.resources.limits", "c.resources.requests"):
            assert part in text


# -- monitoring -----------------------------------------------------------------------------

def test_every_dashboard_ships_in_a_configmap_grafanas_sidecar_loads() -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(files) >= 4
    maps = [d for d in M.of_kind("ConfigMap") if any(k.endswith(".json") for k in d["data"])]
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key,) = cm["data"]
        shipped[key] = cm["data"][key]
    assert shipped == {f.name: f.read_text() for f in files}
    uids = [json.loads(text)["uid"] for text in shipped.values()]
    assert len(set(uids)) == len(uids)


def test_objects_that_need_the_operators_crds_are_off_by_default() -> None:
    # A cluster without the Prometheus Operator must still install the default render.
    assert not [d for d in M.docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
