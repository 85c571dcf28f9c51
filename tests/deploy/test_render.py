"""The chart itself, rendered by helm: the committed manifests must not drift from it, and
its switches must change what they say. helm comes from PyPI (manifests/render.py), so
these tests need network on first use (then a cache); they skip with the reason otherwise."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.rendered import (
    MIG_PROFILES,
    ROOT,
    Manifests,
    api_needs,
    check_match_condition,
    check_network_policies,
    cli_params,
    flag,
    load_render,
    match_condition,
)
from vgpud.config import Settings, parse_settings
from vgpud.core.requests import PRESETS

render = load_render()


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        path: Path = render.obtain_helm()
    except render.HelmUnavailable as e:
        pytest.skip(f"helm is not available: {e}")
    return path


def template(helm: Path, *sets: str) -> Manifests:
    return Manifests.parse(render.render(helm, sets, lint=False))


def test_committed_manifests_match_the_chart(helm: Path) -> None:
    for path, text in render.outputs(helm).items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} drifted from helm/vgpud: run python manifests/render.py")


def test_check_mode_reports_drift(helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "vgpud.yaml"
    stale.write_text(render.OUT.read_text().replace("replicas: 1", "replicas: 3"))
    fresh = tmp_path / "kube-scheduler-config.yaml"
    fresh.write_text(render.SCHED_OUT.read_text())
    monkeypatch.setattr(render, "OUT", stale)
    monkeypatch.setattr(render, "SCHED_OUT", fresh)
    assert render.main(["--check", "--helm", str(helm)]) == 1
    out = capsys.readouterr().out
    assert "-  replicas: 3" in out and "+  replicas: 1" in out
    assert "kube-scheduler-config.yaml" not in out  # only the drifted file is reported
    assert stale.read_text().count("replicas: 3") == 1  # --check never writes


def test_feature_gates_grant_node_status_and_unignore_resources(helm: Path) -> None:
    m = template(helm, "config.plugin.featureGates.MemoryPlugin=true")
    rules = m.rules("ClusterRole", "vgpud-plugin")
    assert rules[("", "nodes/status", ())] == {"patch"}
    (ext,) = m.scheduler_config()["extenders"]
    ignored = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    assert ignored["nvidia.com/vgpu-memory"] is False
    assert ignored["nvidia.com/vgpu-cores"] is True
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.plugin.featureGates.MemoryPlugin is True


def test_reschedule_settings_grant_pod_delete_and_create_only_then(helm: Path) -> None:
    def pod_verbs(m: Manifests) -> set[str]:
        return m.rules("ClusterRole", "vgpud-scheduler")[("", "pods", ())]

    assert {"delete"} <= pod_verbs(template(helm)) and "create" not in pod_verbs(template(helm))
    bare = template(helm, "config.scheduler.rescheduleBarePods=true")
    assert {"delete", "create"} <= pod_verbs(bare)
    settings = parse_settings(yaml.safe_load(bare.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.scheduler.rescheduleBarePods is True
    off = template(helm, "config.scheduler.featureGates.Reschedule=false",
                   "config.scheduler.rescheduleBarePods=true")
    assert not {"delete", "create"} & pod_verbs(off)


def test_dra_translation_grants_claim_templates_and_side_effects_only_then(helm: Path) -> None:
    def webhook(m: Manifests) -> tuple[set[str], str, str]:
        templates = m.rules("ClusterRole", "vgpud-webhook").get(
            ("resource.k8s.io", "resourceclaimtemplates", ()), set())
        (mutating,) = m.of_kind("MutatingWebhookConfiguration")
        settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings",
                                                                  "vgpud.yaml")))
        return templates, mutating["webhooks"][0]["sideEffects"], settings.dra.translate

    assert webhook(template(helm)) == (set(), "None", "off")
    assert webhook(template(helm, "dra.enabled=true")) == (set(), "None", "off")
    assert webhook(template(helm, "dra.translate=always")) == (set(), "None", "off")  # no DRA
    on = template(helm, "dra.enabled=true", "dra.translate=selected",
                  "dra.deviceClasses.vgpu=share.example.com")
    assert webhook(on) == ({"get", "create"}, "NoneOnDryRun", "selected")
    settings = parse_settings(yaml.safe_load(on.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.dra.vgpuClass == "share.example.com"
    (validating,) = on.of_kind("ValidatingWebhookConfiguration")
    assert validating["webhooks"][0]["sideEffects"] == "None"


def test_kill_on_over_limit_is_the_default_and_grants_the_kill_capability_only_then(
        helm: Path) -> None:
    """Issue 22, finding 16: a hard limit kills by default; `warn` is the opt-out."""
    m = template(helm)
    sc = m.container("DaemonSet", "plugin")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.plugin.overLimitAction == "kill"
    warn = template(helm, "config.plugin.overLimitAction=warn")
    sc = warn.container("DaemonSet", "plugin")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("sets", [
    ("scheduler.replicas=2",),  # unset: on with several replicas
    ("scheduler.extender.leaderElect=true", "scheduler.replicas=2"),
])
def test_extender_election_adds_its_flag_and_its_lease(helm: Path, sets: tuple[str, ...]
                                                       ) -> None:
    m = template(helm, *sets)
    args = m.container("Deployment", "extender")["args"]
    params = cli_params(args)
    assert params["leader_elect"] is True
    assert params["lease_namespace"] == "kube-system"
    names = {n for (_, _, ns) in m.rules("Role", "vgpud-scheduler-leases") for n in ns}
    assert names == {"vgpu-scheduler", "vgpud-scheduler"}
    assert m.workload("Deployment", "vgpud-scheduler")["spec"]["replicas"] == 2
    assert "podAntiAffinity" in m.pod_spec("Deployment", "vgpud-scheduler")["affinity"]
    assert m.scheduler_config()["leaderElection"]["leaderElect"] is True


def test_one_replica_takes_the_extenders_lease_only_when_asked(helm: Path) -> None:
    for sets, elects in [((), False), (("scheduler.extender.leaderElect=true",), True),
                         (("scheduler.extender.leaderElect=false",), False)]:
        m = template(helm, *sets)
        assert ("--leader-elect" in m.container("Deployment", "extender")["args"]) is elects
        names = {n for (_, _, ns) in m.rules("Role", "vgpud-scheduler-leases") for n in ns}
        assert ("vgpud-scheduler" in names) is elects


def test_host_paths_and_scheduler_name_follow_the_values(helm: Path) -> None:
    m = template(helm, "plugin.hostPaths.devicePlugins=/var/lib/k0s/kubelet/device-plugins",
                 "plugin.hostPaths.podResources=/var/lib/k0s/kubelet/pod-resources",
                 "config.plugin.shimHostDir=/opt/vgpud", "config.schedulerName=gpu-share")
    args = m.container("DaemonSet", "plugin")["args"]
    cli_params(args)
    assert flag(args, "device-plugin-dir") == "/var/lib/k0s/kubelet/device-plugins"
    assert flag(args, "pod-resources-socket") == "/var/lib/k0s/kubelet/pod-resources/kubelet.sock"
    mounts = {m_["mountPath"] for m_ in m.container("DaemonSet", "plugin")["volumeMounts"]}
    assert {"/opt/vgpud", "/var/lib/k0s/kubelet/device-plugins"} <= mounts
    cfg = m.scheduler_config()
    assert cfg["profiles"] == [{"schedulerName": "gpu-share"}]
    assert cfg["leaderElection"]["resourceName"] == "gpu-share"


def test_kube_scheduler_image_defaults_to_the_cluster_version(helm: Path) -> None:
    image = template(helm).container("Deployment", "kube-scheduler")["image"]
    assert image == f"registry.k8s.io/kube-scheduler:v{render.KUBE_VERSION}"
    pinned = template(helm, "scheduler.kubeScheduler.image.tag=v1.31.2")
    assert pinned.container("Deployment", "kube-scheduler")["image"].endswith(":v1.31.2")


@pytest.mark.parametrize(("setting", "message"), [
    ("config.resourcePreset=nvidia", 'unknown preset "nvidia"; choose one of hami, tke, '
                                     "vgpu-manager, volcano"),
    ("config.compatPresets={hami,kai}", r'config.compatPresets: unknown preset "kai"'),
    ("webhook.certs.mode=vault", "webhook.certs.mode"),
    ("webhook.failurePolicy=Retry", "neither Fail nor Ignore"),
    ("webhook.timeoutSeconds=31", "between 1 and 30"),
    ("config.schedulerName=default-scheduler", "must not be default-scheduler"),
    ("scheduler.replicas=2,scheduler.leaderElect=false", "needs scheduler.leaderElect=true"),
    ("scheduler.replicas=2,scheduler.extender.leaderElect=false",
     "needs scheduler.extender.leaderElect unset or true"),
    ("serviceMonitor.enabled=true,podMonitor.enabled=true", "choose one"),
    ("serviceMonitor.enabled=true,plugin.service.enabled=false", "use podMonitor"),
    ("prometheusRule.enabled=true,prometheusRule.pendingMinutes=0", "1 or more"),
    ("opsAuth.enabled=true", "opsAuth.enabled needs opsAuth.existingSecret"),
    ("opsAuth.enabled=true,opsAuth.existingSecret=t,config.ops.tokenFile=/t",
     "config.ops.tokenFile is set by opsAuth"),
])
def test_unsupported_values_fail_with_a_reason(helm: Path, setting: str, message: str) -> None:
    with pytest.raises(render.RenderError, match=message):
        render.render(helm, (setting,), lint=False)


# kinds that kubernetes-validate has no schema for (CRDs)
NOT_BUILT_IN = ("cert-manager.io/", "monitoring.coreos.com/")


def validate_built_in(m: Manifests, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in m.docs:
        if not doc["apiVersion"].startswith(NOT_BUILT_IN):
            kv.validate(doc, version, strict=True)


@pytest.mark.parametrize("sets", [
    ("config.plugin.featureGates.CorePlugin=true", "scheduler.extender.leaderElect=true",
     "scheduler.replicas=3", "plugin.runtimeClassName=nvidia", "imagePullSecrets[0].name=regcred"),
    ("webhook.certs.mode=cert-manager", "webhook.replicas=1", "config.resourcePreset=hami",
     "config.compatPresets={volcano,tke}", "webhook.failurePolicy=Ignore"),
    ("webhook.certs.mode=cert-manager", "webhook.certs.certManager.issuerRef.name=corp-ca",
     "webhook.certs.certManager.issuerRef.kind=ClusterIssuer",
     "webhook.namespaceSelector.matchLabels.team=ml", "webhook.nodeSelector.role=infra"),
    ("webhook.enabled=false",),
    ("prometheusRule.enabled=true", "podMonitor.enabled=true", "dashboards.namespace=grafana",
     "dashboards.annotations.grafana_folder=GPUs"),
    ("networkPolicy.opsFrom=null", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
     "opsAuth.enabled=true", "opsAuth.existingSecret=ops-token", "webhook.metricsAddress=::"),
], ids=["gates-and-election", "cert-manager-hami", "cert-manager-issuer", "no-webhook",
        "monitoring", "fenced-with-a-token"])
def test_variants_match_the_kubernetes_schema(helm: Path, sets: tuple[str, ...]) -> None:
    validate_built_in(template(helm, *sets), render.KUBE_VERSION)


def _template_for(helm: Path, kube_version: str, *sets: str) -> Manifests:
    args = [a for s_ in sets for a in ("--set", s_)]
    return Manifests.parse(render._helm(helm, "template", render.RELEASE, str(render.CHART),
                                        "--namespace", render.NAMESPACE,
                                        "--kube-version", kube_version, *args))


def test_the_charts_floor_renders_without_match_conditions(helm: Path) -> None:
    # matchConditions: alpha (off) in 1.27, on by default from 1.28, GA in 1.30.
    for version, present in (("1.25.0", False), ("1.27.0", False), ("1.28.0", True)):
        m = _template_for(helm, version)
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            (cfg,) = m.of_kind(kind)
            assert ("matchConditions" in cfg["webhooks"][0]) is present, (version, kind)
        validate_built_in(m, version)


def test_the_grant_policy_renders_from_kubernetes_1_30_and_can_be_turned_off(
        helm: Path) -> None:
    """ValidatingAdmissionPolicy is v1 from Kubernetes 1.30: below, the chart leaves the
    grant policy out (docs/install.md says what then stands in its way)."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    for version, present in (("1.29.0", False), ("1.30.0", True)):
        m = _template_for(helm, version)
        assert all(bool(m.of_kind(k)) is present for k in kinds), version
    m = _template_for(helm, "1.30.0", "grantPolicy.enabled=false")
    assert not any(m.of_kind(k) for k in kinds)


# -- resource presets ---------------------------------------------------------------------

FIELDS = ("number", "memory", "cores", "memory_percent", "priority")


def expected_managed(preset: str, compat: tuple[str, ...], *, memory_gate: bool = False,
                     core_gate: bool = False, settings: Settings | None = None,
                     ) -> dict[str, bool]:
    """The code's resource names of the enabled presets -> ignoredByScheduler (under the
    names ``settings`` gives them, when given)."""
    presets = (settings.presets() if settings is not None
               else tuple(PRESETS[p] for p in dict.fromkeys((preset, *compat))))
    gates = settings.preset_named("vgpu-manager") if settings else PRESETS["vgpu-manager"]
    names = [getattr(p, f) for p in presets for f in FIELDS]
    out = {n: True for n in names if n is not None}
    out[str(gates.memory)] = not memory_gate
    out[str(gates.cores)] = not core_gate
    out = {n: v for n, v in out.items() if n in names}
    out[presets[0].number] = False  # the one the device plugin advertises
    for prefix in dict.fromkeys(p.mig for p in presets):
        if prefix is not None:  # MIG profiles: advertised by the plugin too
            out.update({f"{prefix}{profile}": False for profile in MIG_PROFILES})
    return out


@pytest.mark.parametrize(("preset", "compat"), [
    *[(p, ()) for p in PRESETS],
    ("vgpu-manager", ("hami", "volcano", "tke")),
    ("hami", ("vgpu-manager",)),
    ("volcano", ("volcano", "tke")),
])
def test_every_preset_renders_with_the_codes_names(helm: Path, preset: str,
                                                   compat: tuple[str, ...]) -> None:
    sets = [f"config.resourcePreset={preset}"]
    if compat:
        sets.append("config.compatPresets={" + ",".join(compat) + "}")
    m = template(helm, *sets, "config.plugin.featureGates.MemoryPlugin=true")
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert (settings.resourcePreset, settings.compatPresets) == (preset, compat)
    (ext,) = m.scheduler_config()["extenders"]
    got = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    assert len(got) == len(ext["managedResources"])
    assert got == expected_managed(preset, compat, memory_gate=True)
    gpu_names = {getattr(PRESETS[p], f) for p in (preset, *compat)
                 for f in ("number", "memory", "cores", "memory_percent", "mig")} - {None}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = m.of_kind(kind)
        expression = match_condition(cfg["webhooks"][0])
        assert set(re.findall(r'"([^"]+)"', expression)) == gpu_names
        if importlib.util.find_spec("celpy") is not None:
            check_match_condition(expression, preset, compat)


# Every peer's names moved as its own system allows (HAMi's keys, a domain), set in the
# chart's values: seed 004's inspur.com/vcuda-*, Volcano and VGPU-Manager under another
# domain, HAMi's five names.
RENAMED = ("config.resourcePreset=tke", "config.compatPresets={hami,volcano,vgpu-manager}",
           "config.resourceNames.tke.domain=inspur.com",
           "config.resourceNames.volcano.domain=gpu.example.org",
           "config.resourceNames.vgpu-manager.domain=corp.example",
           "config.resourceNames.hami.resourceName=example.com/vgpu",
           "config.resourceNames.hami.resourceMem=example.com/vgpu-memory",
           "config.resourceNames.hami.resourceCores=example.com/vgpu-cores",
           "config.resourceNames.hami.resourceMemPercentage=example.com/vgpu-memory-share",
           "config.resourceNames.hami.resourcePriority=example.com/vgpu-priority",
           "config.plugin.featureGates.MemoryPlugin=true")


def test_renamed_presets_render_with_the_codes_names(helm: Path) -> None:
    """config.resourceNames reaches the daemons' settings, kube-scheduler's managedResources
    (the gated memory name too) and the webhooks' matchConditions, which select exactly
    the pods the webhook's code takes for GPU pods under those names."""
    m = template(helm, *RENAMED)
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    presets = {p.name: p for p in settings.presets()}
    assert (presets["tke"].number, presets["tke"].memory) == (
        "inspur.com/vcuda-core", "inspur.com/vcuda-memory")
    assert presets["volcano"].memory_percent == "gpu.example.org/vgpu-memory-percentage"
    assert presets["hami"].names == (
        "example.com/vgpu", "example.com/vgpu-memory", "example.com/vgpu-cores",
        "example.com/vgpu-memory-share", "example.com/vgpu-priority")
    (ext,) = m.scheduler_config()["extenders"]
    got = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    want = expected_managed("tke", (), memory_gate=True, settings=settings)
    assert got == want
    assert got["corp.example/vgpu-memory"] is False  # MemoryPlugin: node capacity
    assert got["inspur.com/vcuda-core"] is False  # what the device plugin advertises
    builtin = {n for p in PRESETS.values() for n in p.names} - {
        n for p in presets.values() for n in p.names}
    assert not builtin & set(got)  # no built-in name the settings replaced
    gpu_names = {n for p in presets.values()
                 for n in (p.number, p.memory, p.cores, p.memory_percent, p.mig) if n}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = m.of_kind(kind)
        expression = match_condition(cfg["webhooks"][0])
        assert set(re.findall(r'"([^"]+)"', expression)) == gpu_names
        if importlib.util.find_spec("celpy") is not None:
            check_match_condition(expression, "tke", settings.compatPresets,
                                  settings.defaults())


@pytest.mark.parametrize(("setting", "message"), [
    ("config.resourceNames.hami.resourceName=example.com/gpu",
     "config.resourceNames.hami: the preset is not enabled"),
    ("config.resourceNames.kai.domain=example.com", 'unknown preset "kai"'),
    ("config.resourceNames.vgpu-manager.domain=Example.com", "is not a DNS subdomain"),
    ("config.resourceNames.vgpu-manager.domain=kubernetes.io", "Kubernetes' own"),
    ("config.resourceNames.vgpu-manager.resourceName=vgpu", "not an extended resource name"),
    ("config.resourceNames.vgpu-manager.resourceMem=", "not an extended resource name"),
    ("config.resourceNames.vgpu-manager.resourceMem=nvidia.com/vgpu-number",
     "two resources of the enabled presets have one name"),
    ("config.resourceNames.vgpu-manager.resourceGPU=example.com/g", "unknown key"),
    ("config.resourcePreset=tke,config.resourceNames.tke.resourceCores=example.com/c",
     "TKE's names are vcuda-core"),
])
def test_bad_resource_names_fail_with_a_reason(helm: Path, setting: str, message: str) -> None:
    with pytest.raises(render.RenderError, match=message):
        render.render(helm, (setting,), lint=False)


def test_nvidia_com_gpu_is_rendered_only_with_the_hami_preset(helm: Path) -> None:
    assert "nvidia.com/gpu" not in render.render(helm, (), lint=False)
    assert "nvidia.com/gpu" not in render.render(
        helm, ("config.compatPresets={volcano,tke}",), lint=False)
    hami = template(helm, "config.resourcePreset=hami")
    (ext,) = hami.scheduler_config()["extenders"]
    assert {"name": "nvidia.com/gpu", "ignoredByScheduler": False} in ext["managedResources"]
    # The chart says why NVIDIA's and HAMi's device plugins must stay off those nodes.
    values = (render.CHART / "values.yaml").read_text()
    notes = (render.CHART / "templates" / "NOTES.txt").read_text()
    assert "kubelet keeps one plugin per resource name" in values
    assert "if has $nvidia" in notes  # any enabled preset that advertises it
    assert "kubelet keeps one device plugin per" in notes
    renamed = render.render(helm, ("config.resourcePreset=hami",
                                   "config.resourceNames.hami.resourceName=example.com/gpu"),
                            lint=False)
    assert "nvidia.com/gpu\n" not in renamed and "name: example.com/gpu" in renamed


# -- the webhook's switches ------------------------------------------------------------------

WEBHOOK_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                 "PodDisruptionBudget", "Certificate", "Issuer"}


def _webhook_objects(m: Manifests) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in m.docs
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"
            or d["kind"] in WEBHOOK_KINDS}


def test_cert_manager_mode_makes_its_own_ca_chain(helm: Path) -> None:
    m = template(helm, "webhook.certs.mode=cert-manager")
    assert _webhook_objects(m) >= {
        ("Issuer", "vgpud-webhook-selfsigned"), ("Certificate", "vgpud-webhook-ca"),
        ("Issuer", "vgpud-webhook-ca"), ("Certificate", "vgpud-webhook")}
    selfsigned = m.one("Issuer", "vgpud-webhook-selfsigned")
    assert selfsigned["spec"] == {"selfSigned": {}}
    ca = m.one("Certificate", "vgpud-webhook-ca")
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"]["name"] == "vgpud-webhook-selfsigned"
    assert m.one("Issuer", "vgpud-webhook-ca")["spec"]["ca"]["secretName"] == ca["spec"][
        "secretName"]
    cert = m.one("Certificate", "vgpud-webhook")
    assert cert["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer",
                                         "name": "vgpud-webhook-ca"}
    svc, ns = "vgpud-webhook", render.NAMESPACE
    assert cert["spec"]["dnsNames"] == [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc",
                                        f"{svc}.{ns}.svc.cluster.local"]
    assert "server auth" in cert["spec"]["usages"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = m.of_kind(kind)
        assert cfg["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{ns}/vgpud-webhook"}
    # The Secret the Certificate writes is what the webhook serves with.
    c = m.container("Deployment", "webhook")
    volumes = {v["name"]: v for v in m.pod_spec("Deployment", "vgpud-webhook")["volumes"]}
    mounts = {mt["mountPath"]: mt for mt in c["volumeMounts"]}
    for name, key in (("tls-cert", "tls.crt"), ("tls-key", "tls.key")):
        path = flag(c["args"], name)
        assert path is not None and path.endswith("/" + key)
        mount = mounts[path.rsplit("/", 1)[0]]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == cert["spec"]["secretName"]
    params = cli_params(c["args"])
    assert params["bootstrap_secret"] is None and params["webhook_configuration"] is None
    # No bootstrap: no Secret or webhook-configuration rights at all.
    assert m.rules("ClusterRole", "vgpud-webhook") == {("", "nodes", ()): {"list", "watch"}}
    assert not [d for d in m.of_kind("Role") if d["metadata"]["name"] == "vgpud-webhook"]
    assert not [d for d in m.of_kind("RoleBinding") if d["metadata"]["name"] == "vgpud-webhook"]


def test_cert_manager_mode_with_an_issuer_uses_it(helm: Path) -> None:
    m = template(helm, "webhook.certs.mode=cert-manager",
                 "webhook.certs.certManager.issuerRef.name=corp-ca",
                 "webhook.certs.certManager.issuerRef.kind=ClusterIssuer",
                 "webhook.certs.certManager.issuerRef.group=cert-manager.io")
    assert not m.of_kind("Issuer")
    (cert,) = m.of_kind("Certificate")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                         "group": "cert-manager.io"}


def test_bootstrap_mode_renders_no_cert_manager_objects(helm: Path) -> None:
    m = template(helm)
    assert not m.of_kind("Certificate") and not m.of_kind("Issuer")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = m.of_kind(kind)
        assert "cert-manager.io/inject-ca-from" not in (cfg["metadata"].get("annotations") or {})


def test_webhook_can_be_left_out(helm: Path) -> None:
    m = template(helm, "webhook.enabled=false")
    assert _webhook_objects(m) == set()
    assert {(d["kind"], d["metadata"]["name"]) for d in m.of_kind("Deployment")} == {
        ("Deployment", "vgpud-scheduler")}


def test_one_webhook_replica_has_no_budget_or_spread(helm: Path) -> None:
    m = template(helm, "webhook.replicas=1")
    assert not m.of_kind("PodDisruptionBudget")
    assert "affinity" not in m.pod_spec("Deployment", "vgpud-webhook")


def test_webhook_selectors_follow_the_release_namespace_and_values(helm: Path) -> None:
    out = render._helm(helm, "template", "gpu", str(render.CHART), "--namespace", "gpu-system",
                       "--kube-version", render.KUBE_VERSION,
                       "--set", "webhook.excludeNamespaces={kube-system,monitoring}",
                       "--set", "webhook.namespaceSelector.matchExpressions[0].key=tier",
                       "--set", "webhook.namespaceSelector.matchExpressions[0].operator=In",
                       "--set", "webhook.namespaceSelector.matchExpressions[0].values={gpu}",
                       "--set", "webhook.objectSelector.matchLabels.gpu=yes",
                       "--set", "webhook.failurePolicy=Ignore",
                       "--set", "webhook.timeoutSeconds=5")
    m = Manifests.parse(out)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (cfg,) = m.of_kind(kind)
        (hook,) = cfg["webhooks"]
        assert hook["clientConfig"]["service"]["name"] == "gpu-vgpud-webhook"
        assert hook["clientConfig"]["service"]["namespace"] == "gpu-system"
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
        exprs = hook["namespaceSelector"]["matchExpressions"]
        assert exprs[0] == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                            "values": ["kube-system", "monitoring", "gpu-system"]}
        assert {"key": "vgpud.io/webhook", "operator": "NotIn", "values": ["disabled"]} in exprs
        assert {"key": "tier", "operator": "In", "values": ["gpu"]} in exprs
        assert hook["objectSelector"]["matchLabels"] == {"gpu": "yes"}
    args = m.container("Deployment", "webhook")["args"]
    assert flag(args, "service-name") == "gpu-vgpud-webhook"
    assert flag(args, "webhook-configuration") == "gpu-vgpud-webhook"
    assert flag(args, "bootstrap-secret") == "gpu-vgpud-webhook-tls"
    role = m.one("Role", "gpu-vgpud-webhook")
    assert role["metadata"]["namespace"] == "gpu-system"


# -- monitoring -----------------------------------------------------------------------------

def test_prometheus_rule_is_the_rules_file_with_its_pending_threshold(helm: Path) -> None:
    rules = yaml.safe_load((render.CHART / "rules" / "vgpud.rules.yaml").read_text())
    for minutes in (15, 7):
        m = template(helm, "prometheusRule.enabled=true",
                     f"prometheusRule.pendingMinutes={minutes}",
                     "prometheusRule.labels.release=prometheus")
        (rule,) = m.of_kind("PrometheusRule")
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["labels"]["release"] == "prometheus"
        want = yaml.safe_load(yaml.safe_dump(rules).replace("> 15 * 60", f"> {minutes} * 60"))
        assert rule["spec"] == want
        (pending,) = [r for g in rule["spec"]["groups"] for r in g["rules"]
                      if r.get("alert") == "VgpudGpuPodPending"]
        assert pending["expr"].endswith(f"> {minutes} * 60")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
               if e["operator"] == "In")


def test_service_monitor_scrapes_the_metrics_port_of_each_role(helm: Path) -> None:
    m = template(helm, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom",
                 "serviceMonitor.interval=15s")
    (sm,) = m.of_kind("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [render.NAMESPACE]}
    (ep,) = sm["spec"]["endpoints"]
    # the plugin's namespace/pod/container labels name the workload: they must win
    assert (ep["port"], ep["path"], ep["interval"], ep["honorLabels"]) == (
        "metrics", "/metrics", "15s", True)
    chosen = {s["metadata"]["name"] for s in m.of_kind("Service")
              if _selects(sm["spec"]["selector"], s["metadata"]["labels"])}
    assert chosen == {"vgpud-scheduler", "vgpud-plugin", "vgpud-webhook"}
    for name in chosen:
        ports = [p["name"] for p in m.one("Service", name)["spec"]["ports"]]
        assert "metrics" in ports, name
    assert not m.of_kind("PodMonitor")


def test_pod_monitor_scrapes_every_role_by_its_port_name(helm: Path) -> None:
    m = template(helm, "podMonitor.enabled=true")
    (pm,) = m.of_kind("PodMonitor")
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert (ep["port"], ep["honorLabels"]) == ("metrics", True)
    for kind, name, container in (("Deployment", "vgpud-scheduler", "extender"),
                                  ("DaemonSet", "vgpud-plugin", "plugin"),
                                  ("Deployment", "vgpud-webhook", "webhook")):
        labels = m.workload(kind, name)["spec"]["template"]["metadata"]["labels"]
        assert _selects(pm["spec"]["selector"], labels), name
        assert "metrics" in [p["name"] for p in m.container(kind, container)["ports"]]
    assert not m.of_kind("ServiceMonitor")


def test_dashboards_follow_their_values(helm: Path) -> None:
    m = template(helm, "dashboards.namespace=monitoring", "dashboards.labels.team=gpu",
                 "dashboards.annotations.grafana_folder=GPUs")
    maps = [d for d in m.of_kind("ConfigMap") if d["metadata"]["name"].startswith(
        "vgpud-dashboard-")]
    assert len(maps) == len(list((render.CHART / "dashboards").glob("*.json")))
    for cm in maps:
        meta = cm["metadata"]
        assert meta["namespace"] == "monitoring"
        assert {"grafana_dashboard": "1", "team": "gpu"}.items() <= meta["labels"].items()
        assert meta["annotations"] == {"grafana_folder": "GPUs"}
    off = template(helm, "dashboards.enabled=false")
    assert not [d for d in off.of_kind("ConfigMap") if "dashboard" in d["metadata"]["name"]]


# -- who may reach the ops ports (issue 23, finding 3) ------------------------------------


def test_network_policies_follow_their_values(helm: Path) -> None:
    assert not template(helm, "networkPolicy.enabled=false").of_kind("NetworkPolicy")
    # no opsFrom admits nobody to the ops ports (not everybody, as an empty `from` would)
    check_network_policies(template(helm, "networkPolicy.opsFrom=null"), [], [])
    prometheus = {"namespaceSelector": {"matchLabels": {"team": "obs"}},
                  "podSelector": {"matchLabels": {"app": "prometheus"}}}
    narrowed = template(helm, "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
                        "networkPolicy.opsFrom[0].namespaceSelector.matchLabels.team=obs",
                        "networkPolicy.opsFrom[0].podSelector.matchLabels.app=prometheus")
    check_network_policies(narrowed, [prometheus], [{"ipBlock": {"cidr": "10.0.0.0/24"}}])
    no_webhook = template(helm, "webhook.enabled=false")
    check_network_policies(no_webhook, yaml.safe_load(
        (render.CHART / "values.yaml").read_text())["networkPolicy"]["opsFrom"], [])
    assert "vgpud-webhook" not in {n["metadata"]["name"]
                                   for n in no_webhook.of_kind("NetworkPolicy")}


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_ops_auth_mounts_the_secret_where_the_settings_read_it(helm: Path,
                                                               monitor: str) -> None:
    m = template(helm, "opsAuth.enabled=true", "opsAuth.existingSecret=ops-token",
                 "opsAuth.key=bearer", f"{monitor}.enabled=true")
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    token = Path(settings.ops.tokenFile)
    assert token.name == "bearer"
    for kind, name, container in (("Deployment", "vgpud-scheduler", "extender"),
                                  ("DaemonSet", "vgpud-plugin", "plugin"),
                                  ("Deployment", "vgpud-webhook", "webhook")):
        volumes = {v["name"]: v for v in m.pod_spec(kind, name)["volumes"]}
        secret = volumes["ops-auth"]["secret"]
        assert secret["secretName"] == "ops-token"
        assert secret["items"] == [{"key": "bearer", "path": "bearer"}]
        (mount,) = [v for v in m.container(kind, container)["volumeMounts"]
                    if v["name"] == "ops-auth"]
        assert (mount["mountPath"], mount["readOnly"]) == (str(token.parent), True)
    kube_scheduler = m.container("Deployment", "kube-scheduler")
    assert "ops-auth" not in {v["name"] for v in kube_scheduler["volumeMounts"]}
    (mon,) = m.of_kind("ServiceMonitor" if monitor == "serviceMonitor" else "PodMonitor")
    endpoints = mon["spec"].get("endpoints") or mon["spec"]["podMetricsEndpoints"]
    for ep in endpoints:
        assert ep["authorization"] == {"type": "Bearer",
                                       "credentials": {"name": "ops-token", "key": "bearer"}}
    # off (the default), Prometheus sends nothing and no Secret is needed
    (plain,) = template(helm, f"{monitor}.enabled=true").of_kind(mon["kind"])
    for ep in plain["spec"].get("endpoints") or plain["spec"]["podMetricsEndpoints"]:
        assert "authorization" not in ep


def test_listen_addresses_follow_their_values(helm: Path) -> None:
    m = template(helm, "scheduler.extender.metricsAddress=::", "webhook.address=::",
                 "webhook.metricsAddress=10.1.2.3")
    sched = cli_params(m.container("Deployment", "extender")["args"])
    assert sched["metrics_listen"] == "[::]:9395"
    assert sched["listen"] == "127.0.0.1:8888"  # the verbs: loopback, always
    webhook = cli_params(m.container("Deployment", "webhook")["args"])
    assert (webhook["listen"], webhook["metrics_listen"]) == ("[::]:9443", "10.1.2.3:9396")
    from vgpud.process import parse_listen

    assert parse_listen(sched["metrics_listen"]) == ("::", 9395)


def test_dra_adds_device_classes_and_a_least_privilege_node_role(helm: Path) -> None:
    """dra.enabled: the DeviceClasses (resource.k8s.io/v1, schema of 1.37) and the DRA node
    role's RBAC; off (the default), neither. The real API server takes the classes in
    tests/realkube/test_dra_scheduling.py, and its audit log proves the role suffices."""
    assert not Manifests.committed().of_kind("DeviceClass")
    m = template(helm, "dra.enabled=true", "dra.migProfileClasses=true",
                 "dra.extendedResourceName=nvidia.com/vgpu-number")
    classes = {d["metadata"]["name"]: d["spec"] for d in m.of_kind("DeviceClass")}
    assert {"vgpu.vgpud.io", "gpu.vgpud.io", "mig.vgpud.io", "mig-1g.10gb.vgpud.io"} <= set(
        classes)
    assert classes["vgpu.vgpud.io"]["extendedResourceName"] == "nvidia.com/vgpu-number"
    assert [n for n, s in classes.items() if "extendedResourceName" in s] == ["vgpu.vgpud.io"]
    for spec in classes.values():
        (sel,) = spec["selectors"]
        assert sel["cel"]["expression"].startswith('device.driver == "gpu.vgpud.io"')
    assert m.rules("ClusterRole", "vgpud-dra") == {
        ("", "nodes", ()): {"get", "patch"},  # the node runtime's, as the plugin's
        ("", "pods", ()): {"get", "list", "watch"},
        ("", "events", ()): {"create", "patch"},
        ("resource.k8s.io", "resourceslices", ()): {"list", "create", "update", "delete"},
        ("resource.k8s.io", "resourceclaims", ()): {"get"},
        # status.devices of its driver, on its own node's claims (KEP-4817; 1.36's check)
        ("resource.k8s.io", "resourceclaims/status", ()): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver", ("gpu.vgpud.io",)): {
            "associated-node:patch"},
    }
    # `vgpud dra` runs on the DRA nodes only, the device plugin everywhere else
    (ds,) = [d for d in m.of_kind("DaemonSet") if d["metadata"]["name"] == "vgpud-dra"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "vgpud-dra"
    assert pod["nodeSelector"] == {"vgpud.io/node-mode": "dra"}
    assert pod["containers"][0]["args"][:1] == ["dra"]
    assert {"--kubelet-dir=/var/lib/kubelet", "--cdi-dir=/var/run/cdi"} <= set(
        pod["containers"][0]["args"])
    (plugin,) = [d for d in m.of_kind("DaemonSet") if d["metadata"]["name"] == "vgpud-plugin"]
    (term,) = plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "vgpud.io/node-mode", "operator": "NotIn", "values": ["dra"]}]
    # its writes to nodes and pods are held to its own node, as the plugin's are
    (plugin_scope,) = [p for p in m.of_kind("ValidatingAdmissionPolicy")
                       if p["metadata"]["name"] == "vgpud-plugin-scope"]
    assert "vgpud-dra'" in plugin_scope["spec"]["matchConditions"][0]["expression"]
    (binding,) = [b for b in m.of_kind("ClusterRoleBinding")
                  if b["metadata"]["name"] == "vgpud-dra"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vgpud-dra",
                                    "namespace": "kube-system"}]
    (scope,) = [p for p in m.of_kind("ValidatingAdmissionPolicy")
                if p["metadata"]["name"] == "vgpud-dra-scope"]
    assert scope["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == [
        "resourceslices"]
    validate_built_in(m, "1.37.0")
    assert not [p for p in template(helm, "dra.enabled=true", "grantPolicy.enabled=false")
                .of_kind("ValidatingAdmissionPolicy") if "dra" in p["metadata"]["name"]]
    bare = template(helm, "dra.enabled=true")  # no extended resource unless named
    assert not any("extendedResourceName" in d["spec"] for d in bare.of_kind("DeviceClass"))
    assert len(bare.of_kind("DeviceClass")) == 3


def test_with_dra_the_scheduler_may_read_the_dra_nodes_slices_and_claims(helm: Path) -> None:
    """dra.enabled turns on the scheduler's two DRA informers (its settings' dra.enabled)
    and grants them list and watch, nothing more: the status page shows the DRA nodes
    (tests/realkube/test_dra_end_to_end.py runs it with this role)."""
    m = template(helm, "dra.enabled=true")
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.dra.enabled
    rules = m.rules("ClusterRole", "vgpud-scheduler")
    assert {k: v for k, v in rules.items() if k[0] == "resource.k8s.io"} == {
        ("resource.k8s.io", "resourceslices", ()): {"list", "watch"},
        ("resource.k8s.io", "resourceclaims", ()): {"list", "watch"},
    }
    assert rules == {**Manifests.committed().rules("ClusterRole", "vgpud-scheduler"),
                     **{k: v for k, v in rules.items() if k[0] == "resource.k8s.io"}}
    off = Manifests.committed()
    assert not parse_settings(yaml.safe_load(
        off.configmap_file("vgpud-settings", "vgpud.yaml"))).dra.enabled


def test_dra_rbac_is_what_its_code_calls(helm: Path) -> None:
    """`vgpud dra`'s role against every call its code can make (vgpud/dra and the node
    runtime under it), as the other roles' in test_manifests.py: equal, but for the two
    calls the node package has for the device plugin alone: a pod's patch (the reassignment,
    whose one caller is vgpud/node/configure.py, PreStartContainer's, which no module of
    `vgpud dra` imports) and the node's status (the CorePlugin/MemoryPlugin totals, which
    `vgpud dra` does not publish: DraOptions.node_resources). The real API server shows the
    role suffices (tests/realkube/test_dra_kubelet.py) and refuses the rest
    (tests/realkube/test_rbac.py)."""
    import subprocess
    import sys

    from vgpud.dra.run import DraOptions

    m = template(helm, "dra.enabled=true")
    granted = {(res, v) for (_, res, _), verbs in m.rules("ClusterRole", "vgpud-dra").items()
               for v in verbs}
    needs = api_needs("dra", "node")
    plugin_only = {("pods", "patch"), ("nodes/status", "patch")}
    assert plugin_only <= needs
    # a write of status.devices is also authorized on the synthetic resourceclaims/driver,
    # with the node-aware verb (Kubernetes 1.36+): what the code's status patch implies
    assert ("resourceclaims/status", "patch") in needs
    implied = {("resourceclaims/driver", "associated-node:patch")}
    assert (needs - plugin_only) | implied == granted
    code = ("import sys, vgpud.dra.run, vgpud.dra.command\n"
            "print('vgpud.node.configure' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert done.stdout.strip() == "False"
    assert DraOptions(node_name="n", pod_resources_socket=Path("p"),
                      state_dir=Path("s")).node().node_resources is False
