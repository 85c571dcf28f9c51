"""``vgpud plugin`` on a node run by the real kubelet (1.37, the fake container runtime):
registration, ListAndWatch, GetPreferredAllocation, Allocate, PreStartContainer and
PodResources as kubelet really drives them, for pods the real kube-scheduler placed with
vgpud's extender; then what kubelet asked the runtime to create, applied to a real runc
container where the shim holds the program to its slice on the fake driver. Restarts of
the plugin and of the kubelet, and a GPU turning unhealthy.

Each test has its own kubelet and plugin (:mod:`tests.realkube.kubelet`); the chart's
release (webhook, extender, kube-scheduler) is the module's. Pods opt out of the
service-account token volume: no kube-controller-manager publishes ``kube-root-ca.crt``
here, and the kubelet's tmpfs volumes would live in its private mount namespace.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.node.conftest import FAKES, built  # noqa: F401 (fixture)
from tests.oci.conftest import node, runc  # noqa: F401 (fixtures)
from tests.oci.runtime import Node, Process
from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario, assignment
from tests.realkube.controlplane import ControlPlane
from tests.realkube.kubelet import (
    VGPU,
    Kubelet,
    NodePlugin,
    cri_envs,
    fake_gpu_uuid,
    recorded_container,
)
from tests.realkube.release import Release
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES, decode_node_devices, encode_assignment
from vgpud.core.model import ContainerGrant, DeviceGrant, Placement
from vgpud.node.ids import gpus_of
from vgpud.node.podresources import Held, PodResourcesClient

MIB = 1 << 20
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
INTERP = ["/opt/fakecuda/viaproc"]  # the fake driver's test program: one op a line, JSON back
# what the pod's image would bring with the fake driver: two 24 GiB GPUs, no context cost
FAKE_GPU_ENV = {"FAKECUDA_DEVICES": "24576,24576", "FAKECUDA_CTX_MIB": "0"}
HOST_KUBELET = Path("/var/lib/kubelet")


@pytest.fixture(autouse=True)
def _host_kubelet_dir_untouched() -> Iterator[None]:
    """The kubelet writes only its private directories, never the host's /var/lib/kubelet."""
    before = HOST_KUBELET.exists()
    yield
    assert HOST_KUBELET.exists() == before, f"a test created {HOST_KUBELET} on the host"


@dataclass
class GpuNode:
    kubelet: Kubelet
    plugin: NodePlugin

    @property
    def name(self) -> str:
        return self.kubelet.name

    def tails(self) -> str:
        return self.plugin.tails()


@pytest.fixture
def gpu_node(control_plane: ControlPlane, release: Release, scenario: Scenario,
             built: None, request: pytest.FixtureRequest) -> Iterator[GpuNode]:  # noqa: F811
    """A kubelet with two fake GPUs served by ``vgpud plugin`` (its settings over the
    chart's ``plugin:`` from the test's ``indirect`` parameter), labelled for the
    scenario's pods."""
    kubelet = Kubelet(control_plane, f"{scenario.id}-node", {TEST_LABEL: scenario.id})
    plugin: NodePlugin | None = None
    try:
        kubelet.start()
        plugin = NodePlugin(release, kubelet, settings=getattr(request, "param", {}))
        plugin.start()
        yield GpuNode(kubelet, plugin)
    finally:
        if plugin is not None:
            plugin.stop()
        kubelet.close()


# -- helpers -------------------------------------------------------------------------------


def gpu_pod(scenario: Scenario, name: str, limits: dict[str, str], *,
            annotations: dict[str, str] | None = None) -> Obj:
    pod = scenario.pod(name, annotations=annotations, containers=[{
        "name": "main", "image": "registry.invalid/cuda:12",
        "env": [{"name": k, "value": v} for k, v in FAKE_GPU_ENV.items()],
        "resources": {"limits": limits}}])
    pod["spec"]["automountServiceAccountToken"] = False
    pod["spec"]["enableServiceLinks"] = False
    return pod


def on_gpu(i: int) -> dict[str, str]:
    """The user annotation that makes the scheduler choose fake GPU ``i``."""
    return {"nvidia.com/include-gpu-uuid": fake_gpu_uuid(i)}


def wait_running(scenario: Scenario, g: GpuNode, name: str, timeout: float = 120) -> Obj:
    def running() -> Obj | None:
        pod = scenario.get(name)
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        return pod if status.get("phase") == "Running" and containers and all(
            "running" in (c.get("state") or {}) for c in containers) else None
    got: Obj = wait_for(f"pod {name} to run on {g.name}", running, timeout=timeout,
                        detail=lambda: scenario.describe(name) + "\n" + g.tails())
    assert got["spec"]["nodeName"] == g.name
    return got


def held(g: GpuNode) -> list[Held]:
    """kubelet's PodResources List, as the plugin reads it."""
    client = PodResourcesClient(str(g.kubelet.pod_resources_socket), VGPU)
    return anyio.run(client.list)


def ids_of(g: GpuNode, pod: Obj, container: str = "main") -> frozenset[str]:
    meta = pod["metadata"]
    (h,) = [h for h in held(g) if (h.namespace, h.pod, h.container)
            == (meta["namespace"], meta["name"], container)]
    return h.ids


def the_request(g: GpuNode, pod: Obj) -> Obj:
    """The one CreateContainer request kubelet sent for the pod's container."""
    (req,) = g.kubelet.created_for(pod["metadata"]["uid"], "main")
    return req


def mounts_of(req: Obj) -> dict[str, Obj]:
    return {m["container_path"]: m for m in req["config"].get("mounts", [])}


def envs_of(req: Obj) -> dict[str, str]:
    return cri_envs(req)


def limits_file(req: Obj) -> str:
    """The limits file the plugin wrote, read where kubelet mounts it from."""
    return (Path(mounts_of(req)["/etc/vgpud"]["host_path"]) / "config").read_text()


def kubelet_called(g: GpuNode, pod: Obj) -> dict[str, bool]:
    """Which device-plugin calls kubelet's device manager logged for the pod (--v=4)."""
    log = g.kubelet.log()
    uid, key = pod["metadata"]["uid"], f'pod="{pod["metadata"]["namespace"]}/' \
        f'{pod["metadata"]["name"]}"'
    lines = log.splitlines()
    return {
        "GetPreferredAllocation": any("Issuing a GetPreferredAllocation call" in line
                                      and uid in line for line in lines),
        "Allocate": any("Making allocation request for device plugin" in line and key in line
                        for line in lines),
        "PreStartContainer": any("Issuing a PreStartContainer call" in line and uid in line
                                 for line in lines),
    }


def reasons(scenario: Scenario, name: str) -> set[str]:
    return {e["reason"] for e in scenario.events(name)}


def metric(g: GpuNode, name: str, **labels: str) -> float | None:
    """A sample of the plugin's /metrics, by name and (some of its) labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{g.plugin.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if (head == name or head.startswith(name + "{")) and all(
                f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def ask(p: Process, line: str) -> Any:
    return p.ask_json(line, timeout=30)


# -- the scenarios -------------------------------------------------------------------------


def test_a_gpu_pod_runs_on_the_real_kubelet_and_its_container_is_held_to_its_slice(
        gpu_node: GpuNode, scenario: Scenario, node: Node) -> None:  # noqa: F811
    g = gpu_node
    # registration and ListAndWatch: kubelet advertises 2 GPUs x 10 vGPUs, all healthy
    n = g.kubelet.node()
    assert n["status"]["capacity"][VGPU] == n["status"]["allocatable"][VGPU] == "20"
    inventory = decode_node_devices(n["metadata"]["annotations"][NODE_DEVICES])
    assert [d.uuid for d in inventory.devices] == [fake_gpu_uuid(0), fake_gpu_uuid(1)]

    scenario.apply(gpu_pod(scenario, "infer", {VGPU: "1", "nvidia.com/vgpu-memory": "1000"},
                           annotations=on_gpu(1)))
    pod = wait_running(scenario, g, "infer")
    (grant,) = assignment(pod).containers
    (device,) = grant.devices
    assert (device.uuid, device.memory) == (fake_gpu_uuid(1), 1000)

    # kubelet asked for a preference, allocated and called PreStartContainer; PodResources
    # names the container as the holder of one replica of the scheduler's GPU (the hint was
    # taken: the plugin reconciled nothing)
    assert kubelet_called(g, pod) == {"GetPreferredAllocation": True, "Allocate": True,
                                      "PreStartContainer": True}, g.kubelet.log()[-3000:]
    preferred = [line for line in g.plugin.log().splitlines() if " preferred " in line]
    assert preferred and f"wanted=['{fake_gpu_uuid(1)}']" in preferred[-1], preferred
    ids = ids_of(g, pod)
    assert len(ids) == 1 and gpus_of(list(ids)) == [fake_gpu_uuid(1)], ids
    assert not reasons(scenario, "infer") & {"VgpuReassigned", "VgpuAllocationFailed"}
    assert assignment(scenario.get("infer")) == assignment(pod)

    # what kubelet asked the runtime for: the plugin's envs and mounts, the pod's env after
    req = the_request(g, pod)
    envs, mounts = envs_of(req), mounts_of(req)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == fake_gpu_uuid(1)
    assert envs["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert {k: envs[k] for k in FAKE_GPU_ENV} == FAKE_GPU_ENV
    state = str(g.plugin.state_dir)
    assert mounts["/etc/vgpud"]["readonly"] is True
    assert mounts["/etc/vgpud"]["host_path"].startswith(state)
    assert mounts["/var/run/vgpud"]["host_path"].startswith(state)
    assert not mounts["/var/run/vgpud"].get("readonly")
    assert mounts["/var/run/vgpud-arbiter"]["readonly"] is True
    assert mounts["/etc/ld.so.preload"]["readonly"] is True
    (lib,) = [m for p, m in mounts.items() if p.startswith("/usr/local/vgpud/lib/libvgpu.so.")]
    assert lib["readonly"] is True
    assert not req["config"].get("devices") and not req["config"].get("CDI_devices")
    text = limits_file(req)  # PreStartContainer wrote it before the container was created
    assert f"device.0.uuid={fake_gpu_uuid(1)}\n" in text
    assert f"device.0.memory_limit={1000 * MIB}\n" in text

    # the same request in a real container: the shim, preloaded through the read-only
    # /etc/ld.so.preload, holds the program to 1000 MiB of the GPU it was given
    c = recorded_container(node, req, INTERP, driver=FAKES)
    p = c.start(interactive=True)
    assert ask(p, "visible")["uuids"] == [fake_gpu_uuid(1)]
    assert ask(p, "use 0")["rc"] == 0
    assert ask(p, "info")["total"] == 1000 * MIB
    assert ask(p, "alloc 0 600m")["rc"] == 0
    assert ask(p, "alloc 0 600m")["rc"] == OOM
    assert ask(p, "alloc 0 400m")["rc"] == 0  # exactly to the limit
    assert ask(p, "alloc 0 1")["rc"] == OOM
    # the process registered with the plugin: its cgroup is the pod's (the real pod UID)
    assert metric(g, "vgpud_container_process_registrations_total", result="accepted") == 1
    assert metric(g, "vgpud_container_memory_limit_bytes", pod="infer") == 1000 * MIB


@pytest.mark.parametrize("gpu_node", [{"visibleDevices": "cdi"},
                                      {"visibleDevices": "device-specs"}],
                         ids=["cdi", "device-specs"], indirect=True)
def test_cdi_names_and_device_nodes_reach_the_runtime(gpu_node: GpuNode,
                                                      scenario: Scenario) -> None:
    """The other two ways the plugin names the GPUs: kubelet passes CDI names as the CRI's
    ``CDI_devices`` and device specs as ``devices``, unchanged."""
    g = gpu_node
    mode = g.plugin.settings["visibleDevices"]
    scenario.apply(gpu_pod(scenario, "named", {VGPU: "1"}, annotations=on_gpu(1)))
    pod = wait_running(scenario, g, "named")
    config = the_request(g, pod)["config"]
    assert "NVIDIA_VISIBLE_DEVICES" not in envs_of(the_request(g, pod))
    if mode == "cdi":
        assert config["CDI_devices"] == [{"name": f"nvidia.com/gpu={fake_gpu_uuid(1)}"}]
        assert not config.get("devices")
    else:
        assert not config.get("CDI_devices")
        assert [(d["container_path"], d["host_path"], d["permissions"])
                for d in config["devices"]] == [
            (p, p, "rw") for p in ("/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                   "/dev/nvidia-uvm-tools")]
    assert "/etc/vgpud" in mounts_of(the_request(g, pod))


def test_a_restarted_plugin_registers_again_and_running_containers_keep_their_limits(
        gpu_node: GpuNode, scenario: Scenario, node: Node) -> None:  # noqa: F811
    g = gpu_node
    scenario.apply(gpu_pod(scenario, "before", {VGPU: "1", "nvidia.com/vgpu-memory": "2000"},
                           annotations=on_gpu(0)))
    before = wait_running(scenario, g, "before")
    req = the_request(g, before)
    written = limits_file(req)
    c = recorded_container(node, req, INTERP, driver=FAKES)
    p = c.start(interactive=True)
    assert ask(p, "use 0")["rc"] == 0
    assert ask(p, "alloc 0 1500m")["rc"] == 0

    g.plugin.stop()
    # kubelet notices the plugin is gone: its devices are unhealthy, nothing is allocatable
    g.kubelet.wait_allocatable("0", detail=g.tails)
    g.plugin.proc.start()
    g.plugin.wait_registered()  # registered again: all 20 allocatable

    # the running container was not disturbed: same limits file, same limit
    assert limits_file(req) == written
    assert ask(p, "alloc 0 600m")["rc"] == OOM
    assert ask(p, "alloc 0 500m")["rc"] == 0
    assert scenario.get("before")["status"]["phase"] == "Running"
    # a pod after the restart is served by the new plugin, on other replicas
    scenario.apply(gpu_pod(scenario, "after", {VGPU: "1", "nvidia.com/vgpu-memory": "3000"},
                           annotations=on_gpu(0)))
    after = wait_running(scenario, g, "after")
    assert not ids_of(g, after) & ids_of(g, before)
    assert f"device.0.memory_limit={3000 * MIB}\n" in limits_file(the_request(g, after))
    assert g.plugin.proc.starts == 2


def test_a_restarted_kubelet_is_registered_with_again_and_remembers_its_pods(
        gpu_node: GpuNode, scenario: Scenario) -> None:
    g = gpu_node
    slice_ = {VGPU: "1", "nvidia.com/vgpu-memory": "1000"}
    scenario.apply(gpu_pod(scenario, "before", slice_, annotations=on_gpu(1)))
    before = wait_running(scenario, g, "before")
    ids = ids_of(g, before)
    plugin_sockets = sorted(p.name for p in g.kubelet.device_plugin_dir.glob("vgpud-*.sock"))
    assert plugin_sockets, list(g.kubelet.device_plugin_dir.iterdir())

    g.kubelet.restart()
    # kubelet removed every plugin socket and made kubelet.sock anew; the plugin saw it and
    # registered again (on a socket it created again)
    wait_for("the plugin to register again", lambda: len(re.findall(
        r"\bregistered\b.*\btimes=2\b", g.plugin.log())) >= 1, timeout=60, detail=g.tails)
    assert "kubelet_restarted" in g.plugin.log()
    assert sorted(p.name for p in g.kubelet.device_plugin_dir.glob("vgpud-*.sock")) \
        == plugin_sockets
    g.kubelet.wait_allocatable("20", detail=g.tails)
    # the running pod survived, and kubelet's checkpoint still names its replicas
    assert scenario.get("before")["status"]["phase"] == "Running"
    # PodResources lists the pod once the restarted kubelet has taken its pods back from
    # the API and its checkpoint (right after it turns allocatable again, one run found it
    # not listed yet)
    def listed() -> frozenset[str] | None:
        meta = before["metadata"]
        found = [h.ids for h in held(g) if (h.namespace, h.pod, h.container)
                 == (meta["namespace"], meta["name"], "main")]
        return found[0] if found else None
    assert wait_for("kubelet to list the running pod again", listed, timeout=60,
                    detail=g.tails) == ids
    # a new pod is allocated through the new registration, never the remembered replicas
    scenario.apply(gpu_pod(scenario, "after", slice_, annotations=on_gpu(1)))
    after = wait_running(scenario, g, "after")
    assert kubelet_called(g, after) == {"GetPreferredAllocation": True, "Allocate": True,
                                        "PreStartContainer": True}
    assert ids_of(g, after) and not ids_of(g, after) & ids
    assert gpus_of(list(ids_of(g, after))) == [fake_gpu_uuid(1)]


def test_a_gpu_turning_unhealthy_leaves_the_allocatable_vgpus(
        gpu_node: GpuNode, scenario: Scenario) -> None:
    g = gpu_node
    slice_ = {VGPU: "1", "nvidia.com/vgpu-memory": "1000"}
    scenario.apply(gpu_pod(scenario, "victim", slice_, annotations=on_gpu(1)))
    victim = wait_running(scenario, g, "victim")
    # binpack: a pod that names no GPU joins the one in use
    scenario.apply(gpu_pod(scenario, "sibling", slice_))
    sibling = wait_running(scenario, g, "sibling")
    assert gpus_of(list(ids_of(g, sibling))) == [fake_gpu_uuid(1)]

    g.plugin.write_devices(unhealthy=[1])
    n = g.kubelet.wait_allocatable("10", detail=g.tails)
    assert n["status"]["capacity"][VGPU] == "20"  # unhealthy devices still count in capacity
    wait_for("the inventory to show GPU 1 unhealthy", lambda: [
        d.healthy for d in decode_node_devices(
            g.kubelet.node()["metadata"]["annotations"][NODE_DEVICES]).devices] == [True, False],
        timeout=30, detail=g.tails)

    # kubelet reports the running container's replica unhealthy (ResourceHealthStatus)
    (vid,) = ids_of(g, victim)

    def reported() -> list[Obj] | None:
        (status,) = scenario.get("victim")["status"]["containerStatuses"]
        got: list[Obj] = status.get("allocatedResourcesStatus") or []
        return got if got and got[0]["resources"][0].get("health") == "Unhealthy" else None
    (rs,) = wait_for("the victim's allocatedResourcesStatus", reported, timeout=60,
                     detail=lambda: json.dumps(scenario.get("victim")["status"]))
    assert rs["name"] == VGPU and rs["resources"] == [{"resourceID": vid, "health": "Unhealthy"}]

    # now a pod that names no GPU is placed and allocated on the healthy one
    scenario.apply(gpu_pod(scenario, "next", slice_))
    nxt = wait_running(scenario, g, "next")
    assert [d.uuid for c in assignment(nxt).containers for d in c.devices] == [fake_gpu_uuid(0)]
    assert gpus_of(list(ids_of(g, nxt))) == [fake_gpu_uuid(0)]

    g.plugin.write_devices()
    g.kubelet.wait_allocatable("20", detail=g.tails)


def with_init(pod: Obj, limits: dict[str, str]) -> Obj:
    """``pod`` with a regular init container ``prep`` (the main container's image and env)
    asking for ``limits``."""
    (main,) = pod["spec"]["containers"]
    pod["spec"]["initContainers"] = [{**main, "name": "prep", "resources": {"limits": limits}}]
    return pod


def wait_init_running(scenario: Scenario, g: GpuNode, name: str, timeout: float = 60) -> Obj:
    def running() -> Obj | None:
        pod = scenario.get(name)
        init = (pod.get("status") or {}).get("initContainerStatuses") or []
        return pod if init and "running" in (init[0].get("state") or {}) else None
    got: Obj = wait_for(f"the init container of pod {name} to run", running, timeout=timeout,
                        detail=lambda: scenario.describe(name) + "\n" + g.tails())
    return got


def test_a_gpu_init_container_starts_with_its_own_limits(gpu_node: GpuNode,
                                                         scenario: Scenario) -> None:
    """Two things the real kubelet does that the fake kubelet did not: PodResources
    ``List`` leaves regular init containers out (``podresources/server_v1.go``), and the
    device manager hands a regular init container's IDs on to the pod's later containers
    (``devicemanager/manager.go``, ``devicesToReuse``). The plugin believed otherwise:
    PreStartContainer for a GPU init container found no holder of its IDs and failed
    ("lists no container holding exactly ...") at every retry, so the pod never started;
    GetPreferredAllocation never steered an init container to its assigned GPU; and
    housekeeping would have removed a running init container's directory after its grace
    period. (On the fake runtime an init container never ends: each pod stays in it.)"""
    from vgpud.node.allocations import AllocationStore

    g = gpu_node
    # an init container with a GPU before an app container without one
    scenario.apply(with_init(gpu_pod(scenario, "alone", {}, annotations=on_gpu(1)),
                             {VGPU: "1", "nvidia.com/vgpu-memory": "1000"}))
    wait_init_running(scenario, g, "alone")
    # GetPreferredAllocation steered kubelet to the init container's GPU
    preferred = [line for line in g.plugin.log().splitlines() if " preferred " in line]
    assert len(preferred) == 1 and f"wanted=['{fake_gpu_uuid(1)}']" in preferred[0], preferred
    (alone,) = [h.ids for h in held(g) if h.pod == "alone"]  # main, holding nothing
    assert not alone
    # ... and before an app container with two: kubelet gives it the init container's ID
    # and one more
    scenario.apply(with_init(gpu_pod(scenario, "more", {VGPU: "2", "nvidia.com/vgpu-memory":
                                                        "2000"}),
                             {VGPU: "1", "nvidia.com/vgpu-memory": "1500"}))
    for name, memory in (("alone", 1000), ("more", 1500)):
        pod = wait_init_running(scenario, g, name)
        (prep,) = g.kubelet.created_for(pod["metadata"]["uid"], "prep")
        assert f"device.0.memory_limit={memory * MIB}\n" in limits_file(prep), name
        assert not reasons(scenario, name) & {"VgpuAllocationFailed", "VgpuReassigned"}
        assert kubelet_called(g, pod)["PreStartContainer"]
    # what kubelet did: the init containers are not listed; "more"'s main holds the ID
    # "more"'s prep was configured with, and one more
    listed = {(h.pod, h.container): h.ids for h in held(g)}
    assert ("alone", "prep") not in listed and ("more", "prep") not in listed
    configured = {(a.owner.pod, a.owner.container): a.ids
                  for a in AllocationStore(g.plugin.state_dir).all() if a.owner is not None}
    prep_ids = frozenset(configured[("more", "prep")])
    assert len(prep_ids) == 1 and prep_ids < listed[("more", "main")]
    assert len(listed[("more", "main")]) == 2
    # the plugin's housekeeping, run now without its 300 s grace against this kubelet's
    # PodResources: "alone"'s init container holds IDs kubelet lists nowhere, yet its
    # directory (its limits, its registration socket) stays while the pod is active
    assert housekeeping(g) == 0
    assert ("alone", "prep") in {(a.owner.pod, a.owner.container) for a in AllocationStore(
        g.plugin.state_dir).all() if a.owner is not None}


def housekeeping(g: GpuNode) -> int:
    """What the plugin's housekeeping (``PluginService.collect``) would remove now, with
    no grace period: it reads the real PodResources and the plugin's own store."""
    from vgpud.node.allocations import AllocationStore
    from vgpud.node.devices import NodeDevices
    from vgpud.node.vendors import backend
    from vgpud.plugin.resources import served
    from vgpud.plugin.service import PluginService

    service = PluginService(
        resource=served("vgpu-manager", split=10)[0], node=g.name,
        devices=NodeDevices((), split=10, memory_scaling=1.0, core_scaling=1.0),
        store=AllocationStore(g.plugin.state_dir),
        podresources=PodResourcesClient(str(g.kubelet.pod_resources_socket), VGPU),
        cluster=None,  # type: ignore[arg-type]  # collect() makes no API call
        gpus=backend(None))  # NVML's, never asked: collect() needs no device
    return anyio.run(lambda: service.collect(grace=0))


def test_a_pod_that_grants_itself_a_gpu_gets_no_limits_and_holds_nothing(
        control_plane: ControlPlane, gpu_node: GpuNode, scenario: Scenario) -> None:
    """Issue 23, findings 1 and 2, on the real kubelet: a GPU pod of another scheduler,
    bound by its own ``nodeName`` with an assignment granting itself a whole GPU, in a
    namespace the webhook spares (which would otherwise send it through vgpud's
    scheduler), is admitted by kubelet, but PreStartContainer configures no limits (an
    event says why), and the GPU it claims stays free for a pod vgpud places there.
    (Where the chart's grant policy is installed the API server refuses such a pod
    outright: tests/realkube/test_grants.py; it is not installed here.)"""
    g = gpu_node
    ns = control_plane.namespace(f"{scenario.id}-spared", labels={"vgpud.io/webhook": "disabled"})
    scenario.namespaces.append(ns)
    whole = Placement(g.name, (ContainerGrant("main", False, (
        DeviceGrant(fake_gpu_uuid(1), 24576, 100),)),))
    forged = gpu_pod(scenario, "forged", {VGPU: "1"},
                     annotations={ASSIGNMENT: encode_assignment(whole)})
    forged["metadata"]["namespace"] = ns
    forged["spec"] |= {"schedulerName": "default-scheduler", "nodeName": g.name}
    scenario.apply(forged)

    def refusals() -> list[str] | None:
        return [e["message"] for e in control_plane.admin.list(
            "Event", ns, fieldSelector="involvedObject.name=forged")
            if e["reason"] == "VgpuAllocationFailed"] or None
    got = wait_for("the forged pod's PreStartContainer to be refused", refusals, timeout=120,
                   detail=lambda: scenario.describe("forged", ns) + "\n" + g.tails())
    assert "not vgpud's" in got[0], got
    assert scenario.get("forged", ns)["status"].get("phase") != "Running"
    # the whole of GPU 1, asked for honestly, is placed there and runs
    scenario.apply(gpu_pod(scenario, "honest", {
        VGPU: "1", "nvidia.com/vgpu-memory": "24576", "nvidia.com/vgpu-cores": "100"},
        annotations=on_gpu(1)))
    pod = wait_running(scenario, g, "honest")
    assert [d.uuid for c in assignment(pod).containers for d in c.devices] == [
        fake_gpu_uuid(1)]
