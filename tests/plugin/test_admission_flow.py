"""Webhook → scheduler → bind → Allocate/PreStartContainer → limits file, each step by
the real role (tests/plugin/flow.py)."""

from __future__ import annotations

import importlib.util
from typing import Any

import anyio
import pytest
import yaml

from tests.deploy.rendered import Manifests, cel_matches, load_render, match_condition
from tests.fakekubelet import FakePod
from tests.plugin.flow import Denied, control_plane
from tests.plugin.harness import NODE, node_harness
from vgpud.config import parse_settings
from vgpud.core.codec import ASSIGNMENT, decode_assignment
from vgpud.core.limits import parse
from vgpud.core.requests import parse_quantity
from vgpud.node.allocations import AllocationStore

pytestmark = pytest.mark.anyio


def limits_file(state_dir: Any, ids: list[str]) -> str:
    return (AllocationStore(state_dir).path(ids) / "etc" / "config").read_text()


async def test_a_pod_pinned_by_node_name_gets_its_gpus_assigned() -> None:
    async with node_harness(2) as h, control_plane(h) as cp:
        inv = await h.published_inventory()
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "pinned", "namespace": "default"},
               "spec": {"nodeName": NODE, "containers": [
                   {"name": "main", "image": "cuda",
                    "resources": {"limits": {"nvidia.com/vgpu-memory": "3000"}}}]}}
        created = await cp.create(pod)
        spec = created["spec"]
        assert "nodeName" not in spec and spec["schedulerName"] == "vgpu-scheduler"
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/vgpu-number"] == "1"
        outcome = await cp.schedule(created, [NODE])
        assert outcome.node == NODE, outcome
        placed = decode_assignment(h.api.get("pods", "pinned")["metadata"]["annotations"][
            ASSIGNMENT])
        grant = placed.container("main")
        assert grant is not None and [d.memory for d in grant.devices] == [3000]

        def admit() -> Any:
            a = h.kubelet.admit(FakePod("default", "pinned", [("main", 1)]))
            h.kubelet.start(a)
            return a

        admitted = await anyio.to_thread.run_sync(admit)
        limits = parse(limits_file(h.state_dir, admitted.ids["main"]))
        (dev,) = limits.devices
        assert dev.uuid == grant.devices[0].uuid and dev.memory_limit == 3000 << 20
        assert dev.uuid in {g.uuid for g in inv.devices}


async def test_the_webhook_refuses_what_no_gpu_of_the_cluster_can_hold() -> None:
    async with node_harness(2, memory=24576) as h, control_plane(h) as cp:
        await h.published_inventory()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
               "spec": {"containers": [{"name": "main", "resources": {"limits": {
                   "nvidia.com/vgpu-memory": "30000"}}}]}}
        with anyio.fail_after(10):
            while True:  # the webhook learns the node from its annotation
                try:
                    await cp.create(pod)
                except Denied as e:
                    assert "'main'" in str(e) and "24576 MiB" in str(e)
                    break
                h.api.delete("pods", "huge")
                await anyio.sleep(0.05)
        assert h.api.get("pods", "huge") is None


@pytest.mark.parametrize(("preset", "limits", "annotations", "number", "memory", "cores"), [
    ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
     {"nvidia.com/use-gputype": "Fake", "hami.io/gpu-scheduler-policy": "spread"},
     "nvidia.com/gpu", 3000, 30),
    ("volcano", {"volcano.sh/vgpu-memory": 3000, "volcano.sh/vgpu-cores": 30}, {},
     "volcano.sh/vgpu-number", 3000, 30),
    ("tke", {"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 12}, {},
     "tencent.com/vcuda-core", 12 * 256, 30),
    # a share of the memory only: a GPU pod all the same (the webhook adds the count)
    ("volcano", {"volcano.sh/vgpu-memory-percentage": 50}, {},
     "volcano.sh/vgpu-number", 24576 // 2, 0),
], ids=["hami", "volcano", "tke", "volcano-percentage-only"])
async def test_another_systems_pod_goes_through_every_role_under_its_preset(
        preset: str, limits: dict[str, int], annotations: dict[str, str], number: str,
        memory: int, cores: int) -> None:
    await goes_through_every_role({"resourcePreset": preset}, limits, annotations, number,
                                  memory, cores)


async def goes_through_every_role(
        settings: dict[str, Any], limits: dict[str, int], annotations: dict[str, str],
        number: str, memory: int, cores: int) -> None:
    """A pod asking ``limits`` is admitted by the webhook, placed and bound by the
    extender, allocated and started by kubelet on the plugin's ``number`` resource: its
    limits file grants ``memory`` MiB and ``cores`` %."""
    numbers = list(dict.fromkeys(p.number for p in parse_settings(settings).presets()))
    assert number == numbers[0]  # the configured preset's: the pod speaks it
    async with node_harness(2, settings=settings, resources=numbers) as h, \
            control_plane(h) as cp:
        await h.published_inventory()
        assert h.kubelet.registered() == set(numbers)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "migrated", "namespace": "default",
                            "annotations": annotations},
               "spec": {"containers": [{"name": "main", "image": "cuda",
                                        "resources": {"limits": dict(limits)}}]}}
        created = await cp.create(pod)
        assert created["spec"]["schedulerName"] == "vgpu-scheduler"
        asked = {k: parse_quantity(v, k) for k, v in created["spec"]["containers"][0][
            "resources"]["limits"].items()}  # as the API server stores them: "3000" is "3k"
        assert number in asked  # the webhook added the count where the preset has one
        outcome = await cp.schedule(created, [NODE])
        assert outcome.node == NODE, outcome
        placed = decode_assignment(h.assignment("migrated"))
        grant = placed.container("main")
        assert grant is not None
        assert [(d.memory, d.cores) for d in grant.devices] == [(memory, cores)]

        def admit() -> Any:
            return h.kubelet.run(FakePod("default", "migrated", [("main", asked)]))

        admitted = await anyio.to_thread.run_sync(admit)
        ids = admitted.held[("main", number)]
        path = AllocationStore(h.state_dir).path(ids, number) / "etc" / "config"
        (dev,) = parse(path.read_text()).devices
        assert (dev.uuid, dev.memory_limit, dev.core_limit) == (
            grant.devices[0].uuid, memory << 20, cores)


# -- names set in the chart -------------------------------------------------------------------

def chart_settings(*sets: str) -> tuple[dict[str, Any], list[str], str]:
    """The chart rendered with ``sets``: its settings file's preset keys (resourcePreset,
    compatPresets, resourceNames), kube-scheduler's managedResources and the mutating
    webhook's matchConditions expression."""
    render = load_render()
    try:
        helm = render.obtain_helm()
    except render.HelmUnavailable as e:
        pytest.skip(f"helm is not available: {e}")
    m = Manifests.parse(render.render(helm, sets, lint=False))
    doc = yaml.safe_load(m.configmap_file("vgpud-settings", "vgpud.yaml"))
    (ext,) = m.scheduler_config()["extenders"]
    (hook,) = m.of_kind("MutatingWebhookConfiguration")
    keys = ("resourcePreset", "compatPresets", "resourceNames")
    return ({k: doc[k] for k in keys}, [r["name"] for r in ext["managedResources"]],
            match_condition(hook["webhooks"][0]))


@pytest.mark.parametrize(("sets", "limits", "annotations", "number", "memory", "cores"), [
    # seed 004: TKE's gpu-manager under Inspur's vendor domain
    (("config.resourcePreset=tke", "config.resourceNames.tke.domain=inspur.com"),
     {"inspur.com/vcuda-core": 50, "inspur.com/vcuda-memory": 30}, {},
     "inspur.com/vcuda-core", 30 * 256, 50),
    # HAMi's chart keys, each name moved
    (("config.resourcePreset=hami",
      "config.resourceNames.hami.resourceName=example.com/vgpu",
      "config.resourceNames.hami.resourceMem=example.com/vgpu-memory",
      "config.resourceNames.hami.resourceCores=example.com/vgpu-cores",
      "config.resourceNames.hami.resourceMemPercentage=example.com/vgpu-memory-share",
      "config.resourceNames.hami.resourcePriority=example.com/vgpu-priority"),
     {"example.com/vgpu": 1, "example.com/vgpu-memory": 3000, "example.com/vgpu-cores": 30},
     {"hami.io/gpu-scheduler-policy": "spread"}, "example.com/vgpu", 3000, 30),
    # Volcano under another domain, a percentage-only pod, beside the native preset
    (("config.resourcePreset=volcano", "config.compatPresets={vgpu-manager}",
      "config.resourceNames.volcano.domain=gpu.example.org"),
     {"gpu.example.org/vgpu-memory-percentage": 25}, {},
     "gpu.example.org/vgpu-number", 24576 // 4, 0),
    # VGPU-Manager's own names under a domain (its MustInitGlobalDomain)
    (("config.resourceNames.vgpu-manager.domain=corp.example",),
     {"corp.example/vgpu-memory": 2000, "corp.example/vgpu-cores": 20}, {},
     "corp.example/vgpu-number", 2000, 20),
], ids=["tke-inspur", "hami-keys", "volcano-domain-percentage", "vgpu-manager-domain"])
async def test_a_peers_pod_under_names_set_in_the_chart_goes_through_every_role(
        sets: tuple[str, ...], limits: dict[str, int], annotations: dict[str, str],
        number: str, memory: int, cores: int) -> None:
    settings, managed, expression = chart_settings(*sets)
    pod = {"spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}
    assert set(limits) <= set(managed)  # kube-scheduler sends the pod to the extender
    if importlib.util.find_spec("celpy") is not None:
        assert cel_matches(expression, pod)  # the API server sends it to the webhook
    await goes_through_every_role(settings, limits, annotations, number, memory, cores)


async def test_the_names_a_setting_replaced_are_not_read() -> None:
    """With TKE's domain moved, a pod in tencent.com/vcuda-* is no GPU pod: the webhook
    leaves it to the default scheduler, and the extender would pass it through."""
    settings = {"resourcePreset": "tke", "resourceNames": {"tke": {"domain": "inspur.com"}}}
    async with node_harness(2, settings=settings, resources=["inspur.com/vcuda-core"]) as h, \
            control_plane(h) as cp:
        assert h.kubelet.registered() == {"inspur.com/vcuda-core"}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "old-names", "namespace": "default"},
               "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {
                   "limits": {"tencent.com/vcuda-core": "50"}}}]}}
        created = await cp.create(pod)
        assert created["spec"].get("schedulerName") != "vgpu-scheduler"
        assert created["spec"]["containers"][0]["resources"]["limits"] == {
            "tencent.com/vcuda-core": "50"}
        ours = {**pod, "metadata": {"name": "new-names", "namespace": "default"}}
        ours["spec"] = {"containers": [{"name": "main", "image": "cuda", "resources": {
            "limits": {"inspur.com/vcuda-core": "50"}}}]}
        assert (await cp.create(ours))["spec"]["schedulerName"] == "vgpu-scheduler"
