"""The fake kubelet: grpcio servers and clients in threads, driven synchronously.

What it does, as kubelet's device manager does:

- ``Registration.Register`` (on ``<plugin_dir>/kubelet.sock``) records the request,
  then dials ``<plugin_dir>/<endpoint>`` and follows ``ListAndWatch`` in a thread,
  keeping the latest device list.
- :meth:`FakeKubelet.admit` admits one pod (serially, like kubelet's pod admission):
  the pod becomes *active* (PodResources lists it, its containers with no devices
  yet); for each container asking for the resource, in order (init containers
  first), it takes the healthy, unallocated IDs, asks ``GetPreferredAllocation``
  when the plugin offers it, takes the preference (or lets ``choose`` override it),
  calls ``Allocate`` and records the IDs (PodResources now shows them).
- :meth:`FakeKubelet.start` calls ``PreStartContainer`` for each container, as kubelet
  does just before creating it.
- :meth:`FakeKubelet.restart` stops the Registration server, deletes every socket in
  the plugin directory and serves ``kubelet.sock`` anew (allocations survive, as in
  kubelet's checkpoint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.fakekubelet.protos import load

dp, dp_grpc, pr, pr_grpc = load()

Chooser = Callable[[str, list[str], list[str], int], list[str]]


class AdmitError(Exception):
    """kubelet could not admit or start a container; ``str()`` is the plugin's message."""

    def __init__(self, container: str, phase: str, code: Any, message: str) -> None:
        super().__init__(f"{phase} failed for container {container!r}: {code}: {message}")
        self.container, self.phase, self.code, self.message = container, phase, code, message


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[tuple[str, int]]  # (name, vgpu-number); init containers first
    init: frozenset[str] = frozenset()


@dataclass
class Admitted:
    pod: FakePod
    ids: dict[str, list[str]] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)


class _Registration(dp_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        self.kubelet._on_register(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def _pod(self, a: Admitted) -> Any:
        containers = []
        for name, _n in a.pod.containers:
            devs = []
            if a.ids.get(name):
                devs.append(pr.ContainerDevices(resource_name=self.kubelet.resource,
                                                device_ids=a.ids[name]))
            containers.append(pr.ContainerResources(name=name, devices=devs))
        return pr.PodResources(name=a.pod.name, namespace=a.pod.namespace, containers=containers)

    def List(self, request: Any, context: Any) -> Any:
        with self.kubelet._lock:
            pods = [self._pod(a) for a in self.kubelet.active.values()]
        self.kubelet.podresources_calls += 1
        return pr.ListPodResourcesResponse(pod_resources=pods)

    def Get(self, request: Any, context: Any) -> Any:
        with self.kubelet._lock:
            a = self.kubelet.active.get((request.pod_namespace, request.pod_name))
            if a is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
            return pr.GetPodResourcesResponse(pod_resources=self._pod(a))

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        ids = [d for d, h in self.kubelet.devices().items() if h == "Healthy"]
        return pr.AllocatableResourcesResponse(devices=[pr.ContainerDevices(
            resource_name=self.kubelet.resource, device_ids=ids)])


class FakeKubelet:
    def __init__(self, root: Path, resource: str = "nvidia.com/vgpu-number") -> None:
        self.resource = resource
        self.plugin_dir = root / "device-plugins"
        self.podres_socket = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.podres_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registrations: list[Any] = []
        self.active: dict[tuple[str, str], Admitted] = {}
        self.podresources_calls = 0
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._admit_lock = threading.Lock()
        self._devices: dict[str, str] = {}
        self._topology: dict[str, list[int]] = {}
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._options: Any = None
        self._reg_server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self._watch: threading.Thread | None = None
        self.list_and_watch_updates = 0

    # -- servers ---------------------------------------------------------------------------

    def _serve_registration(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._reg_server = server

    def start_servers(self) -> None:
        self._serve_registration()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.podres_socket}")
        server.start()
        self._pr_server = server

    def stop(self) -> None:
        if self._reg_server is not None:
            self._reg_server.stop(None)
        if self._pr_server is not None:
            self._pr_server.stop(None)
        self._close_plugin()

    def _close_plugin(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._watch is not None:
            self._watch.join(timeout=5)
            self._watch = None

    def restart(self) -> None:
        """kubelet restarts: new kubelet.sock, plugin sockets removed, allocations kept."""
        if self._reg_server is not None:
            self._reg_server.stop(None)
        self._close_plugin()
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()
        with self._lock:
            self._devices = {}
        self._serve_registration()

    def __enter__(self) -> FakeKubelet:
        self.start_servers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- registration and ListAndWatch -----------------------------------------------------

    def _on_register(self, request: Any) -> None:
        if request.version != "v1beta1" or request.resource_name != self.resource:
            raise ValueError(f"unexpected registration {request}")
        with self._cond:
            self.registrations.append(request)
            self._options = request.options
            self._cond.notify_all()
        # kubelet dials the plugin after answering Register
        threading.Thread(target=self._connect, args=(request.endpoint,), daemon=True).start()

    def _connect(self, endpoint: str) -> None:
        self._close_plugin()
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channel = channel
        self._stub = dp_grpc.DevicePluginStub(channel)
        self._watch = threading.Thread(target=self._follow, args=(self._stub,), daemon=True)
        self._watch.start()

    def _follow(self, stub: Any) -> None:
        try:
            for reply in stub.ListAndWatch(dp.Empty()):
                with self._cond:
                    self._devices = {d.ID: d.health for d in reply.devices}
                    self._topology = {d.ID: [n.ID for n in d.topology.nodes]
                                      for d in reply.devices}
                    self.list_and_watch_updates += 1
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # the plugin went away or we closed the channel

    def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError("the fake kubelet waited in vain")

    def wait_registered(self, count: int = 1, timeout: float = 10.0) -> None:
        self.wait(lambda: len(self.registrations) >= count and bool(self._devices), timeout)

    def devices(self) -> dict[str, str]:
        with self._lock:
            return dict(self._devices)

    def topology(self) -> dict[str, list[int]]:
        with self._lock:
            return dict(self._topology)

    @property
    def stub(self) -> Any:
        return self._stub

    # -- pods ------------------------------------------------------------------------------

    def _free(self) -> list[str]:
        with self._lock:
            taken = {i for a in self.active.values() for ids in a.ids.values() for i in ids}
            return [d for d, h in self._devices.items() if h == "Healthy" and d not in taken]

    def admit(self, pod: FakePod, choose: Chooser | None = None) -> Admitted:
        """Allocate every container of ``pod``; the pod stays active even on failure."""
        with self._admit_lock:
            a = Admitted(pod)
            with self._lock:
                self.active[(pod.namespace, pod.name)] = a
            for name, n in pod.containers:
                if n <= 0:
                    continue
                free = self._free()
                if len(free) < n:
                    raise AdmitError(name, "admission", "OutOfvgpu", f"{len(free)} free, {n} asked")
                ids = free[:n]
                if self._options is not None and self._options.get_preferred_allocation_available:
                    req = dp.PreferredAllocationRequest(container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=free, must_include_deviceIDs=[],
                            allocation_size=n)])
                    got = list(self._stub.GetPreferredAllocation(req, timeout=10)
                               .container_responses[0].deviceIDs)
                    if len(got) == n and set(got) <= set(free):
                        ids = got
                if choose is not None:
                    ids = choose(name, free, ids, n)
                try:
                    resp = self._stub.Allocate(dp.AllocateRequest(container_requests=[
                        dp.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
                except grpc.RpcError as e:
                    raise AdmitError(name, "Allocate", e.code(), e.details() or "") from None
                with self._lock:
                    a.ids[name] = list(ids)
                    a.responses[name] = resp.container_responses[0]
            return a

    def start(self, a: Admitted, containers: Sequence[str] | None = None) -> None:
        """PreStartContainer for each (GPU) container, as kubelet does before creating it."""
        for name, n in a.pod.containers:
            if n <= 0 or (containers is not None and name not in containers):
                continue
            if self._options is None or not self._options.pre_start_required:
                continue
            try:
                self._stub.PreStartContainer(dp.PreStartContainerRequest(
                    devices_ids=a.ids[name]), timeout=30)
            except grpc.RpcError as e:
                raise AdmitError(name, "PreStartContainer", e.code(), e.details() or "") from None

    def run(self, pod: FakePod, choose: Chooser | None = None) -> Admitted:
        a = self.admit(pod, choose)
        self.start(a)
        return a

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self.active.pop((namespace, name), None)


def mount_of(response: Any, container_path: str) -> Any:
    for m in response.mounts:
        if m.container_path == container_path:
            return m
    return None


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(step)
