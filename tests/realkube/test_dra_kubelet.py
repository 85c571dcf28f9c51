"""``vgpud dra`` on a node run by the real kubelet (1.37, the fake container runtime): the
kubelet finds the plugin through its ``plugins_registry`` directory, calls
``NodePrepareResources`` for a pod's ResourceClaim before the sandbox exists, hands the
CDI device IDs the plugin answered to the runtime in ``CreateContainer``, and calls
``NodeUnprepareResources`` once the pod is gone, also when the plugin was restarted in
between.

No kube-scheduler allocates here: the test writes the claim's ``status.allocation`` (a
share of ``gpu-0``: 4 GiB and 30 % of its cores, as the scheduler's consumable-capacity
allocation records it) and ``reservedFor`` with the admin client, then binds the pod to
the kubelet's node, as kube-scheduler's ``dynamicresources`` plugin and binder would.

The plugin runs as the chart runs it: with a token of the chart's ``vgpud-dra``
ServiceAccount (its ClusterRole, ``dra.enabled=true``) bound to a pod of it on the
kubelet's node, as the DaemonSet's projected token is, with the chart's admission policies
that hold that account to its own node in force (``dra_role``). Every test here fails on
any 403 to it (the audit check of conftest); the first shows, from the audit log, what it
asked the API server and that it asked as that identity.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.deploy.rendered import Manifests
from tests.node.conftest import FAKES, built  # noqa: F401 (fixture)
from tests.oci.conftest import node, runc  # noqa: F401 (fixtures)
from tests.oci.runtime import Node
from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario
from tests.realkube.controlplane import ControlPlane, Proc, free_port
from tests.realkube.kubelet import Kubelet, allocate_response_of, fake_devices, fake_gpu_uuid
from tests.realkube.release import (
    DRA_USER,
    NAMESPACE,
    NODE_CLAIM,
    dra_identity,
    driver_kubeconfig,
    driver_pod,
)
from vgpud.core.dra import DRIVER
from vgpud.core.limits import parse
from vgpud.dra.cdi import KIND, spec_path
from vgpud.node.podresources import PodResourcesClient

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
INTERP = ["/opt/fakecuda/viaproc"]  # the fake driver's test program: one op a line, JSON back
# what the pod's image would bring with the fake driver: two 24 GiB GPUs, no context cost
FAKE_GPU_ENV = {"FAKECUDA_DEVICES": "24576,24576", "FAKECUDA_CTX_MIB": "0"}
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@dataclass
class DraPlugin:
    """``vgpud dra`` for ``kubelet``'s node: the kubelet's root directory, fake GPUs, the
    built shim, and its CDI specs in a directory of its own; its credentials those of the
    DaemonSet's pod there (``driver_pod``, which the kubelet runs: a token bound to it
    names the node)."""

    cp: ControlPlane
    kubelet: Kubelet
    gpus: int = 2
    memory: int = 24576
    # a --fake-devices document of its own (MIG instances, say) instead of ``gpus`` alike
    devices: Obj | None = None
    settings: Obj = field(default_factory=dict)  # more of vgpud.yaml's plugin section
    proc: Proc = field(init=False)
    driver_pod: Obj = field(init=False)

    def __post_init__(self) -> None:
        d = self.kubelet.dir / "vgpud"
        d.mkdir()
        self.state_dir, self.cdi_dir = d / "state", d / "cdi"
        devices = d / "devices.json"
        devices.write_text(json.dumps(self.devices or fake_devices(self.gpus, self.memory)))
        config = d / "vgpud.yaml"
        config.write_text(yaml.safe_dump({"logLevel": "debug", "plugin": {
            "shimHostDir": str(d / "shim"), **self.settings}}))
        libs = sorted((ROOT / "csrc" / "build").glob("libvgpu.so.*.*"))
        assert libs, "the shim is not built (make -C csrc)"
        self.metrics_port = free_port()
        self.driver_pod = driver_pod(self.cp, self.kubelet.name)
        kc = driver_kubeconfig(self.cp, self.driver_pod, d / "kubeconfig")
        self.proc = Proc(f"vgpud-dra-{self.kubelet.name}", [
            sys.executable, "-m", "vgpud", "dra", f"--config={config}", f"--kubeconfig={kc}",
            f"--kubelet-dir={self.kubelet.root_dir}", f"--cdi-dir={self.cdi_dir}",
            f"--pod-resources-socket={self.kubelet.pod_resources_socket}",
            f"--state-dir={self.state_dir}", f"--fake-devices={devices}",
            f"--listen=127.0.0.1:{self.metrics_port}"], d,
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

    def close(self) -> None:
        """Stop, and remove the DaemonSet's pod it ran as."""
        self.proc.stop()
        self.cp.admin.delete("Pod", self.driver_pod["metadata"]["name"], NAMESPACE, grace=0)

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace") if self.proc.log_path.exists() \
            else ""

    def calls(self) -> set[tuple[str, str, int]]:
        """What the audit log shows the plugin asked the API server, as (verb, resource,
        response code), ``resource`` with its API group and subresource
        (``resourceslices.resource.k8s.io``, ``nodes/status``): every request of the DRA
        ServiceAccount whose token names this node. A watch shows once it ended."""
        events, _ = self.cp.audit()
        out = set()
        for e in events:
            user = e.get("user") or {}
            if user.get("username") != DRA_USER or (user.get("extra") or {}).get(
                    NODE_CLAIM) != [self.kubelet.name]:
                continue
            ref = e.get("objectRef") or {}
            resource = ref.get("resource", "") + (f".{ref['apiGroup']}" if ref.get("apiGroup")
                                                  else "")
            if ref.get("subresource"):
                resource += f"/{ref['subresource']}"
            out.add((e["verb"], resource, (e.get("responseStatus") or {}).get("code", 0)))
        return out

    def tails(self) -> str:
        return self.proc.tail(60) + "\n" + self.kubelet.tails()


@pytest.fixture(scope="module", autouse=True)
def _shim_built() -> None:
    import subprocess

    subprocess.run(["make", "-s", "-C", str(ROOT / "csrc")], check=True)


@pytest.fixture(scope="module")
def dra_role(control_plane: ControlPlane) -> Iterator[Manifests]:
    """The chart's identity of ``vgpud dra`` and the policies that hold it to its node."""
    with dra_identity(control_plane) as chart:
        yield chart


@contextlib.contextmanager
def running_dra_node(cp: ControlPlane, scenario: Scenario, **plugin: Any,
                     ) -> Iterator[DraPlugin]:
    """A real kubelet labelled for ``scenario`` (and ``vgpud.io/node-mode=dra``) with
    ``vgpud dra`` registered with it (``plugin``: :class:`DraPlugin`'s fields). The chart's
    DRA identity must be there (``dra_role``)."""
    kubelet = Kubelet(cp, f"{scenario.id}-node",
                      {TEST_LABEL: scenario.id, "vgpud.io/node-mode": "dra"})
    made: DraPlugin | None = None
    try:
        kubelet.start()
        made = DraPlugin(cp, kubelet, **plugin)
        yield made.start()
    finally:
        if made is not None:
            made.close()
        kubelet.close()


@pytest.fixture
def dra_node(control_plane: ControlPlane, dra_role: Manifests,
             scenario: Scenario) -> Iterator[DraPlugin]:
    with running_dra_node(control_plane, scenario) as plugin:
        yield plugin


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
                   "env": [{"name": k, "value": v} for k, v in FAKE_GPU_ENV.items()],
                   "resources": {"claims": [{"name": "gpu"}]}} for c in ("main", "helper")]
    pod = scenario.pod(name, containers=containers)
    pod["spec"].update(automountServiceAccountToken=False, enableServiceLinks=False,
                       schedulerName="no-scheduler-here",
                       resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    return pod


def allocate(scenario: Scenario, claim: Obj, pod: Obj, on: str) -> Obj:
    """What kube-scheduler writes: the allocation (a share of gpu-0 on node ``on``) and the
    reservation for the pod."""
    meta = claim["metadata"]
    status = {"allocation": {
        "devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": on, "device": "gpu-0",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [on]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                         "uid": pod["metadata"]["uid"]}]}
    out: Obj = scenario.admin.request(
        "PATCH", f"{CLAIMS.format(ns=meta['namespace'])}/{meta['name']}/status",
        {"status": status}, content_type="application/merge-patch+json")
    return out


def bind(scenario: Scenario, pod: Obj, on: str) -> None:
    meta = pod["metadata"]
    scenario.admin.request(
        "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"],
                                                             "uid": meta["uid"]},
         "target": {"apiVersion": "v1", "kind": "Node", "name": on}})


def cdi_names(request: Obj) -> list[str]:
    return [c["name"] for c in request["config"].get("CDI_devices", [])]


def with_cdi(request: Obj, cdi_dir: Path) -> Any:
    """The container of a recorded CreateContainer request as a CDI-enabled runtime makes
    it: kubelet's part (the pod's envs and mounts) and the edits of each CDI device it names,
    from the specs in ``cdi_dir``, as one ``ContainerAllocateResponse`` for
    :meth:`tests.oci.Node.container`. The device nodes are left out: the fake driver stands
    in for the GPU, and this host has no ``/dev/nvidia0``."""
    from vgpud.plugin._pb import v1beta1 as pb

    r = allocate_response_of(request)
    specs = [json.loads(f.read_text()) for f in cdi_dir.glob("*.json")]
    devices = {f"{s['kind']}={d['name']}": d["containerEdits"] for s in specs
               for d in s["devices"]}
    for name in cdi_names(request):
        edits = devices[name]  # a name the runtime cannot resolve fails the container
        for kv in edits.get("env", []):
            k, _, v = kv.partition("=")
            r.envs[k] = v
        r.mounts.extend(pb.Mount(container_path=m["containerPath"], host_path=m["hostPath"],
                                 read_only="ro" in m["options"])
                        for m in edits.get("mounts", []))
    return r


def metric(port: int, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if (head == name or head.startswith(name + "{")) and all(
                f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_the_real_kubelet_prepares_a_claim_through_vgpud_dra_and_unprepares_it_after_a_restart(
        dra_node: DraPlugin, scenario: Scenario) -> None:
    plugin, kubelet = dra_node, dra_node.kubelet
    # kubelet took the registration: the endpoint it dials is the plugin socket
    assert (kubelet.root_dir / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
    assert (kubelet.root_dir / "plugins" / DRIVER / "dra.sock").exists()
    # once registered, vgpud dra publishes the node's GPUs as its ResourceSlices (kubelet
    # wiped the node's slices when it started, and wipes a driver's when it goes away)

    def slices() -> list[Obj] | None:
        got = [s for s in scenario.admin.list("ResourceSlice")
               if s["spec"].get("nodeName") == kubelet.name and s["spec"]["driver"] == DRIVER]
        return got or None

    (published,) = wait_for("vgpud dra to publish the node's ResourceSlice", slices,
                            timeout=60, detail=plugin.tails)
    assert {d["name"] for d in published["spec"]["devices"]} >= {"gpu-0"}
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
    # the restarted plugin logs the unprepare once the spec, the allocation and the
    # checkpoint entry are gone
    wait_for("kubelet to unprepare the claim through the restarted plugin",
             lambda: "dra_unprepared" in plugin.log().rsplit("===== start 2", 1)[1],
             timeout=120, detail=plugin.tails)
    assert not spec_path(plugin.cdi_dir, uid).exists() and not allocation_dir.exists()
    wait_for("the pod to be gone", lambda: scenario.admin.find("Pod", "trainer",
                                                               scenario.ns) is None,
             timeout=60, detail=plugin.tails)
    scenario.admin.request("DELETE", f"{CLAIMS.format(ns=scenario.ns)}/slice")
    scenario.admin.request("DELETE", f"{CLASSES}/{cls}")

    # all of it as the chart's DRA identity, its pod's token naming this node, and granted:
    # its Node read and its inventory annotation written, the pods on it watched, the
    # claim read, this node's slices listed and created (the audit check of conftest fails
    # the test on a 403 to it too)
    calls = plugin.calls()
    assert {(v, r) for v, r, code in calls if code < 300} >= {
        ("get", "nodes"), ("patch", "nodes"), ("watch", "pods"),
        ("list", "resourceslices.resource.k8s.io"),
        ("create", "resourceslices.resource.k8s.io"),
        ("get", "resourceclaims.resource.k8s.io")}, sorted(calls)
    assert not [c for c in calls if c[2] == 403], sorted(calls)


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


def _containers(plugin: DraPlugin, scenario: Scenario, node: Node,  # noqa: F811
                names: tuple[str, ...] = ("main", "helper")) -> list[Any]:
    """A pod of two containers using one claim (4 GiB, 30 % of GPU 0), prepared by the
    real kubelet; the containers ``names`` then run by runc from their recorded
    CreateContainer requests with the CDI spec applied, the fake driver's interactive
    program in each (its processes, started)."""
    kubelet = plugin.kubelet
    cls = device_class(scenario)
    claim = resource_claim(scenario, "shared", cls)
    pod = scenario.apply(claim_pod(scenario, "pair", "shared"))
    allocate(scenario, claim, pod, kubelet.name)
    bind(scenario, pod, kubelet.name)

    def created() -> list[Obj] | None:
        got = [kubelet.created_for(pod["metadata"]["uid"], c) for c in ("main", "helper")]
        return [g[0] for g in got] if all(got) else None

    requests = wait_for("kubelet to create both containers", created, timeout=120,
                        detail=lambda: scenario.describe("pair") + "\n" + plugin.tails())
    gpu0 = {"CUDA_VISIBLE_DEVICES": fake_gpu_uuid(0)}  # the one GPU whose node it was given
    out = []
    for r in requests:
        if r["config"]["metadata"]["name"] not in names:
            continue
        c = node.container(r["config"]["metadata"]["name"], INTERP,
                           allocate=with_cdi(r, plugin.cdi_dir),
                           pod_uid=r["sandbox_config"]["metadata"]["uid"], driver=FAKES,
                           image_env=gpu0)
        p = c.start(interactive=True)
        assert p.ask_json("use 0", timeout=30)["rc"] == 0
        out.append(p)
    return out


def test_a_container_of_a_claim_is_held_to_its_slice_and_registers(
        dra_node: DraPlugin, scenario: Scenario, node: Node, built: None) -> None:  # noqa: F811
    """What kubelet asked the runtime for, with the CDI spec applied, in a real runc
    container: the shim, preloaded through the read-only ``/etc/ld.so.preload`` the spec
    mounts, shows the container the claim's 4 GiB of GPU 0 and holds it there, and its
    process registers with the plugin from the pod's cgroup."""
    (p,) = _containers(dra_node, scenario, node, ("main",))
    assert p.ask_json("info", timeout=30)["total"] == 4 * GIB
    assert p.ask_json("alloc 0 3g", timeout=30)["rc"] == 0
    assert p.ask_json("alloc 0 2g", timeout=30)["rc"] == OOM
    assert p.ask_json("alloc 0 1g", timeout=30)["rc"] == 0  # exactly the claim's 4 GiB
    assert p.ask_json("alloc 0 1", timeout=30)["rc"] == OOM
    wait_for("the registration", lambda: metric(
        dra_node.metrics_port, "vgpud_container_process_registrations_total",
        result="accepted") == 1, timeout=30, detail=dra_node.tails)


def test_two_containers_sharing_a_claim_are_held_to_it_together(
        dra_node: DraPlugin, scenario: Scenario, node: Node, built: None) -> None:  # noqa: F811
    """Both containers of the pod run, each sees the claim's 4 GiB, and what they allocate
    together stays within it; their processes both register."""
    pa, pb = _containers(dra_node, scenario, node)
    for p in (pa, pb):
        assert p.ask_json("info", timeout=30)["total"] == 4 * GIB
    wait_for("both registrations", lambda: metric(
        dra_node.metrics_port, "vgpud_container_process_registrations_total",
        result="accepted") == 2, timeout=30, detail=dra_node.tails)
    assert pa.ask_json("alloc 0 3g", timeout=30)["rc"] == 0
    assert pa.ask_json("alloc 0 2g", timeout=30)["rc"] == OOM
    assert pb.ask_json("alloc 0 2g", timeout=30)["rc"] == OOM  # 5 GiB together: refused
    assert pb.ask_json("alloc 0 1g", timeout=30)["rc"] == 0  # exactly the claim's 4 GiB
    assert pa.ask_json("alloc 0 1", timeout=30)["rc"] == OOM
    assert pb.ask_json("alloc 0 1", timeout=30)["rc"] == OOM


def test_a_restarted_kubelet_finds_the_plugin_again_and_unprepares_through_it(
        dra_node: DraPlugin, scenario: Scenario) -> None:
    """kubelet walks ``plugins_registry`` when it starts: the plugin, whose sockets stayed,
    is registered again without doing anything, and the claim kubelet prepared before its
    restart (kubelet's own checkpoint) is unprepared through it."""
    plugin, kubelet = dra_node, dra_node.kubelet
    cls = device_class(scenario)
    claim = resource_claim(scenario, "kept", cls)
    uid = claim["metadata"]["uid"]
    pod = scenario.apply(claim_pod(scenario, "steady", "kept"))
    allocate(scenario, claim, pod, kubelet.name)
    bind(scenario, pod, kubelet.name)
    wait_for("kubelet to create the container",
             lambda: kubelet.created_for(pod["metadata"]["uid"], "main") or None, timeout=120,
             detail=lambda: scenario.describe("steady") + "\n" + plugin.tails())
    registrations = plugin.log().count("dra_registered")
    kubelet.restart()
    wait_for("the restarted kubelet to register the plugin again",
             lambda: plugin.log().count("dra_registered") > registrations, timeout=60,
             detail=plugin.tails)
    assert plugin.log().count("dra_prepared") == 1  # prepared once, kubelet remembers it
    # a pod deleted before the new kubelet's pod source has it is torn down as an orphan,
    # without an unprepare: the DRA manager's reconcile loop unprepares its claims a minute
    # later. Once kubelet lists the pod again, its deletion unprepares at once.
    wait_for("the restarted kubelet to list the pod", lambda: any(
        h.pod == "steady" for h in anyio.run(PodResourcesClient(
            str(kubelet.pod_resources_socket), "").list)), timeout=60, detail=plugin.tails)
    scenario.admin.delete("Pod", "steady", scenario.ns)
    wait_for("the claim to be unprepared", lambda: "dra_unprepared" in plugin.log(),
             timeout=30, detail=plugin.tails)
    assert not spec_path(plugin.cdi_dir, uid).exists()
    scenario.admin.request("DELETE", f"{CLAIMS.format(ns=scenario.ns)}/kept")
    scenario.admin.request("DELETE", f"{CLASSES}/{cls}")
