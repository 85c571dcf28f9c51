"""Who may reach which port of the chart's pods (issue 23, finding 3), read from the
committed manifests: the NetworkPolicies against the Deployments, DaemonSet and Services
they protect, and the addresses each role listens on. Pure Python: no helm, no cluster."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.rendered import (
    CHART,
    Manifests,
    admitted_from,
    check_network_policies,
    cli_params,
    flag,
    pod_ports,
    port_of,
    selector_matches,
)
from vgpud.config import OpsSettings, Settings, parse_settings

M = Manifests.committed()
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
NP = VALUES["networkPolicy"]


def test_network_policies_are_on_by_default_and_fence_every_port() -> None:
    assert NP["enabled"] is True
    check_network_policies(M, NP["opsFrom"], NP["webhookFrom"])


def test_a_default_deny_selects_every_pod_of_the_chart() -> None:
    deny = M.one("NetworkPolicy", "vgpud-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress"]
    assert not deny["spec"].get("ingress")
    for kind in ("Deployment", "DaemonSet"):
        for w in M.of_kind(kind):
            labels = w["spec"]["template"]["metadata"]["labels"]
            assert selector_matches(deny["spec"]["podSelector"], labels), w["metadata"]["name"]


def test_ops_ports_admit_the_monitoring_namespace_only() -> None:
    def namespace(name: str) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": name}  # the API server sets it

    ops = [p for p in pod_ports(M) if p.name != "https"]
    assert {(p.container, p.name) for p in ops} == {
        ("kube-scheduler", "sched-https"), ("extender", "metrics"), ("plugin", "metrics"),
        ("webhook", "metrics")}
    for p in ops:
        (peers,) = admitted_from(M, p)
        assert peers is not None
        (peer,) = peers
        assert set(peer) == {"namespaceSelector"}  # any pod there, from no other namespace
        sel = peer["namespaceSelector"]
        assert selector_matches(sel, namespace("monitoring"))
        for other in ("default", "kube-system", "team-a"):
            assert not selector_matches(sel, namespace(other))


def test_the_webhook_takes_the_api_server_from_anywhere() -> None:
    """No NetworkPolicy can select the API server: the HTTPS port is open to every source
    unless networkPolicy.webhookFrom narrows it (test_render.py), and it is the port the
    webhook Service sends the API server to."""
    (https,) = [p for p in pod_ports(M) if p.name == "https"]
    assert admitted_from(M, https) == [None]
    svc = M.one("Service", "vgpud-webhook")
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"https", "metrics"}


def test_every_service_sends_to_an_admitted_port() -> None:
    ports = pod_ports(M)
    for svc in M.of_kind("Service"):
        mine = [p for p in ports if selector_matches({"matchLabels": svc["spec"]["selector"]},
                                                     p.labels)]
        assert mine, svc["metadata"]["name"]
        for sp in svc["spec"]["ports"]:
            (target,) = [p for p in mine if sp["targetPort"] in (p.name, p.number)]
            assert admitted_from(M, target), (svc["metadata"]["name"], sp)


def test_the_verbs_listen_on_loopback_where_no_policy_applies() -> None:
    """kube-scheduler calls the extender inside its own pod (the topology the policies
    rely on): the verbs' port is no container port, and no policy names it."""
    ext = M.container("Deployment", "extender")
    listen = flag(ext["args"], "listen")
    assert listen is not None and listen.startswith("127.0.0.1:")
    (extender,) = M.scheduler_config()["extenders"]
    assert extender["urlPrefix"] == f"http://127.0.0.1:{port_of(listen)}"
    assert "tlsConfig" not in extender  # kube-scheduler sends no credentials to the verbs
    assert port_of(listen) not in {p.number for p in pod_ports(M)}
    for np in M.of_kind("NetworkPolicy"):
        for rule in np["spec"].get("ingress") or []:
            assert port_of(listen) not in [p["port"] for p in rule.get("ports") or []]


def test_listen_addresses_follow_the_values() -> None:
    """Every ops port and the webhook's HTTPS listen on every address by default (the pod
    IP for probes and scrapes, loopback for port-forward), parsed by vgpud's own CLI."""
    ext = VALUES["scheduler"]["extender"]
    wh = VALUES["webhook"]
    sched = cli_params(M.container("Deployment", "extender")["args"])
    assert sched["metrics_listen"] == f"{ext['metricsAddress']}:{ext['metricsPort']}"
    webhook = cli_params(M.container("Deployment", "webhook")["args"])
    assert webhook["listen"] == f"{wh['address']}:{wh['port']}"
    assert webhook["metrics_listen"] == f"{wh['metricsAddress']}:{wh['metricsPort']}"
    settings = parse_settings(yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.plugin.metricsListen == VALUES["config"]["plugin"]["metricsListen"]
    assert {ext["metricsAddress"], wh["address"], wh["metricsAddress"],
            settings.plugin.metricsListen.rpartition(":")[0]} == {"0.0.0.0"}


def test_ops_settings_ship_their_defaults_and_no_token() -> None:
    settings: Settings = parse_settings(
        yaml.safe_load(M.configmap_file("vgpud-settings", "vgpud.yaml")))
    assert settings.ops == OpsSettings()
    assert settings.ops.tokenFile == ""  # opsAuth is off by default
    for kind, name in (("Deployment", "vgpud-scheduler"), ("DaemonSet", "vgpud-plugin"),
                       ("Deployment", "vgpud-webhook")):
        volumes = M.pod_spec(kind, name)["volumes"]
        assert "ops-auth" not in {v["name"] for v in volumes}
