"""vgpud's ResourceSlices scheduled by the real kube-scheduler (no extender): DRA with
consumable capacity (KEP-5075, beta and on by default in 1.37: no feature gate to set).

vgpud's publisher (``vgpud.dra.publisher.run_publisher``, in this process, with the token
of the chart's ``vgpud-dra`` ServiceAccount: the audit check of conftest fails a test on any
403 to it) publishes a node's GPUs; the chart's DeviceClasses (``dra.enabled=true``) are
applied as the chart renders them; kube-controller-manager makes claims from
ResourceClaimTemplates; kube-scheduler allocates them and records what each consumed.
The node is a Node object (no kubelet: scheduling needs none)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from anyio.from_thread import BlockingPortal, start_blocking_portal

from tests.realkube.api import ApiError, Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario
from tests.realkube.controlplane import ControlPlane, Proc, free_port, kubeconfig
from tests.realkube.release import NAMESPACE, render
from tests.standin.quantity import value_of
from vgpud.core.dra import DRIVER, NODE_MODE_LABEL
from vgpud.core.model import Defaults, Gpu, NodeInventory
from vgpud.core.slices import TAINT_UNHEALTHY, DriverFacts, GpuFacts, devices, pool
from vgpud.dra.publisher import SlicePublisher, run_publisher
from vgpud.kube.client import KubeClient
from vgpud.node.devices import DeviceInfo, HealthEvent, NodeDevices

SCHEDULER = "vgpud-dra-test-scheduler"
DRA_ACCOUNT = "vgpud-dra"
VGPU_CLASS = "vgpu.vgpud.io"
GIB = 1 << 30


@dataclass
class Dra:
    cp: ControlPlane
    scheduler: Proc
    portal: BlockingPortal
    work: Path

    def driver_token(self, node: str) -> str:
        """A token of the DRA ServiceAccount bound to a pod of the driver on ``node`` (as
        the DaemonSet's projected token is): it names the node."""
        pod = self.cp.admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{node}-dra", "namespace": NAMESPACE}, "spec": {
            "nodeName": node, "serviceAccountName": DRA_ACCOUNT,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "dra", "image": "registry.invalid/x"}]}})
        return self.cp.token(NAMESPACE, DRA_ACCOUNT, pod=pod)

    def tails(self) -> str:
        return self.cp.tails() + "\n" + self.scheduler.tail(60)


def _kube_scheduler(cp: ControlPlane, work: Path) -> Proc:
    """A stock kube-scheduler (default plugins, DynamicResources among them) under its
    own name, with the bootstrap identity ``system:kube-scheduler``."""
    kc = cp.kubeconfig_for_cert("dra-kube-scheduler", "system:kube-scheduler")
    cfg = work / "dra-scheduler.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False}, "clientConnection": {"kubeconfig": str(kc)},
        # as the chart's profile leaves vgpud's memory and cores to the extender
        "profiles": [{"schedulerName": SCHEDULER, "pluginConfig": [{
            "name": "NodeResourcesFit", "args": {"ignoredResources": [
                "nvidia.com/vgpu-memory", "nvidia.com/vgpu-cores"]}}]}]}))
    return Proc("dra-kube-scheduler", [
        str(cp.bin_dir / "kube-scheduler"), f"--config={cfg}", f"--secure-port={free_port()}",
        "--bind-address=127.0.0.1", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}", "--v=2"], work)


@pytest.fixture(scope="module")
def dra(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
        ) -> Iterator[Dra]:
    cp = control_plane
    work = tmp_path_factory.mktemp("dra")
    chart = render(("dra.enabled=true",))
    objects = [d for d in chart.docs
               if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "dra"]
    assert {d["kind"] for d in objects} == {
        "DeviceClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet"}
    # the DaemonSet is the real cluster's `vgpud dra`; here the tests run it themselves
    objects = [d for d in objects if d["kind"] != "DaemonSet"]
    for doc in objects:  # the real API server validates the chart's classes here
        cp.admin.apply(doc, manager="helm")
    cp.start_controller_manager("resourceclaim-controller,garbage-collector-controller")
    scheduler = _kube_scheduler(cp, work).start()
    cp.procs.append(scheduler)
    try:
        with start_blocking_portal() as portal:
            yield Dra(cp, scheduler, portal, work)
    finally:
        scheduler.stop()
        cp.procs.remove(scheduler)
        for doc in objects:
            if doc["kind"] in ("DeviceClass", "ValidatingAdmissionPolicyBinding",
                               "ValidatingAdmissionPolicy"):
                cp.admin.delete(doc["kind"], doc["metadata"]["name"])


class Node:
    """A fake GPU node: its Node object and the publisher of its slices, running in the
    portal's event loop until :meth:`close`."""

    def __init__(self, dra: Dra, scenario: Scenario, name: str, gpus: int, memory: int,
                 split: int = 10, core_scaling: float = 1.0) -> None:
        self.dra, self.name = dra, f"{scenario.id}-{name}"
        scenario.cp.add_node(self.name, labels={TEST_LABEL: scenario.id,
                                                NODE_MODE_LABEL: "dra"})
        scenario.nodes.append(self.name)
        found = tuple(DeviceInfo(Gpu(f"GPU-{self.name}-{i}", i, "NVIDIA A16", memory, numa=0),
                                 minor=i) for i in range(gpus))
        self.devices: NodeDevices = dra.portal.call(lambda: NodeDevices(
            found, split=split, memory_scaling=1.0, core_scaling=core_scaling))
        self.token = dra.driver_token(self.name)
        kc = kubeconfig(dra.work / f"{self.name}.kubeconfig", dra.cp.server, dra.cp.pki.ca,
                        token=self.token, user=f"system:serviceaccount:{NAMESPACE}:{DRA_ACCOUNT}")
        self._stack = contextlib.ExitStack()
        self._stack.callback(dra.cp.admin.delete, "Pod", f"{self.name}-dra", NAMESPACE,
                             grace=0)
        client = self._stack.enter_context(dra.portal.wrap_async_context_manager(
            KubeClient.connect(kc)))
        publisher: SlicePublisher
        self.task, publisher = dra.portal.start_task(
            partial(run_publisher, client, self.name, self.devices, recheck=2.0))
        self.publisher = publisher

    def slices(self) -> list[Obj]:
        return self.dra.cp.admin.list(
            "ResourceSlice", fieldSelector=f"spec.nodeName={self.name},spec.driver={DRIVER}")

    def set_health(self, index: int, healthy: bool) -> None:
        self.dra.portal.call(self.devices.apply, HealthEvent(
            f"GPU-{self.name}-{index}", healthy, "set by the test"))

    def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            self.task.result(timeout=10)
        self._stack.close()


@pytest.fixture
def node_factory(dra: Dra, scenario: Scenario) -> Iterator[Any]:
    made: list[Node] = []

    def make(name: str = "a", gpus: int = 2, memory: int = 16384, **kw: Any) -> Node:
        n = Node(dra, scenario, name, gpus, memory, **kw)
        made.append(n)
        return n
    try:
        yield make
    finally:
        for n in made:
            n.close()


def _template(scenario: Scenario, name: str, requests: dict[str, str]) -> str:
    scenario.admin.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": scenario.ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
            "deviceClassName": VGPU_CLASS, "capacity": {"requests": requests}}}]}}}})
    return name


def _pod(scenario: Scenario, name: str, template: str,
         env: dict[str, str] | None = None) -> Obj:
    """A pod of one container ``main`` (with ``env``) using a claim made from
    ``template``, for kube-scheduler to place on a node of the scenario."""
    return scenario.admin.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": scenario.ns},
        "spec": {"schedulerName": SCHEDULER, "nodeSelector": {TEST_LABEL: scenario.id},
                 "terminationGracePeriodSeconds": 0,
                 # where a real kubelet starts it (test_dra_end_to_end): nothing to mount
                 "automountServiceAccountToken": False, "enableServiceLinks": False,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                 "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                 "env": [{"name": k, "value": v}
                                         for k, v in (env or {}).items()],
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})


@dataclass(frozen=True)
class Allocated:
    node: str
    device: str
    share_id: str
    consumed: dict[str, Fraction]


def _allocated(scenario: Scenario, dra: Dra, pod: str, timeout: float = 60) -> Allocated:
    """Wait until ``pod`` is bound and its claim allocated; what the claim got."""
    def done() -> Allocated | None:
        p = scenario.get(pod)
        statuses = p.get("status", {}).get("resourceClaimStatuses") or []
        if not p["spec"].get("nodeName") or not statuses:
            return None
        claim = scenario.admin.get("ResourceClaim", statuses[0]["resourceClaimName"],
                                   scenario.ns)
        alloc = (claim.get("status") or {}).get("allocation")
        if not alloc:
            return None
        (r,) = alloc["devices"]["results"]
        assert r["driver"] == DRIVER and r["pool"] == p["spec"]["nodeName"], r
        return Allocated(p["spec"]["nodeName"], r["device"], r.get("shareID", ""),
                         {k: value_of(v) for k, v in (r.get("consumedCapacity") or {}).items()})
    got: Allocated = wait_for(f"pod {pod} bound with its claim allocated", done,
                              timeout=timeout,
                              detail=lambda: scenario.describe(pod) + "\n" + dra.tails())
    return got


def _unschedulable(scenario: Scenario, dra: Dra, pod: str, timeout: float = 60) -> str:
    """Wait for kube-scheduler to mark ``pod`` unschedulable; its message."""
    def refused() -> str | None:
        p = scenario.get(pod)
        assert not p["spec"].get("nodeName"), f"{pod} was bound to {p['spec']['nodeName']}"
        for c in p.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                assert c["reason"] == "Unschedulable", c
                return str(c["message"])
        return None
    got: str = wait_for(f"pod {pod} to be found unschedulable", refused, timeout=timeout,
                        detail=lambda: scenario.describe(pod) + "\n" + dra.tails())
    return got


def test_the_publisher_writes_slices_the_real_api_server_accepts(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    node = node_factory("a", gpus=2, memory=16384)
    (s,) = wait_for("the node's ResourceSlice", lambda: node.slices() or None,
                    detail=dra.tails)
    spec = s["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == node.name
    assert spec["pool"] == {"name": node.name, "generation": 1, "resourceSliceCount": 1}
    (owner,) = s["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", node.name, True)
    (d0, d1) = spec["devices"]
    assert (d0["name"], d1["name"]) == ("gpu-0", "gpu-1")
    assert d0["allowMultipleAllocations"] is True
    assert value_of(d0["capacity"]["memory"]["value"]) == 16 * GIB
    policy = d0["capacity"]["memory"]["requestPolicy"]
    assert value_of(policy["validRange"]["step"]) == 1 << 20
    # the API holds what the inventory says: a round finds nothing to write
    assert not dra.portal.call(node.publisher.sync, node.devices.inventory())
    assert node.publisher.writes == 1


def test_claims_share_a_gpu_by_consumable_capacity_and_a_too_large_one_stays_pending(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    node = node_factory("a", gpus=2, memory=16384)
    wait_for("the node's ResourceSlice", lambda: node.slices() or None, detail=dra.tails)
    small = _template(scenario, "small", {"memory": "4Gi", "cores": "30"})
    first = _allocated(scenario, dra, _pod(scenario, "one", small)["metadata"]["name"])
    second = _allocated(scenario, dra, _pod(scenario, "two", small)["metadata"]["name"])
    assert first.node == second.node == node.name
    assert first.device == second.device, (first, second)  # two shares of one GPU
    assert first.share_id and second.share_id and first.share_id != second.share_id
    for a in (first, second):
        assert a.consumed == {"memory": 4 * GIB, "cores": 30, "vgpus": 1}, a
    # 10 GiB does not fit beside 8 GiB on a 16 GiB GPU: the next one
    big = _template(scenario, "big", {"memory": "10Gi"})
    third = _allocated(scenario, dra, _pod(scenario, "three", big)["metadata"]["name"])
    assert third.node == node.name and third.device != first.device
    # the policy's defaults fill what the claim leaves out: no cores asked, 0 %
    assert third.consumed == {"memory": 10 * GIB, "cores": 0, "vgpus": 1}, third
    # larger than any GPU: kube-scheduler says why, and the pod waits
    huge = _template(scenario, "huge", {"memory": "20Gi"})
    message = _unschedulable(scenario, dra, _pod(scenario, "huge", huge)["metadata"]["name"])
    assert "cannot allocate all claims" in message, message


def test_the_request_policy_rounds_and_bounds_what_a_claim_consumes(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    """vgpud's rules as kube-scheduler applies them: memory in whole MiB (rounded up), a
    claim's cores at most 100 % even where scaling gives the GPU more, ``split`` claims a
    GPU at most (each takes one of its ``vgpus``)."""
    node = node_factory("a", gpus=1, memory=16384, split=2, core_scaling=2.0)
    wait_for("the node's ResourceSlice", lambda: node.slices() or None, detail=dra.tails)
    odd = _template(scenario, "odd", {"memory": "1500Ki", "cores": "100"})
    a = _allocated(scenario, dra, _pod(scenario, "odd", odd)["metadata"]["name"])
    assert a.consumed == {"memory": 2 << 20, "cores": 100, "vgpus": 1}, a
    greedy = _template(scenario, "greedy", {"memory": "1Gi", "cores": "150"})
    message = _unschedulable(scenario, dra, _pod(scenario, "greedy", greedy)["metadata"][
        "name"])
    assert "cannot allocate all claims" in message, message
    # 200 % of cores: a second 100 % claim fits beside the first ...
    b = _allocated(scenario, dra, _pod(scenario, "second", odd)["metadata"]["name"])
    assert b.device == a.device
    # ... but not a third claim of any size: the split (2) is taken
    tiny = _template(scenario, "tiny", {"memory": "1Mi"})
    message = _unschedulable(scenario, dra, _pod(scenario, "third", tiny)["metadata"]["name"])
    assert "cannot allocate all claims" in message, message


def test_an_unhealthy_gpu_is_tainted_and_takes_no_new_claims(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    node = node_factory("a", gpus=2, memory=16384)
    wait_for("the node's ResourceSlice", lambda: node.slices() or None, detail=dra.tails)
    node.set_health(0, False)

    def tainted() -> Obj | None:
        (s,) = node.slices()
        return s if s["spec"]["pool"]["generation"] == 2 else None
    s = wait_for("the slice republished with the taint", tainted, detail=dra.tails)
    d0 = s["spec"]["devices"][0]
    (taint,) = d0["taints"]
    assert (taint["key"], taint["effect"]) == (TAINT_UNHEALTHY, "NoSchedule")
    assert taint.get("timeAdded")  # the API server stamps it
    big = _template(scenario, "big", {"memory": "10Gi"})
    a = _allocated(scenario, dra, _pod(scenario, "first", big)["metadata"]["name"])
    assert a.device == "gpu-1"  # not the tainted one, though it is first
    message = _unschedulable(scenario, dra, _pod(scenario, "second", big)["metadata"]["name"])
    assert "cannot allocate all claims" in message, message
    # healthy again: the taint goes (generation 3) and the waiting pod gets gpu-0
    node.set_health(0, True)
    b = _allocated(scenario, dra, "second", timeout=90)
    assert b.device == "gpu-0"


def test_slices_deleted_behind_the_publishers_back_come_back_and_go_with_the_node(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    node = node_factory("a", gpus=1, memory=16384)
    (s,) = wait_for("the node's ResourceSlice", lambda: node.slices() or None,
                    detail=dra.tails)
    dra.cp.admin.delete("ResourceSlice", s["metadata"]["name"])
    (again,) = wait_for("the slice published again after a recheck",
                        lambda: node.slices() or None, timeout=30, detail=dra.tails)
    assert again["metadata"]["uid"] != s["metadata"]["uid"]
    node.close()  # the plugin is gone; the Node goes, and its slices with it (owner)
    dra.cp.admin.delete("Node", node.name)
    wait_for("the Node's slices to be garbage-collected", lambda: not node.slices() or None,
             timeout=60, detail=dra.tails)


def test_the_driver_of_one_node_writes_no_other_nodes_slices(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    """The chart's scope policy on the real API server: RBAC lets the DRA role write every
    ResourceSlice; the node-name claim of its pod-bound token narrows it to its node's."""
    cp = dra.cp
    mine, other = node_factory("mine", gpus=1), node_factory("other", gpus=1)
    (theirs,) = wait_for("the other node's slice", lambda: other.slices() or None,
                         detail=dra.tails)
    api = cp.admin.as_token(mine.token)
    forged = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": f"{other.name}-forged"},
              "spec": {"driver": DRIVER, "nodeName": other.name,
                       "pool": {"name": other.name, "generation": 9,
                                "resourceSliceCount": 1}, "devices": []}}
    _, start = cp.audit()

    def refused(call: Any, says: str) -> None:
        try:
            call()
        except ApiError as e:
            assert e.code == 403 and says in e.message, e
            return
        raise AssertionError(f"allowed: {call}")

    def in_force() -> bool:  # the policy reaches admission a moment after it is stored
        try:
            api.create(forged)
        except ApiError as e:
            return e.code == 403
        api.delete("ResourceSlice", forged["metadata"]["name"])
        return False
    wait_for("the DRA scope policy to take effect", in_force, timeout=30)
    refused(lambda: api.create(forged), f"writes only the {DRIVER} ResourceSlices of that node")
    refused(lambda: api.delete("ResourceSlice", theirs["metadata"]["name"]),
            f"of node {other.name}")
    refused(lambda: api.create(forged | {"spec": {**forged["spec"], "nodeName": mine.name,
                                                   "driver": "gpu.example.com",
                                                   "pool": {**forged["spec"]["pool"],
                                                            "name": mine.name}}}),
            "writes only")
    unbound = cp.as_service_account(NAMESPACE, DRA_ACCOUNT)
    refused(lambda: unbound.create(forged | {"spec": {**forged["spec"],
                                                       "nodeName": mine.name}}),
            "names no node")
    cp.audit_forget(start)  # these refusals were the test's own doing
    cp.admin.delete("ResourceSlice", forged["metadata"]["name"])  # if the probe made one
    assert theirs["metadata"]["uid"] in {s["metadata"]["uid"] for s in other.slices()}


def test_a_class_serving_the_vgpu_count_gives_count_only_pods_a_gpu_and_strands_the_others(
        dra: Dra, scenario: Scenario, node_factory: Any) -> None:
    """KEP-5004 as kube-scheduler 1.37 does it, and why the chart leaves
    ``dra.extendedResourceName`` empty: once a class serves ``nvidia.com/vgpu-number``,
    a pod asking it gets a DRA device where no node advertises the count, but a pod that
    also asks ``nvidia.com/vgpu-memory`` (no node's allocatable has it: the extender counts
    it) fits no node at all, device-plugin nodes included."""
    cp = dra.cp
    dp = f"{scenario.id}-dp"  # a device-plugin node: the count in allocatable
    cp.add_node(dp, labels={TEST_LABEL: scenario.id},
                allocatable={"nvidia.com/vgpu-number": "20"})
    scenario.nodes.append(dp)
    node = node_factory("a", gpus=1, memory=16384)
    wait_for("the node's ResourceSlice", lambda: node.slices() or None, detail=dra.tails)

    def pod(name: str, limits: dict[str, str], where: str | None = None) -> str:
        spec: Obj = {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {TEST_LABEL: scenario.id, **(
                         {"kubernetes.io/hostname": where} if where else {})},
                     "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                     "resources": {"limits": limits}}]}
        scenario.admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": scenario.ns}, "spec": spec})
        return name
    shared = {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "4000"}
    before = scenario.wait_bound(pod("before", shared))
    assert before["spec"]["nodeName"] == dp
    cls = f"{scenario.id}.vgpud.io"
    cp.admin.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                     "metadata": {"name": cls}, "spec": {
                         "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                         "extendedResourceName": "nvidia.com/vgpu-number"}})
    scenario.cluster_objects.append(("DeviceClass", cls))
    # the count alone, on the DRA node: a claim made by kube-scheduler, the defaults consumed
    counted = scenario.wait_bound(pod("counted", {"nvidia.com/vgpu-number": "1"},
                                      where=node.name), detail=dra.tails)
    assert counted["spec"]["nodeName"] == node.name
    status = wait_for("the pod's extended resource claim", lambda: scenario.get("counted")[
        "status"].get("extendedResourceClaimStatus"), detail=dra.tails)
    claim = scenario.admin.get("ResourceClaim", status["resourceClaimName"], scenario.ns)
    (r,) = claim["status"]["allocation"]["devices"]["results"]
    assert r["device"] == "gpu-0"
    assert {k: value_of(v) for k, v in r["consumedCapacity"].items()} == {
        "memory": 16 * GIB, "cores": 0, "vgpus": 1}
    # the count and the memory: no node will do, not even the device-plugin node
    message = _unschedulable(scenario, dra, pod("after", shared))
    assert "cannot fit resource" in message, message


def test_every_kind_of_device_vgpud_publishes_passes_the_api_servers_validation(
        dra: Dra, scenario: Scenario) -> None:
    """The real API server is the judge of what core/slices builds beyond the plain GPUs
    above: MIG instances shared and whole, NVLink groups, the backend's facts, settings'
    defaults and scalings, a tainted device (server-side dry run; the judge has teeth: a
    default off the policy's step is refused)."""
    gpus = (Gpu("GPU-0", 0, "NVIDIA A100-SXM4-80GB", 81920, links=("GPU-1",)),
            Gpu("GPU-1", 1, "NVIDIA A100-SXM4-80GB", 81920, links=("GPU-0",), healthy=False),
            Gpu("GPU-2", 2, "NVIDIA A100-SXM4-80GB", 81920, mig=True),
            Gpu("MIG-a", 2, "NVIDIA A100-SXM4-80GB", 9856, split=3, parent="GPU-2",
                instance="13-0"),
            Gpu("MIG-b", 2, "NVIDIA A100-SXM4-80GB", 19968, split=1, profile="2g.20gb",
                parent="GPU-2", instance="5-0"),
            Gpu("GPU-3", 3, "Tesla T4", 15360, numa=-1))
    inv = NodeInventory(gpus, memory_scaling=1.5, core_scaling=2.0)
    devs = devices(inv, Defaults(default_mem=3000, default_cores=25),
                   facts={"GPU-0": GpuFacts("00000000:3B:00.0", 108, "8.0")},
                   driver=DriverFacts("535.104.05", "12.2"))
    node = f"{scenario.id}-rich"
    (s,) = pool(node, devs, 1)
    body = s.manifest()
    got = dra.cp.admin.create(body, dryRun="All")
    assert [d["name"] for d in got["spec"]["devices"]] == [
        "gpu-0", "gpu-1", "gpu-2-mig-13-0", "gpu-2-mig-5-0", "gpu-3"]
    assert "taints" in got["spec"]["devices"][1]
    bad = json.loads(json.dumps(body))
    bad["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] = str(
        3 * (1 << 19))
    with pytest.raises(ApiError) as refused:
        dra.cp.admin.create(bad, dryRun="All")
    assert refused.value.code == 422 and "multiple of a given step" in refused.value.message, (
        refused.value)
