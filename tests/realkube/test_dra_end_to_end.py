"""DRA end to end, nothing done by hand: a real kubelet (the fake container runtime) with
``vgpud dra`` registered on its node; the plugin publishes the node's GPUs as
ResourceSlices; the chart's DeviceClasses are applied as the chart renders them; a pod asks
a share of a GPU through a ResourceClaimTemplate; kube-controller-manager makes the claim,
the stock kube-scheduler allocates it from vgpud's slices (consumable capacity) and binds
the pod to the kubelet's node; the kubelet calls ``NodePrepareResources`` and hands the
CDI device the plugin answered to the runtime; the recorded container, with the CDI spec
applied as a container runtime would, runs in runc where the shim (on the fake CUDA
driver) holds it to the claim's 4 GiB, and its limits file says 30 % of the cores.

The fixtures are those of the two halves: ``dra`` (the chart's DRA objects, the controller
manager, kube-scheduler) from ``test_dra_scheduling``, the kubelet with ``vgpud dra`` from
``test_dra_kubelet``. The plugin runs as there: with a token of the chart's ``vgpud-dra``
ServiceAccount bound to its pod on the kubelet's node, the chart's policies that hold it to
that node in force (``dra_role``); the audit check of conftest fails the test on a 403 to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.rendered import Manifests
from tests.node.conftest import FAKES, built  # noqa: F401 (fixture)
from tests.oci.conftest import node, runc  # noqa: F401 (fixtures)
from tests.oci.runtime import Node
from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario
from tests.realkube.controlplane import ControlPlane
from tests.realkube.kubelet import fake_gpu_uuid
from tests.realkube.release import Release
from tests.realkube.test_dra_kubelet import (  # noqa: F401 (fixture)
    INTERP,
    OOM,
    DraPlugin,
    _shim_built,
    cdi_names,
    dra_role,
    metric,
    running_dra_node,
    with_cdi,
)
from tests.realkube.test_dra_scheduling import (  # noqa: F401 (fixture)
    SCHEDULER,
    Allocated,
    Dra,
    _allocated,
    _pod,
    _template,
    dra,
)
from tests.standin.quantity import value_of
from vgpud.core.dra import DRIVER, NODE_MODE_LABEL
from vgpud.core.limits import DeviceLimits, parse
from vgpud.dra.cdi import KIND, spec_path

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
MEMORY = 16384  # MiB of each of the node's two fake GPUs
# what the pod's image brings with the fake driver: the node's GPUs, no context cost
FAKE_GPU_ENV = {"FAKECUDA_DEVICES": f"{MEMORY},{MEMORY}", "FAKECUDA_CTX_MIB": "0"}


@pytest.fixture
def dra_kubelet(dra: Dra, control_plane: ControlPlane, dra_role: Manifests,  # noqa: F811
                scenario: Scenario) -> Iterator[DraPlugin]:
    """The kubelet's node with ``vgpud dra``: two GPUs of 16 GiB. ``dra`` first: its
    kube-scheduler and controller manager outlive the node."""
    with running_dra_node(control_plane, scenario, memory=MEMORY) as plugin:
        yield plugin


class Prepared:
    """A pod placed by kube-scheduler and started by the kubelet: its claim as allocated,
    the CreateContainer request of ``main`` and the CDI device the plugin prepared."""

    def __init__(self, scenario: Scenario, plugin: DraPlugin, dra: Dra,  # noqa: F811
                 name: str, template: str | None, pod: Obj | None = None) -> None:
        kubelet = plugin.kubelet
        if pod is None:  # else created already (through the webhook)
            assert template is not None
            pod = _pod(scenario, name, template, env=FAKE_GPU_ENV)
        self.allocated: Allocated = _allocated(scenario, dra, name)
        statuses = scenario.get(name)["status"]["resourceClaimStatuses"]
        self.claim: Obj = scenario.admin.get("ResourceClaim", statuses[0]["resourceClaimName"],
                                             scenario.ns)
        # made by kube-controller-manager from the template, reserved for the pod by
        # kube-scheduler
        (owner,) = self.claim["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", pod["metadata"]["uid"]), owner
        (reserved,) = self.claim["status"]["reservedFor"]
        assert reserved["uid"] == pod["metadata"]["uid"], reserved
        self.uid = self.claim["metadata"]["uid"]
        self.request: Obj = wait_for(
            f"kubelet to create the container of {name}",
            lambda: (kubelet.created_for(pod["metadata"]["uid"], "main") or [None])[0],
            timeout=60, detail=lambda: scenario.describe(name) + "\n" + plugin.tails())
        self.cdi_id = f"{KIND}={self.uid}-{self.allocated.device}"
        assert cdi_names(self.request) == [self.cdi_id], self.request["config"].get(
            "CDI_devices")
        spec = json.loads(spec_path(plugin.cdi_dir, self.uid).read_text())
        (self.device,) = spec["devices"]
        assert f"{spec['kind']}={self.device['name']}" == self.cdi_id

    @property
    def gpu(self) -> int:
        """The index of the GPU whose device node the CDI spec gives the container."""
        (n,) = [d["path"] for d in self.device["containerEdits"]["deviceNodes"]
                if d["path"].removeprefix("/dev/nvidia").isdigit()]
        return int(n.removeprefix("/dev/nvidia"))

    def limits(self) -> DeviceLimits:
        """The limits file the CDI spec mounts at ``/etc/vgpud``: its one device."""
        mounts = {m["containerPath"]: m for m in self.device["containerEdits"]["mounts"]}
        config = Path(mounts["/etc/vgpud"]["hostPath"]) / "config"
        (d,) = parse(config.read_text()).devices
        return d


def test_a_claim_from_a_template_is_scheduled_prepared_by_the_kubelet_and_held_to_its_slice(
        dra: Dra, dra_kubelet: DraPlugin, scenario: Scenario, node: Node,  # noqa: F811
        built: None, control_plane: ControlPlane,  # noqa: F811
        tmp_path_factory: pytest.TempPathFactory) -> None:
    plugin, kubelet = dra_kubelet, dra_kubelet.kubelet

    def slices() -> list[Obj] | None:
        got = [s for s in scenario.admin.list("ResourceSlice")
               if s["spec"].get("nodeName") == kubelet.name and s["spec"]["driver"] == DRIVER]
        return got or None
    # the kubelet wiped the node's slices when it started; vgpud dra publishes them once
    # registered
    (published,) = wait_for("vgpud dra to publish the node's ResourceSlice", slices,
                            timeout=60, detail=plugin.tails)
    assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]

    small = _template(scenario, "small", {"memory": "4Gi", "cores": "30"})
    first = Prepared(scenario, plugin, dra, "one", small)
    assert first.allocated.node == kubelet.name
    assert first.allocated.consumed == {"memory": 4 * GIB, "cores": 30, "vgpus": 1}, first
    assert "dra_prepared" in plugin.log()  # NodePrepareResources, before the sandbox
    # the claim's limits file: 4 GiB and 30 % of the GPU kube-scheduler allocated
    gpu = first.gpu
    assert first.allocated.device == f"gpu-{gpu}"
    limits = first.limits()
    assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
        fake_gpu_uuid(gpu), 4 * GIB, 30)
    # the claim's device status (KEP-4817), written by the driver with the chart's role
    # (server-side apply; the audit check fails the test on a 403 to it)
    def reported() -> list[Obj] | None:
        got = scenario.admin.get("ResourceClaim", first.claim["metadata"]["name"], scenario.ns)
        devices: list[Obj] = (got.get("status") or {}).get("devices") or []
        return devices or None
    (status,) = wait_for("the claim's device status", reported, timeout=30,
                         detail=plugin.tails)
    assert (status["driver"], status["pool"], status["device"], status.get("shareID")) == (
        DRIVER, kubelet.name, first.allocated.device, first.allocated.share_id or None)
    assert status["data"] == {"uuid": fake_gpu_uuid(gpu), "index": gpu,
                              "model": "NVIDIA Fake 24GB", "memoryLimitBytes": 4 * GIB,
                              "coreLimitPercent": 30}
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]

    # the recorded container, with the CDI spec applied, in runc: the shim, preloaded
    # through the spec's /etc/ld.so.preload, shows it the claim's 4 GiB and holds it there
    r = first.request
    c = node.container(r["config"]["metadata"]["name"], INTERP,
                       allocate=with_cdi(r, plugin.cdi_dir),
                       pod_uid=r["sandbox_config"]["metadata"]["uid"], driver=FAKES,
                       # the NVIDIA runtime's part: only the GPU of the device node
                       image_env={"CUDA_VISIBLE_DEVICES": fake_gpu_uuid(gpu)})
    p = c.start(interactive=True)
    assert p.ask_json("use 0", timeout=30)["rc"] == 0
    assert p.ask_json("info", timeout=30)["total"] == 4 * GIB
    assert p.ask_json("alloc 0 3g", timeout=30)["rc"] == 0
    assert p.ask_json("alloc 0 2g", timeout=30)["rc"] == OOM
    assert p.ask_json("alloc 0 1g", timeout=30)["rc"] == 0  # exactly the claim's 4 GiB
    assert p.ask_json("alloc 0 1", timeout=30)["rc"] == OOM  # and not a byte more
    wait_for("the container's process to register", lambda: metric(
        plugin.metrics_port, "vgpud_container_process_registrations_total",
        result="accepted") == 1, timeout=30, detail=plugin.tails)

    # consumable capacity: a second 4 GiB / 30 % claim shares the GPU, with its own limits
    second = Prepared(scenario, plugin, dra, "two", small)
    assert (second.allocated.node, second.allocated.device) == (kubelet.name,
                                                                first.allocated.device)
    assert second.allocated.share_id != first.allocated.share_id
    assert second.uid != first.uid
    limits = second.limits()
    assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
        fake_gpu_uuid(gpu), 4 * GIB, 30)
    # 10 GiB does not fit beside 8 GiB on a 16 GiB GPU: the other one
    big = _template(scenario, "big", {"memory": "10Gi"})
    third = Prepared(scenario, plugin, dra, "three", big)
    assert third.allocated.node == kubelet.name
    assert third.allocated.device != first.allocated.device
    limits = third.limits()
    # it asked no cores: the policy's default (defaultCores 0), no SM limit
    assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
        fake_gpu_uuid(third.gpu), 10 * GIB, 0)
    assert third.gpu != gpu
    assert plugin.log().count("dra_prepared") == 3

    # vgpud inspect, from the real API server: the DRA node's GPUs as the claims hold them
    # (the slices' capacities, the allocations' consumedCapacity, the pods reserved)
    kc = control_plane.kubeconfig_for_cert("dra-inspect", "dra-inspect", "system:masters")
    out = subprocess.run([sys.executable, "-m", "vgpud", "inspect", "gpus", "--kubeconfig",
                          str(kc), "-o", "json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False,
                         env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    # (claims other tests left behind, whose nodes are gone, are warned about: not ours)
    assert out.returncode == 0 and scenario.ns not in out.stderr, out.stderr
    rows = {g["index"]: g for g in json.loads(out.stdout) if g["node"] == kubelet.name}
    fields = ("uuid", "memoryCapacity", "memoryAllocated", "coresAllocated",
              "vgpusAllocated")
    assert {i: tuple(g[f] for f in fields) for i, g in rows.items()} == {
        gpu: (fake_gpu_uuid(gpu), MEMORY << 20, 8 * GIB, 60, 2),
        third.gpu: (fake_gpu_uuid(third.gpu), MEMORY << 20, 10 * GIB, 0, 1)}
    assert sorted(s["pod"] for s in rows[gpu]["slices"]) == ["one", "two"]
    assert [(s["pod"], s["state"]) for s in rows[third.gpu]["slices"]] == [
        ("three", "reserved")]

    # and the status page of vgpud's scheduler, run with its chart's ServiceAccount (the
    # audit check fails the test on a 403 to it): its DRA informers show the same GPUs
    rel = Release(control_plane, tmp_path_factory.mktemp("dra-status"), ("dra.enabled=true",))
    rel.apply_objects(webhooks=False)
    rel.start_extender()
    try:
        def shown() -> list[Obj] | None:
            url = f"http://127.0.0.1:{rel.extender_ops}/api/v1/gpus?node={kubelet.name}"
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    items: list[Obj] = json.loads(r.read())["items"]
            except urllib.error.HTTPError as e:  # 503 until its informers have listed
                assert e.code == 503, e.read()
                return None
            return items if len(items) == 2 else None
        page = wait_for("the status API to show the DRA node's GPUs", shown, timeout=60,
                        detail=rel.tails)
        assert {g["index"]: g for g in page} == rows
        assert all(g["dra"] for g in page)
    finally:
        rel.stop()


def test_a_vgpu_pod_through_the_webhook_gets_a_claim_and_the_same_limits(
        dra: Dra, dra_kubelet: DraPlugin, scenario: Scenario,  # noqa: F811
        control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 26: a pod asking ``nvidia.com/vgpu-number``, ``-memory`` and ``-cores`` as
    on a device-plugin node, headed to a DRA node, is rewritten by the chart's webhook
    (``dra.translate``, run with its own ServiceAccount: the autouse audit check fails
    the test on any 403 to it) into a claim from a template the webhook makes; the claim
    is allocated by kube-scheduler and prepared by the kubelet with the limits of the
    device-plugin path: 4 GiB and 30 % of the GPU."""
    plugin = dra_kubelet
    rel = Release(control_plane, tmp_path_factory.mktemp("dra-translate"),
                  ("dra.enabled=true", "dra.translate=selected"))
    rel.apply_objects()
    rel.start_webhook()
    try:
        def asking(name: str, where: str) -> Obj:
            return scenario.admin.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": scenario.ns},
                "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                         "nodeSelector": {TEST_LABEL: where, NODE_MODE_LABEL: "dra"},
                         "automountServiceAccountToken": False, "enableServiceLinks": False,
                         "containers": [{
                             "name": "main", "image": "registry.invalid/cuda:12",
                             "env": [{"name": k, "value": v} for k, v in FAKE_GPU_ENV.items()],
                             "resources": {"limits": {"nvidia.com/vgpu-number": "1",
                                                      "nvidia.com/vgpu-memory": "4096",
                                                      "nvidia.com/vgpu-cores": "30"}}}]}})

        pod = asking("asks-vgpus", scenario.id)
        # as the API server stored it: the webhook's patch applied
        assert pod["spec"]["resourceClaims"] == [
            {"name": "vgpud-main", "resourceClaimTemplateName": "vgpud-1x4096mi-30c"}]
        main = pod["spec"]["containers"][0]["resources"]
        assert main.get("claims") == [{"name": "vgpud-main"}], main
        assert not any(n.startswith("nvidia.com/") for n in main.get("limits") or {}), main
        template = scenario.admin.get("ResourceClaimTemplate", "vgpud-1x4096mi-30c",
                                      scenario.ns)
        asked = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
        assert {k: value_of(v) for k, v in asked["requests"].items()} == {
            "memory": 4 * GIB, "cores": 30}, asked  # the server writes 4096Mi as 4Gi
        # a second pod of that shape finds the template the server stored (4Gi for
        # 4096Mi) and is admitted: the template's request compared by value
        again = asking("asks-again", "nowhere")  # placed nowhere: only admitted
        assert again["spec"]["resourceClaims"] == pod["spec"]["resourceClaims"]
        got = Prepared(scenario, plugin, dra, "asks-vgpus", None, pod=pod)
        assert got.allocated.node == plugin.kubelet.name
        assert got.allocated.consumed == {"memory": 4 * GIB, "cores": 30, "vgpus": 1}, got
        limits = got.limits()
        assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
            fake_gpu_uuid(got.gpu), 4 * GIB, 30)
    finally:
        rel.uninstall()


MIG_PARENT = fake_gpu_uuid(1)
MIG_3G = "MIG-0b7e9d4a-3c1f-5e2a-9d8b-3g20gb000001"
MIG_1G = "MIG-0b7e9d4a-3c1f-5e2a-9d8b-1g10gb000007"
A100 = "NVIDIA A100-SXM4-40GB"
MIG_DEVICES = {"devices": [
    {"uuid": fake_gpu_uuid(0), "index": 0, "model": A100, "memory": 40960, "numa": 0,
     "links": [], "healthy": True, "mig": False},
    {"uuid": MIG_PARENT, "index": 1, "model": A100, "memory": 40960, "numa": 0, "links": [],
     "healthy": True, "mig": True},
    {"uuid": MIG_3G, "index": 1, "model": A100, "memory": 20096, "numa": 0, "links": [],
     "healthy": True, "mig": False, "parent": MIG_PARENT, "profile": "3g.20gb",
     "instance": "1-0"},
    {"uuid": MIG_1G, "index": 1, "model": A100, "memory": 9856, "numa": 0, "links": [],
     "healthy": True, "mig": False, "parent": MIG_PARENT, "profile": "1g.10gb",
     "instance": "7-0"}]}


@pytest.fixture
def mig_kubelet(dra: Dra, control_plane: ControlPlane, dra_role: Manifests,  # noqa: F811
                scenario: Scenario) -> Iterator[DraPlugin]:
    """The kubelet's node with ``vgpud dra`` (``migStrategy: mixed``): GPU 0 whole, GPU 1
    in MIG mode with a 3g.20gb and a 1g.10gb instance, each offered whole."""
    with running_dra_node(control_plane, scenario, devices=MIG_DEVICES,
                          settings={"migStrategy": "mixed"}) as plugin:
        yield plugin


def test_a_mig_instance_claimed_by_profile_is_prepared_by_the_kubelet_with_its_limits(
        dra: Dra, mig_kubelet: DraPlugin, scenario: Scenario) -> None:  # noqa: F811
    """Issue 26 with MIG on the real components: ``vgpud dra`` publishes the instances of a
    GPU in MIG mode (not the GPU itself); a claim from a template of the chart's MIG class
    that selects a profile is allocated the instance by the stock kube-scheduler, made by
    kube-controller-manager, prepared through the real kubelet; the CDI spec gives the
    container the instance's GPU's device node and a limits file naming the instance, with
    all of its memory. A share of a GPU (the vGPU class) lands on the GPU not in MIG mode."""
    plugin, kubelet = mig_kubelet, mig_kubelet.kubelet

    def published() -> list[str] | None:
        names = [d["name"] for s in scenario.admin.list("ResourceSlice")
                 if s["spec"].get("nodeName") == kubelet.name and s["spec"]["driver"] == DRIVER
                 for d in s["spec"]["devices"]]
        return names or None
    names = wait_for("vgpud dra to publish the node's devices", published, timeout=60,
                     detail=plugin.tails)
    assert sorted(names) == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-7-0"]

    scenario.admin.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-3g", "namespace": scenario.ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.vgpud.io", "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].migProfile == "3g.20gb"'}}]}}]}}}})
    whole = Prepared(scenario, plugin, dra, "mig", "mig-3g")
    assert (whole.allocated.node, whole.allocated.device) == (kubelet.name, "gpu-1-mig-1-0")
    # the instance whole: all of its memory, its one vGPU
    assert whole.allocated.consumed["memory"] == 20096 << 20, whole.allocated
    assert whole.allocated.consumed["vgpus"] == 1, whole.allocated
    assert whole.allocated.consumed["cores"] == 100, whole.allocated
    assert whole.gpu == 1  # the device node of the instance's GPU
    limits = whole.limits()
    assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
        MIG_3G, 20096 << 20, 100)

    # a share of a GPU: only the GPU not in MIG mode has one
    share = Prepared(scenario, plugin, dra, "share",
                     _template(scenario, "share", {"memory": "4Gi", "cores": "30"}))
    assert share.allocated.device == "gpu-0"
    limits = share.limits()
    assert (limits.uuid, limits.memory_limit, limits.core_limit) == (
        fake_gpu_uuid(0), 4 * GIB, 30)
