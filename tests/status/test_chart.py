"""The chart keeps the status page inside the cluster and says how to reach it.

Read from the committed manifests (the chart's default rendering; tests/deploy checks
they match the chart), the NOTES template and docs/install.md.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.rendered import CHART, ROOT, Manifests

EXPOSING = {"Ingress", "Route", "Gateway", "HTTPRoute", "IngressRoute"}


def _scheduler() -> tuple[Manifests, dict[str, object], list[str], int]:
    m = Manifests.committed()
    dep = m.one("Deployment", "vgpud-scheduler")
    (ext,) = [c for c in dep["spec"]["template"]["spec"]["containers"]
              if c["name"] == "extender"]
    ops = int(next(a for a in ext["args"] if a.startswith("--metrics-listen="))
              .rsplit(":", 1)[1])
    return m, dep, ext["args"], ops


def test_the_ops_port_stays_inside_the_cluster() -> None:
    m, dep, args, ops = _scheduler()
    assert "--listen=127.0.0.1:8888" in args  # the verbs: loopback only, no page there
    svc = m.one("Service", "vgpud-scheduler")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(ops, "metrics")]
    pod = dep["spec"]["template"]["spec"]  # type: ignore[index]
    assert not pod.get("hostNetwork")
    for c in pod["containers"]:
        for p in c.get("ports", []):
            assert "hostPort" not in p, c["name"]
    assert not [d for d in m.docs if d["kind"] in EXPOSING]
    assert not [d for d in m.of_kind("Service")
                if d["spec"].get("type") in ("NodePort", "LoadBalancer")]


def test_notes_and_docs_say_how_to_reach_it() -> None:
    _, _, _, ops = _scheduler()
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert 'port-forward deploy/{{ include "vgpud.scheduler" . }} {{ $ops }}:{{ $ops }}' in notes
    assert "$ops := .Values.scheduler.extender.metricsPort" in notes
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"kubectl -n kube-system port-forward deploy/vgpud-scheduler {ops}:{ops}" in install
    assert f"http://localhost:{ops}/" in install
    assert "## Status page" in install and "## Ports and who may reach them" in install
    assert "opsAuth.enabled=true" in install and "networkPolicy.opsFrom" in install


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vgpud_render", ROOT / "manifests" / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_rendered_notes_name_the_real_deployment_and_port() -> None:
    render = _render_module()
    try:
        helm: Path = render.obtain_helm()
    except render.HelmUnavailable as e:
        pytest.skip(f"helm is not available: {e}")
    out = subprocess.run([str(helm), "install", "vgpud", str(CHART), "--namespace",
                          "kube-system", "--dry-run=client", "--set",
                          "scheduler.extender.metricsPort=9500"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    notes = out[out.index("NOTES:"):]
    assert "kubectl -n kube-system port-forward deploy/vgpud-scheduler 9500:9500" in notes
    assert "http://localhost:9500/" in notes
