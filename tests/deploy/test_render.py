"""The chart itself, rendered by helm: the committed manifests must not drift from it, and
its switches must change what they say. helm comes from PyPI (manifests/render.py), so
these tests need network on first use (then a cache); they skip with the reason otherwise."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.deploy.rendered import ROOT, Manifests, cli_params, flag
from vgpud.config import parse_settings

pytestmark = pytest.mark.slow


def _load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vgpud_render", ROOT / "manifests" / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = _load_render()


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


def test_kill_on_over_limit_grants_the_kill_capability_only_then(helm: Path) -> None:
    sc = template(helm).container("DaemonSet", "plugin")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    m = template(helm, "config.plugin.overLimitAction=kill")
    sc = m.container("DaemonSet", "plugin")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    settings = parse_settings(yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.plugin.overLimitAction == "kill"


def test_extender_election_adds_its_flag_and_its_lease(helm: Path) -> None:
    m = template(helm, "scheduler.extender.leaderElect=true", "scheduler.replicas=2")
    args = m.container("Deployment", "extender")["args"]
    params = cli_params(args)
    assert params["leader_elect"] is True
    assert params["lease_namespace"] == "kube-system"
    names = {n for (_, _, ns) in m.rules("Role", "vgpud-scheduler-leases") for n in ns}
    assert names == {"vgpu-scheduler", "vgpud-scheduler"}
    assert m.workload("Deployment")["spec"]["replicas"] == 2
    assert "podAntiAffinity" in m.pod_spec("Deployment")["affinity"]


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
    ("config.resourcePreset=hami", "supports only resourcePreset=vgpu-manager"),
    ("config.schedulerName=default-scheduler", "must not be default-scheduler"),
    ("scheduler.replicas=2,scheduler.leaderElect=false", "needs scheduler.leaderElect=true"),
])
def test_unsupported_values_fail_with_a_reason(helm: Path, setting: str, message: str) -> None:
    with pytest.raises(render.RenderError, match=message):
        render.render(helm, (setting,), lint=False)


def test_variants_match_the_kubernetes_schema(helm: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    m = template(helm, "config.plugin.featureGates.CorePlugin=true",
                 "scheduler.extender.leaderElect=true", "scheduler.replicas=3",
                 "plugin.runtimeClassName=nvidia", "imagePullSecrets[0].name=regcred")
    for doc in m.docs:
        kv.validate(doc, render.KUBE_VERSION, strict=True)
