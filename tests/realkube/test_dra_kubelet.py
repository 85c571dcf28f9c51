"""``vgpud dra`` on a node run by the real kubelet (1.37, the fake container runtime): the
kubelet finds the plugin through its ``plugins_registry`` directory, calls
``NodePrepareResources`` for a pod's ResourceClaim before the sandbox exists, hands the
CDI device IDs the plugin answered to the runtime in ``CreateContainer``, and calls
``NodeUnprepareResources`` once the pod is gone, also when the plugin was restarted in
between.

No kube-scheduler allocates here: the test writes the claim's ``status.allocation`` (a
share of ``gpu-0``: 4 GiB and 30 % of its cores, as the scheduler's consumable-capacity
allocation records it) and ``reservedFor`` with the admin client, then binds the pod to
the kubelet's node, as kube-scheduler's ``dynamicresources`` plugin and binder would. The
plugin runs with an admin client certificate: the chart has no role for it yet.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario
from tests.realkube.controlplane import ControlPlane, Proc, free_port
from tests.realkube.kubelet import Kubelet, fake_devices
from vgpud.core.dra import DRIVER
from vgpud.core.limits import parse
from vgpud.dra.cdi import KIND, spec_path

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@dataclass
class DraPlugin:
    """``vgpud dra`` for ``kubelet``'s node: the kubelet's root directory, fake GPUs, the
    built shim, and its CDI specs in a directory of its own."""

    cp: ControlPlane
    kubelet: Kubelet
    gpus: int = 2
    memory: int = 24576
    proc: Proc = field(init=False)

    def __post_init__(self) -> None:
        d = self.kubelet.dir / "vgpud"
        d.mkdir()
        self.state_dir, self.cdi_dir = d / "state", d / "cdi"
        devices = d / "devices.json"
        devices.write_text(json.dumps(fake_devices(self.gpus, self.memory)))
        config = d / "vgpud.yaml"
        config.write_text(yaml.safe_dump({"logLevel": "debug", "plugin": {
            "shimHostDir": str(d / "shim")}}))
        libs = sorted((ROOT / "csrc" / "build").glob("libvgpu.so.*.*"))
        assert libs, "the shim is not built (make -C csrc)"
        kc = self.cp.kubeconfig_for_cert(f"vgpud-dra-{self.kubelet.name}", "vgpud-dra",
                                         "system:masters")
        self.proc = Proc(f"vgpud-dra-{self.kubelet.name}", [
            sys.executable, "-m", "vgpud", "dra", f"--config={config}", f"--kubeconfig={kc}",
            f"--kubelet-dir={self.kubelet.root_dir}", f"--cdi-dir={self.cdi_dir}",
            f"--pod-resources-socket={self.kubelet.pod_resources_socket}",
            f"--state-dir={self.state_dir}", f"--fake-devices={devices}",
            f"--listen=127.0.0.1:{free_port()}"], d,
            env={"PYTHONPATH": str(ROOT), "VGPUD_LOG_FORMAT": "console",
                 "NODE_NAME": self.kubelet.name, "VGPUD_SHIM_LIBRARY": str(libs[-1])})

    def start(self, timeout: float = 90) -> DraPlugin:
        """Start, and wait until kubelet has accepted the registration (it calls
        ``NotifyRegistrationStatus``: the plugin logs ``dra_registered``)."""
        before = self.log().count("dra_registered")
        self.proc.start()

        def registered() -> bool:
            self.proc.check_alive()
            return self.log().count("dra_registered") > before
        wait_for(f"kubelet to register {DRIVER}", registered, timeout=timeout,
                 detail=self.tails)
        return self

    def stop(self) -> None:
        self.proc.stop()

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace") if self.proc.log_path.exists() \
            else ""

    def tails(self) -> str:
        return self.proc.tail(60) + "\n" + self.kubelet.tails()


@pytest.fixture(scope="module", autouse=True)
def _shim_built() -> None:
    import subprocess

    subprocess.run(["make", "-s", "-C", str(ROOT / "csrc")], check=True)


@pytest.fixture
def dra_node(control_plane: ControlPlane, scenario: Scenario) -> Iterator[DraPlugin]:
    kubelet = Kubelet(control_plane, f"{scenario.id}-node",
                      {TEST_LABEL: scenario.id, "vgpud.io/node-mode": "dra"})
    plugin: DraPlugin | None = None
    try:
        kubelet.start()
        plugin = DraPlugin(control_plane, kubelet).start()
        yield plugin
    finally:
        if plugin is not None:
            plugin.stop()
        kubelet.close()


def device_class(scenario: Scenario) -> str:
    name = f"{scenario.id}-gpu"
    scenario.admin.request("POST", CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    return name


def resource_claim(scenario: Scenario, name: str, cls: str) -> Obj:
    out: Obj = scenario.admin.request("POST", CLAIMS.format(ns=scenario.ns), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": scenario.ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": cls, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}}]}}})
    return out


def claim_pod(scenario: Scenario, name: str, claim: str) -> Obj:
    """A pod whose two containers use the claim: they share its slice."""
    containers = [{"name": c, "image": "registry.invalid/cuda:12",
                   "resources": {"claims": [{"name": "gpu"}]}} for c in ("main", "helper")]
    pod = scenario.pod(name, containers=containers)
    pod["spec"].update(automountServiceAccountToken=False, enableServiceLinks=False,
                       schedulerName="no-scheduler-here",
                       resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    return pod


def allocate(scenario: Scenario, claim: Obj, pod: Obj, node: str) -> Obj:
    """What kube-scheduler writes: the allocation (a share of gpu-0 on ``node``) and the
    reservation for the pod."""
    meta = claim["metadata"]
    status = {"allocation": {
        "devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                         "uid": pod["metadata"]["uid"]}]}
    out: Obj = scenario.admin.request(
        "PATCH", f"{CLAIMS.format(ns=meta['namespace'])}/{meta['name']}/status",
        {"status": status}, content_type="application/merge-patch+json")
    return out


def bind(scenario: Scenario, pod: Obj, node: str) -> None:
    meta = pod["metadata"]
    scenario.admin.request(
        "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"],
                                                             "uid": meta["uid"]},
         "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


def cdi_names(request: Obj) -> list[str]:
    return [c["name"] for c in request["config"].get("CDI_devices", [])]


def test_the_real_kubelet_prepares_a_claim_through_vgpud_dra_and_unprepares_it_after_a_restart(
        dra_node: DraPlugin, scenario: Scenario) -> None:
    plugin, kubelet = dra_node, dra_node.kubelet
    # kubelet took the registration: the endpoint it dials is the plugin socket
    assert (kubelet.root_dir / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
    assert (kubelet.root_dir / "plugins" / DRIVER / "dra.sock").exists()
    cls = device_class(scenario)
    claim = resource_claim(scenario, "slice", cls)
    uid = claim["metadata"]["uid"]
    pod = scenario.apply(claim_pod(scenario, "trainer", "slice"))
    stored = allocate(scenario, claim, pod, kubelet.name)
    (res,) = stored["status"]["allocation"]["devices"]["results"]
    # the API server kept the consumable-capacity fields (DRAConsumableCapacity, beta, on)
    assert res["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}, res
    bind(scenario, pod, kubelet.name)

    cdi_id = f"{KIND}={uid}-gpu-0"

    def created() -> list[Obj] | None:
        got = [kubelet.created_for(pod["metadata"]["uid"], c) for c in ("main", "helper")]
        return [g[0] for g in got] if all(got) else None

    requests = wait_for("kubelet to create both containers", created, timeout=120,
                        detail=lambda: scenario.describe("trainer") + "\n" + plugin.tails())
    # NodePrepareResources ran (before the sandbox): its CDI device reached both containers
    assert "dra_prepared" in plugin.log()
    for r in requests:
        assert cdi_names(r) == [cdi_id], r["config"].get("CDI_devices")
    spec = json.loads(spec_path(plugin.cdi_dir, uid).read_text())
    (device,) = spec["devices"]
    assert f"{spec['kind']}={device['name']}" == cdi_id
    mounts = {m["containerPath"]: m for m in device["containerEdits"]["mounts"]}
    assert "ro" in mounts["/etc/vgpud"]["options"] and "ro" in mounts["/etc/ld.so.preload"][
        "options"]
    assert "/dev/nvidia0" in {n["path"] for n in device["containerEdits"]["deviceNodes"]}
    # the limits file both containers read: 4 GiB and 30 % of GPU 0
    config = Path(mounts["/etc/vgpud"]["hostPath"]) / "config"
    (limits,) = parse(config.read_text()).devices
    assert (limits.memory_limit, limits.core_limit) == (4 * GIB, 30)
    allocation_dir = config.parent.parent

    # a restart of the plugin between prepare and unprepare loses nothing
    plugin.stop()
    assert spec_path(plugin.cdi_dir, uid).exists() and config.exists()
    plugin.start()

    scenario.admin.delete("Pod", "trainer", scenario.ns)
    wait_for("kubelet to unprepare the claim through the restarted plugin",
             lambda: not spec_path(plugin.cdi_dir, uid).exists(), timeout=120,
             detail=plugin.tails)
    assert not allocation_dir.exists()
    assert "dra_unprepared" in plugin.log().rsplit("===== start 2", 1)[1]
    wait_for("the pod to be gone", lambda: scenario.admin.find("Pod", "trainer",
                                                               scenario.ns) is None,
             timeout=60, detail=plugin.tails)
    scenario.admin.request("DELETE", f"{CLAIMS.format(ns=scenario.ns)}/slice")
    scenario.admin.request("DELETE", f"{CLASSES}/{cls}")


def test_a_claim_allocated_on_another_node_fails_the_pod_with_the_plugins_reason(
        dra_node: DraPlugin, scenario: Scenario) -> None:
    kubelet = dra_node.kubelet
    cls = device_class(scenario)
    claim = resource_claim(scenario, "elsewhere", cls)
    pod = scenario.apply(claim_pod(scenario, "lost", "elsewhere"))
    allocate(scenario, claim, pod, "some-other-node")
    bind(scenario, pod, kubelet.name)

    def reported() -> str | None:
        for e in scenario.events("lost"):
            if "not on " + kubelet.name in (e.get("message") or ""):
                return str(e["message"])
        return None

    message = wait_for("kubelet to report the plugin's refusal", reported, timeout=120,
                       detail=lambda: scenario.describe("lost") + "\n" + dra_node.tails())
    assert "is allocated on node some-other-node" in message
    assert not kubelet.created_for(pod["metadata"]["uid"], "main")
    assert dra_node.proc.alive()
    scenario.admin.delete("Pod", "lost", scenario.ns, grace=0)
    scenario.admin.request("DELETE", f"{CLAIMS.format(ns=scenario.ns)}/elsewhere")
    scenario.admin.request("DELETE", f"{CLASSES}/{cls}")
