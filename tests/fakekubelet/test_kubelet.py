"""The fake kubelet against a stub device plugin (grpcio, in this process): what its
docstring says it imitates of kubelet 1.37, a test each. That the real kubelet drives
vgpud's plugin the same way is tests/realkube/test_fakekubelet_agrees.py."""

from __future__ import annotations

import queue
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.fakekubelet import kubelet as fk
from tests.fakekubelet.kubelet import (
    AdmitError,
    FakeKubelet,
    FakePod,
    dp,
    dp_grpc,
    pr,
    pr_grpc,
    wait_until,
)

R = "example.com/dev"
IDS = [f"d{i}" for i in range(6)]  # d0..d2 on NUMA node 0, d3..d5 on node 1
Prefer = Callable[[list[str], list[str], int], list[str]]


def numa(i: str) -> int:
    return 0 if int(i[1:]) < 3 else 1


class StubPlugin(dp_grpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
    """A device plugin that records every call and answers as told (by default it
    prefers the highest available IDs, so a preference taken is told from none)."""

    def __init__(self, directory: Path, name: str = "stub.sock", *, preferred: bool = True,
                 prestart: bool = True, prefer: Prefer | None = None) -> None:
        self.socket = directory / name
        self.options = dp.DevicePluginOptions(pre_start_required=prestart,
                                              get_preferred_allocation_available=preferred)
        self.prefer: Prefer = prefer or highest
        self.calls: list[tuple[str, Any]] = []
        self.fail_allocate = ""
        self.lists: queue.Queue[list[tuple[str, str]]] = queue.Queue()
        self.lists.put([(i, fk.HEALTHY) for i in IDS])
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self.options

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        while context.is_active():
            try:
                devs = self.lists.get(timeout=0.05)
            except queue.Empty:
                continue
            yield dp.ListAndWatchResponse(devices=[
                dp.Device(ID=i, health=h, topology=dp.TopologyInfo(nodes=[
                    dp.NUMANode(ID=numa(i))])) for i, h in devs])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        (c,) = request.container_requests
        args = (list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size)
        self.calls.append(("GetPreferredAllocation", args))
        return dp.PreferredAllocationResponse(container_responses=[
            dp.ContainerPreferredAllocationResponse(deviceIDs=self.prefer(*args))])

    def Allocate(self, request: Any, context: Any) -> Any:
        (c,) = request.container_requests
        self.calls.append(("Allocate", list(c.devices_ids)))
        if self.fail_allocate:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.fail_allocate)
        return dp.AllocateResponse(container_responses=[
            dp.ContainerAllocateResponse(envs={"IDS": ",".join(c.devices_ids)})])

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        self.calls.append(("PreStartContainer", list(request.devices_ids)))
        return dp.PreStartContainerResponse()


def highest(available: list[str], must: list[str], size: int) -> list[str]:
    """``must``, and then the highest other available IDs up to ``size``."""
    others = sorted(set(available) - set(must))
    return [*others[len(others) - (size - len(must)):], *must] if size > len(must) else must


def register(k: FakeKubelet, socket: str, options: Any) -> None:
    with grpc.insecure_channel(f"unix://{k.plugin_dir / 'kubelet.sock'}") as ch:
        dp_grpc.RegistrationStub(ch).Register(dp.RegisterRequest(
            version="v1beta1", endpoint=socket, resource_name=R, options=options), timeout=30)


def listed(k: FakeKubelet) -> list[Any]:
    with grpc.insecure_channel(f"unix://{k.podres_socket}") as ch:
        return list(pr_grpc.PodResourcesListerStub(ch).List(
            pr.ListPodResourcesRequest(), timeout=10).pod_resources)


def held(k: FakeKubelet) -> dict[tuple[str, str], list[str]]:
    """(pod, container) -> the IDs PodResources lists for it, for every listed container."""
    return {(p.name, c.name): [i for d in c.devices for i in d.device_ids]
            for p in listed(k) for c in p.containers}


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fk", dir="/tmp"))  # unix socket paths stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def statuses() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def kubelet(root: Path, statuses: list[tuple[str, dict[str, Any]]]) -> Iterator[FakeKubelet]:
    with FakeKubelet(root, R, report=lambda ns, pod, s: statuses.append((pod, s))) as k:
        yield k


def serve(k: FakeKubelet, **kw: Any) -> StubPlugin:
    p = StubPlugin(k.plugin_dir, **kw)
    register(k, p.socket.name, p.options)
    k.wait_registered(len(k.registrations_of(R)))
    return p


@pytest.fixture
def plugin(kubelet: FakeKubelet) -> Iterator[StubPlugin]:
    p = serve(kubelet)
    yield p
    p.stop()


# a regular GPU init container between a GPU sidecar and a GPU app container
JOB = FakePod("ns", "job", [("side", 1), ("prep", 1), ("main", 2)], init=frozenset({"prep"}),
              sidecars=frozenset({"side"}))


def test_registration_dials_the_plugin_first_and_takes_its_own_options(
        kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch) -> None:
    # the request says "prefer" and "prestart"; GetDevicePluginOptions says neither
    p = StubPlugin(kubelet.plugin_dir, preferred=False, prestart=False)
    register(kubelet, p.socket.name, dp.DevicePluginOptions(
        pre_start_required=True, get_preferred_allocation_available=True))
    kubelet.wait_registered()
    kubelet.run(FakePod("ns", "a", [("main", 1)]))
    assert p.names() == ["Allocate"]
    # nothing serves this socket: kubelet cannot dial it, so it refuses the registration
    monkeypatch.setattr(fk, "DIAL_SECONDS", 0.5)
    with pytest.raises(grpc.RpcError) as e:
        register(kubelet, "nobody.sock", dp.DevicePluginOptions())
    assert "failed to dial device plugin" in (e.value.details() or "")
    assert len(kubelet.registrations) == 1
    p.stop()


def test_a_socket_still_connected_is_refused_a_second_registration(
        kubelet: FakeKubelet, plugin: StubPlugin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fk, "GRACE_SECONDS", 0.2)
    with pytest.raises(grpc.RpcError) as e:
        register(kubelet, plugin.socket.name, plugin.options)
    assert "device plugin already connected" in (e.value.details() or "")
    # a second plugin on another socket is called from now on; both stay connected
    other = serve(kubelet, name="other.sock")
    kubelet.run(FakePod("ns", "a", [("main", 1)]))
    assert other.names() == ["GetPreferredAllocation", "Allocate", "PreStartContainer"]
    assert plugin.names() == []
    # when it leaves, the first is called again, and the devices stay healthy
    other.stop()
    wait_until(lambda: kubelet.plugin_socket(R) == str(plugin.socket))
    assert set(kubelet.devices(R).values()) == {fk.HEALTHY}
    kubelet.run(FakePod("ns", "b", [("main", 1)]))
    assert plugin.names() == ["GetPreferredAllocation", "Allocate", "PreStartContainer"]


def test_health_allocatable_and_the_last_plugin_leaving(kubelet: FakeKubelet,
                                                        plugin: StubPlugin) -> None:
    assert (kubelet.allocatable(R), kubelet.capacity(R)) == (6, 6)
    plugin.lists.put([(i, fk.UNHEALTHY if i == "d0" else fk.HEALTHY) for i in IDS])
    wait_until(lambda: kubelet.allocatable(R) == 5)
    assert kubelet.capacity(R) == 6
    a = kubelet.admit(FakePod("ns", "a", [("main", 5)]))
    assert "d0" not in a.ids["main"]
    ((_, (available, _must, _size)),) = [c for c in plugin.calls if c[0] != "Allocate"]
    assert "d0" not in available
    kubelet.remove("ns", "a")
    # its last plugin gone, the resource is all unhealthy: allocatable 0, capacity kept
    plugin.stop()
    wait_until(lambda: kubelet.allocatable(R) == 0)
    assert kubelet.capacity(R) == 6 and R not in kubelet.registered()
    assert set(kubelet.devices(R).values()) == {fk.UNHEALTHY}
    with pytest.raises(AdmitError) as e:
        kubelet.admit(FakePod("ns", "late", [("main", 1)]))
    assert e.value.phase == "Allocate" and "no healthy devices present" in e.value.message


def test_init_containers_reuse_and_the_preferences_arguments(
        kubelet: FakeKubelet, plugin: StubPlugin) -> None:
    a = kubelet.admit(JOB)
    # admission: init containers first, each container its own Allocate; main reuses
    # prep's ID and asks the plugin only for the rest, with prep's ID to be included
    assert plugin.calls == [
        ("GetPreferredAllocation", (IDS, [], 1)), ("Allocate", ["d5"]),
        ("GetPreferredAllocation", (IDS[:5], [], 1)), ("Allocate", ["d4"]),
        ("GetPreferredAllocation", ([*IDS[:4], "d4"], ["d4"], 2)), ("Allocate", ["d4", "d3"]),
    ]
    assert a.held == {("side", R): ["d5"], ("prep", R): ["d4"], ("main", R): ["d4", "d3"]}
    # PodResources: the sidecar and the app container, the regular init container never;
    # one ContainerDevices per device, with its NUMA node
    assert held(kubelet) == {("job", "side"): ["d5"], ("job", "main"): ["d4", "d3"]}
    (pod,) = listed(kubelet)
    assert [c.name for c in pod.containers] == ["side", "main"]
    main = pod.containers[1]
    assert [(list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in main.devices] == [
        (["d4"], [1]), (["d3"], [1])]
    # containers start in kubelet's order, each with its IDs, the reused included
    kubelet.start(a)
    assert plugin.calls[6:] == [("PreStartContainer", ["d5"]), ("PreStartContainer", ["d4"]),
                                ("PreStartContainer", ["d4", "d3"])]
    assert [(c.rpc, c.container) for c in kubelet.calls] == [
        ("GetPreferredAllocation", "side"), ("Allocate", "side"),
        ("GetPreferredAllocation", "prep"), ("Allocate", "prep"),
        ("GetPreferredAllocation", "main"), ("Allocate", "main"),
        ("PreStartContainer", "side"), ("PreStartContainer", "prep"),
        ("PreStartContainer", "main")]
    # a restart: PreStartContainer again, no Allocate
    kubelet.start(a, ["main"])
    assert plugin.calls[-1] == ("PreStartContainer", ["d4", "d3"]) and len(plugin.calls) == 10


def test_what_reuse_covers_is_allocated_again_without_a_preference(
        kubelet: FakeKubelet, plugin: StubPlugin) -> None:
    # a regular init container's IDs go to a sidecar declared after it, and to the app
    # container; what the sidecar took is no longer reusable
    pod = FakePod("ns", "p", [("prep", 2), ("side", 1), ("main", 1)],
                  init=frozenset({"prep", "side"}), sidecars=frozenset({"side"}))
    a = kubelet.admit(pod)
    assert plugin.calls == [("GetPreferredAllocation", (IDS, [], 2)), ("Allocate", ["d4", "d5"]),
                            ("Allocate", ["d4"]), ("Allocate", ["d5"])]
    assert a.held == {("prep", R): ["d4", "d5"], ("side", R): ["d4"], ("main", R): ["d5"]}
    assert held(kubelet) == {("p", "side"): ["d4"], ("p", "main"): ["d5"]}


def test_the_preference_is_asked_even_for_no_choice_and_taken_in_part(
        kubelet: FakeKubelet) -> None:
    plugin = serve(kubelet, prefer=lambda available, must, size: ["x9", "d2", "d2", "d1"])
    # an unknown ID and a repeated one in the answer are no error: the two preferred IDs
    # that are available are taken, the rest filled up (in the plugin's order)
    a = kubelet.admit(FakePod("ns", "a", [("main", 4)]))
    assert a.ids["main"] == ["d2", "d1", "d0", "d3"]
    # exactly as many available as needed: kubelet still asks (no NUMA hint under the
    # topology manager's "none" policy)
    b = kubelet.admit(FakePod("ns", "b", [("main", 2)]))
    assert plugin.calls[2] == ("GetPreferredAllocation", (["d4", "d5"], [], 2))
    assert b.ids["main"] == ["d4", "d5"]
    plugin.stop()


def test_a_rejected_pod_is_forgotten_and_its_devices_freed(
        kubelet: FakeKubelet, plugin: StubPlugin,
        statuses: list[tuple[str, dict[str, Any]]]) -> None:
    pod = FakePod("ns", "two", [("a", 2), ("b", 1)])
    plugin.fail_allocate = "no room"
    with pytest.raises(AdmitError) as e:
        kubelet.admit(pod)
    assert (e.value.phase, e.value.container, e.value.message) == ("Allocate", "a", "no room")
    assert listed(kubelet) == []
    assert statuses[-1] == ("two", {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                    "message": "Pod was rejected: Allocate failed due to rpc "
                                    "error: code = FailedPrecondition desc = no room, which is "
                                    "unexpected"})
    plugin.fail_allocate = ""
    # too few devices: the pod is rejected by kubelet itself, after its first container
    with pytest.raises(AdmitError) as e:
        kubelet.admit(FakePod("ns", "big", [("a", 4), ("b", 3)]))
    assert e.value.container == "b" and e.value.message == (
        f"requested number of devices unavailable for {R}. Requested: 3, Available: 2")
    # neither holds anything now: all six are free
    assert len(kubelet.admit(FakePod("ns", "all", [("main", 6)])).ids["main"]) == 6


def test_statuses_and_the_end_of_a_pod(kubelet: FakeKubelet, plugin: StubPlugin,
                                       statuses: list[tuple[str, dict[str, Any]]]) -> None:
    a = kubelet.admit(JOB)

    def states(status: dict[str, Any]) -> dict[str, str]:
        return {c["name"]: next(iter(c["state"])) for c in status["initContainerStatuses"]
                + status["containerStatuses"]}

    assert statuses[-1][1]["phase"] == "Pending"
    assert states(statuses[-1][1]) == {"side": "waiting", "prep": "waiting", "main": "waiting"}
    kubelet.start(a)
    # one status per container started, in kubelet's order
    assert [states(s) for _, s in statuses[1:]] == [
        {"side": "running", "prep": "waiting", "main": "waiting"},
        {"side": "running", "prep": "terminated", "main": "waiting"},
        {"side": "running", "prep": "terminated", "main": "running"}]
    assert statuses[-1][1]["phase"] == "Running"
    (prep,) = [c for c in statuses[-1][1]["initContainerStatuses"] if c["name"] == "prep"]
    assert prep["state"]["terminated"]["reason"] == "Completed"
    # the completed init container's ID stays with the pod (main holds it) until it ends
    kubelet.admit(FakePod("ns", "next", [("main", 3)]))
    kubelet.finish(a)
    assert statuses[-1][1]["phase"] == "Succeeded"
    assert [p.name for p in listed(kubelet)] == ["next"]
    assert len(kubelet.admit(FakePod("ns", "after", [("main", 3)])).ids["main"]) == 3


def test_allocatable_resources_and_a_restart(kubelet: FakeKubelet, plugin: StubPlugin) -> None:
    plugin.lists.put([(i, fk.UNHEALTHY if i == "d5" else fk.HEALTHY) for i in IDS])
    wait_until(lambda: kubelet.allocatable(R) == 5)
    with grpc.insecure_channel(f"unix://{kubelet.podres_socket}") as ch:
        got = pr_grpc.PodResourcesListerStub(ch).GetAllocatableResources(
            pr.AllocatableResourcesRequest(), timeout=10)
    assert [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
            for d in got.devices] == [(R, [i], [numa(i)]) for i in IDS[:5]]
    a = kubelet.run(FakePod("ns", "a", [("main", 1)]))
    kubelet.restart()
    # every socket gone but the new kubelet.sock; the allocation kept; no devices until
    # the plugin registers again
    assert sorted(p.name for p in kubelet.plugin_dir.glob("*.sock")) == ["kubelet.sock"]
    assert held(kubelet) == {("a", "main"): a.ids["main"]}
    assert kubelet.devices(R) == {} and kubelet.allocatable(R) == 0
    plugin.stop()
    again = serve(kubelet)
    assert kubelet.allocatable(R) == 6
    b = kubelet.admit(FakePod("ns", "b", [("main", 1)]))
    assert b.ids["main"] != a.ids["main"]
    again.stop()
