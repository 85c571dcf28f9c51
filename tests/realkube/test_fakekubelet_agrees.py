"""The fake kubelet (``tests/fakekubelet``) drives vgpud's plugin as the real kubelet 1.37
does, for a pod of every kind of GPU container: a sidecar ``side`` (a restartable init
container), a regular init container ``prep`` and an app container ``main`` asking for two
vGPUs.

The pod is placed by the real scheduler and runs on the real kubelet (the fake runtime;
the test ends ``prep`` as its program would, through the runtime); then the same pod with
the same assignment runs through the fake kubelet and the same plugin code
(``tests/plugin``'s harness, the same devices and settings). What the plugin was asked
and what it decided must agree, as far as the real kubelet shows it:

- which calls, in which order, for which container (the real kubelet's own log at
  ``--v=4``; the fake's record);
- Allocate's IDs for each container (the same log): ``main`` gets ``prep``'s ID and one
  more, ``side`` one of its own;
- GetPreferredAllocation's arguments as the plugin logged them: the size, the IDs to
  include (``prep``'s, for ``main``) and how many were available;
- the limits each container was created with (PreStartContainer's outcome: the file
  kubelet mounted into each recorded container) and the final assignment;
- what PodResources ``List`` shows: ``side`` and ``main`` with their IDs, never ``prep``.

Each side is compared to the other, and the real side to what kubelet's source says.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.node.conftest import built  # noqa: F401 (fixture)
from tests.plugin.harness import NODE, node_harness
from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario, assignment
from tests.realkube.controlplane import ControlPlane
from tests.realkube.kubelet import VGPU, Kubelet, NodePlugin, fake_devices
from tests.realkube.release import Release
from vgpud.core.codec import ASSIGNMENT, decode_assignment, encode_assignment
from vgpud.core.limits import parse
from vgpud.core.model import Placement
from vgpud.node.allocations import AllocationStore
from vgpud.node.podresources import PodResourcesClient

MEMORY = "nvidia.com/vgpu-memory"
GPUS, GPU_MIB = 2, 24576
Spec = list[tuple[str, bool, bool, int, int]]  # (container, init, sidecar, vGPUs, MiB)
CONTAINERS: Spec = [("side", True, True, 1, 1000), ("prep", True, False, 1, 1500),
                    ("main", False, False, 2, 2000)]
GPA, ALLOCATE, PRESTART = "GetPreferredAllocation", "Allocate", "PreStartContainer"
# what kubelet's source says it does with this pod (dm/manager.go, topologymanager scope)
CALLS = [(GPA, "side"), (ALLOCATE, "side"), (GPA, "prep"), (ALLOCATE, "prep"),
         (GPA, "main"), (ALLOCATE, "main"),
         (PRESTART, "side"), (PRESTART, "prep"), (PRESTART, "main")]


@dataclass
class Seen:
    """What the plugin was asked and what it decided, for the one pod."""

    calls: list[tuple[str, str]]  # (rpc, container), in order
    allocated: dict[str, frozenset[str]]  # Allocate's IDs by container
    preferred: list[tuple[int, tuple[str, ...], int]]  # (size, must include, available)
    limits: dict[str, Any]  # the limits each container was created with, parsed
    listed: dict[str, frozenset[str]]  # PodResources List: container -> IDs
    placement: Placement  # the assignment at the end (node left out)


@pytest.fixture
def node(control_plane: ControlPlane, release: Release, scenario: Scenario,
         built: None, request: pytest.FixtureRequest,  # noqa: F811
         ) -> Iterator[tuple[Kubelet, NodePlugin]]:
    """A real kubelet with two fake GPUs served by ``vgpud plugin`` (its top-level
    settings over the chart's from the test's ``indirect`` parameter)."""
    kubelet = Kubelet(control_plane, f"{scenario.id}-node", {TEST_LABEL: scenario.id})
    plugin: NodePlugin | None = None
    try:
        kubelet.start()
        plugin = NodePlugin(release, kubelet, gpus=GPUS, memory=GPU_MIB,
                            config=getattr(request, "param", {}))
        plugin.start()
        yield kubelet, plugin
    finally:
        if plugin is not None:
            plugin.stop()
        kubelet.close()


def the_pod(scenario: Scenario, containers: Spec) -> Obj:
    def container(name: str, sidecar: bool, n: int, mib: int) -> Obj:
        c: Obj = {"name": name, "image": "registry.invalid/cuda:12",
                  "resources": {"limits": {VGPU: str(n), MEMORY: str(mib)}}}
        if sidecar:
            c["restartPolicy"] = "Always"
        return c

    pod = scenario.pod("job", containers=[container(n, s, k, m)
                                          for n, i, s, k, m in containers if not i])
    pod["spec"]["initContainers"] = [container(n, s, k, m) for n, i, s, k, m in containers if i]
    pod["spec"]["automountServiceAccountToken"] = False
    pod["spec"]["enableServiceLinks"] = False
    return pod


def state(pod: Obj, container: str) -> str:
    status = pod.get("status") or {}
    for c in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []):
        if c["name"] == container:
            return str(next(iter(c.get("state") or {"none": {}})))
    return "none"


def limits_of(config: Path) -> Any:
    got = parse(config.read_text())
    return (got.container, got.priority, got.devices)


def without_node(p: Placement) -> Placement:
    return dataclasses.replace(p, node="")


# -- the real kubelet ------------------------------------------------------------------------


def real_calls(log: str, pod: Obj) -> tuple[list[tuple[str, str]], dict[str, frozenset[str]]]:
    """The device manager's calls for ``pod`` from the kubelet's log (klog text, --v=4):
    ``Issuing a GetPreferredAllocation call`` / ``Making allocation request for device
    plugin`` (with the devices) / ``Issuing a PreStartContainer call``."""
    uid = pod["metadata"]["uid"]
    key = f'pod="{pod["metadata"]["namespace"]}/{pod["metadata"]["name"]}"'
    calls: list[tuple[str, str]] = []
    allocated: dict[str, frozenset[str]] = {}
    for line in log.splitlines():
        name = re.search(r'containerName="([^"]+)"', line)
        if name is None:
            continue
        if "Issuing a GetPreferredAllocation call" in line and uid in line:
            calls.append((GPA, name[1]))
        elif "Making allocation request for device plugin" in line and key in line:
            calls.append((ALLOCATE, name[1]))
            devices = re.search(r"devices=\[([^\]]*)\]", line)
            assert devices is not None, line
            allocated[name[1]] = frozenset(re.findall(r'"([^"]+)"', devices[1]))
        elif "Issuing a PreStartContainer call" in line and uid in line:
            calls.append((PRESTART, name[1]))
    return calls, allocated


def real_preferred(log: str) -> list[tuple[int, tuple[str, ...], int]]:
    """GetPreferredAllocation's arguments as the plugin logged them (debug level)."""
    out = []
    for line in log.splitlines():
        if " preferred " not in line:
            continue
        size, available = re.search(r"\bsize=(\d+)", line), re.search(r"\bavailable=(\d+)", line)
        must = re.search(r"\bmust_include=(\[[^\]]*\])", line)
        assert size and available and must, line
        out.append((int(size[1]), tuple(ast.literal_eval(must[1])), int(available[1])))
    return out


def on_the_real_kubelet(scenario: Scenario, kubelet: Kubelet, plugin: NodePlugin,
                        containers: Spec) -> tuple[Seen, Obj]:
    def tails() -> str:
        return scenario.describe("job") + "\n" + plugin.tails()

    def running(*names: str) -> Obj | None:
        pod = scenario.get("job")
        return pod if all(state(pod, c) == "running" for c in names) else None

    scenario.apply(the_pod(scenario, containers))
    for name, init, sidecar, *_ in containers:
        if init and not sidecar:  # its program ends: kubelet goes on with the next
            pod: Obj = wait_for(f"{name} to run", partial(running, name), timeout=90,
                                detail=tails)
            (req,) = kubelet.created_for(pod["metadata"]["uid"], name)
            kubelet.end_container(req)
    pod = wait_for("the app containers to run", lambda: running(
        *(n for n, i, *_ in containers if not i)), timeout=90, detail=tails)
    uid = pod["metadata"]["uid"]
    calls, allocated = real_calls(kubelet.log(), pod)
    store = AllocationStore(plugin.state_dir)
    limits = {}
    for name, *_ in containers:
        (req,) = kubelet.created_for(uid, name)
        (etc,) = [m["host_path"] for m in req["config"]["mounts"]
                  if m["container_path"] == "/etc/vgpud"]
        limits[name] = limits_of(Path(etc) / "config")
        assert Path(etc).parent in {a.dir for a in store.all()}, etc
    client = PodResourcesClient(str(kubelet.pod_resources_socket), VGPU)
    listed = {h.container: h.ids for h in anyio.run(client.list) if h.pod == "job"}
    return Seen(calls, allocated, real_preferred(plugin.log()), limits, listed,
                without_node(assignment(pod))), pod


# -- the fake kubelet ------------------------------------------------------------------------


async def on_the_fake_kubelet(real: Obj, settings: dict[str, Any], containers: Spec) -> Seen:
    """The same pod, with the assignment the real scheduler gave it, on the plugin
    harness's node."""
    placed = decode_assignment(real["metadata"]["annotations"][ASSIGNMENT])
    here = dataclasses.replace(placed, node=NODE)

    def spec(c: Obj) -> Obj:
        return {k: v for k, v in c.items() if k in ("name", "image", "resources",
                                                    "restartPolicy")}

    async with node_harness(GPUS, settings=settings, devices=fake_devices(
            GPUS, GPU_MIB)["devices"]) as h:
        h.api.create("pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "job", "namespace": "default",
                         "annotations": {ASSIGNMENT: encode_assignment(here)}},
            "spec": {"nodeName": NODE, "schedulerName": "vgpu-scheduler",
                     "initContainers": [spec(c) for c in real["spec"].get("initContainers",
                                                                          [])],
                     "containers": [spec(c) for c in real["spec"]["containers"]]},
            "status": {"phase": "Pending"}}, "default")
        pod = FakePod("default", "job", [(n, k) for n, _i, _s, k, _m in containers],
                      init=frozenset(n for n, i, *_ in containers if i),
                      sidecars=frozenset(n for n, _i, s, *_ in containers if s))
        await h.kubelet_call(h.kubelet.run, pod)
        calls = [c for c in h.kubelet.calls if c.pod == "default/job"]
        store = AllocationStore(h.state_dir)
        limits = {c.container: limits_of(store.path(list(c.ids)) / "etc" / "config")
                  for c in calls if c.rpc == PRESTART}
        client = PodResourcesClient(str(h.kubelet.podres_socket), VGPU)
        listed = {x.container: x.ids for x in await client.list() if x.pod == "job"}
        return Seen([(c.rpc, c.container) for c in calls],
                    {c.container: frozenset(c.ids) for c in calls if c.rpc == ALLOCATE},
                    [(c.size, tuple(sorted(c.must_include)), len(c.available))
                     for c in calls if c.rpc == GPA], limits, listed,
                    without_node(decode_assignment(h.assignment("job"))))


def test_the_fake_kubelet_drives_the_plugin_as_the_real_one_does(
        node: tuple[Kubelet, NodePlugin], release: Release, scenario: Scenario) -> None:
    kubelet, plugin = node
    real, pod = on_the_real_kubelet(scenario, kubelet, plugin, CONTAINERS)

    # the real kubelet, as its source says
    assert real.calls == CALLS, real.calls
    side, prep, main = (real.allocated[c] for c in ("side", "prep", "main"))
    assert len(side) == len(prep) == 1 and len(main) == 2
    assert prep < main and not side & main  # main reuses prep's ID; side does not
    assert [(size, must) for size, must, _ in real.preferred] == [
        (1, ()), (1, ()), (2, tuple(prep))]
    total = GPUS * 10
    assert [n for *_, n in real.preferred] == [total, total - 1, total - 1]  # 18 free + prep's
    assert real.listed == {"side": side, "main": main}  # prep is never listed
    assert {c: lim[0] for c, lim in real.limits.items()} == {c: c for c in real.limits}

    agree(real, anyio.run(on_the_fake_kubelet, pod, release.settings(), CONTAINERS))


def agree(real: Seen, fake: Seen) -> None:
    for what in ("calls", "allocated", "preferred", "limits", "listed", "placement"):
        assert getattr(fake, what) == getattr(real, what), (
            f"{what}: the fake kubelet {getattr(fake, what)}, the real one "
            f"{getattr(real, what)}")


ONE_EACH = {"deviceSplitCount": 1}  # one vGPU per GPU: two on the node


@pytest.mark.parametrize("node", [ONE_EACH], ids=["split-1"], indirect=True)
def test_the_preference_is_asked_for_even_when_there_is_no_choice(
        node: tuple[Kubelet, NodePlugin], release: Release, scenario: Scenario) -> None:
    """Every vGPU of the node asked for: kubelet still calls GetPreferredAllocation (the
    topology manager's ``none`` policy gives it no NUMA hint, and only an aligned set is
    checked for "more than needed", devicemanager ``devicesToAllocate``)."""
    kubelet, plugin = node
    whole: Spec = [("main", False, False, 2, 1000)]
    real, pod = on_the_real_kubelet(scenario, kubelet, plugin, whole)
    assert real.calls == [(GPA, "main"), (ALLOCATE, "main"), (PRESTART, "main")]
    assert real.preferred == [(2, (), 2)]
    agree(real, anyio.run(on_the_fake_kubelet, pod, {**release.settings(), **ONE_EACH},
                          whole))


def test_a_plugin_serving_its_socket_anew_is_registered_again(
        node: tuple[Kubelet, NodePlugin], scenario: Scenario) -> None:
    """Its socket deleted under the running kubelet, the plugin serves it anew and
    registers again: the real kubelet accepts that only once it has seen the old
    connection's stream end (``PluginConnected``: "device plugin already connected"), as
    the fake does (tests/plugin/test_plugin.py)."""
    kubelet, plugin = node
    (sock,) = kubelet.device_plugin_dir.glob("vgpud-*.sock")
    sock.unlink()
    wait_for("the plugin to register again", lambda: re.search(
        r"\bregistered\b.*\btimes=2\b", plugin.log()), timeout=60, detail=plugin.tails)
    plugin.proc.check_alive()
    assert "already connected" not in plugin.log() + kubelet.log()
    kubelet.wait_allocatable(str(GPUS * 10), detail=plugin.tails)
    real, _ = on_the_real_kubelet(scenario, kubelet, plugin, [("main", False, False, 1, 1000)])
    assert real.calls == [(GPA, "main"), (ALLOCATE, "main"), (PRESTART, "main")]
