"""The fake kubelet: grpcio servers and clients in threads, driven synchronously.

What it does, as kubelet's device manager does:

- ``Registration.Register`` (on ``<plugin_dir>/kubelet.sock``) records the request,
  then dials ``<plugin_dir>/<endpoint>`` and follows ``ListAndWatch`` in a thread,
  keeping the latest device list *of that resource*. kubelet keeps one plugin per
  resource name: a second registration of a name replaces the first (its endpoint,
  options and device list); other names are untouched.
- :meth:`FakeKubelet.admit` admits one pod (serially, like kubelet's pod admission):
  the pod becomes *active* (PodResources lists it, its containers with no devices
  yet); for each container, in order (init containers first), and for each resource it
  asks for that a plugin registered (sorted by name), it takes that resource's healthy
  IDs no active container holds, asks ``GetPreferredAllocation`` when that plugin
  offers it, takes the preference (or lets ``choose`` override it), calls that plugin's
  ``Allocate`` and records the IDs (PodResources now lists them under the resource's
  name). A resource no plugin registered is ignored, as kubelet ignores extended
  resources no node advertises (``removeMissingExtendedResources``) and its device
  manager allocates only registered ones: a pod's ``nvidia.com/gpumem`` is the
  scheduler's business, not kubelet's.
- :meth:`FakeKubelet.start` calls ``PreStartContainer`` for each container and each of
  its resources, as kubelet does just before creating it.
- :meth:`FakeKubelet.restart` stops the Registration server, deletes every socket in
  the plugin directory and serves ``kubelet.sock`` anew (allocations survive, as in
  kubelet's checkpoint).

Its own API speaks of one *default* resource (``resource``, ``nvidia.com/vgpu-number``
unless told otherwise): a container given as ``(name, n)`` asks for ``n`` of it, and
:attr:`Admitted.ids` / :attr:`Admitted.responses` show each container's devices of its
one resource. ``(name, {resource: n, ...})`` asks for several; :attr:`Admitted.held`
and :attr:`Admitted.replies` are by ``(container, resource)``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.fakekubelet.protos import load

dp, dp_grpc, pr, pr_grpc = load()

Chooser = Callable[[str, list[str], list[str], int], list[str]]
DEFAULT_RESOURCE = "nvidia.com/vgpu-number"
# kubelet's v1helper.IsExtendedResourceName, roughly: a domain-prefixed name outside
# kubernetes.io
_EXTENDED = re.compile(r"^(?!(?:[^/]*\.)?kubernetes\.io/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class AdmitError(Exception):
    """kubelet could not admit or start a container; ``str()`` is the plugin's message."""

    def __init__(self, container: str, phase: str, code: Any, message: str) -> None:
        super().__init__(f"{phase} failed for container {container!r}: {code}: {message}")
        self.container, self.phase, self.code, self.message = container, phase, code, message


@dataclass
class FakePod:
    namespace: str
    name: str
    # (name, n of the kubelet's default resource) or (name, {resource: n});
    # init containers first
    containers: Sequence[tuple[str, int | Mapping[str, int]]]
    init: frozenset[str] = frozenset()


@dataclass
class Admitted:
    pod: FakePod
    resource: str = DEFAULT_RESOURCE  # the kubelet's default resource
    held: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (container, resource)
    replies: dict[tuple[str, str], Any] = field(default_factory=dict)  # Allocate's, likewise

    def _one(self, table: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
        """Per container, the value of its one resource (the default one if several)."""
        out: dict[str, Any] = {}
        for (container, resource), value in table.items():
            if container not in out or resource == self.resource:
                out[container] = value
        return out

    @property
    def ids(self) -> dict[str, list[str]]:
        return self._one(self.held)

    @property
    def responses(self) -> dict[str, Any]:
        return self._one(self.replies)


@dataclass
class _Endpoint:
    """One registered plugin: what kubelet's device manager keeps per resource name."""

    resource: str
    options: Any
    channel: grpc.Channel | None = None
    stub: Any = None
    watch: threading.Thread | None = None
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    topology: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    history: list[dict[str, str]] = field(default_factory=list)  # every ListAndWatch reply

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.watch is not None and self.watch is not threading.current_thread():
            self.watch.join(timeout=5)


class _Registration(dp_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        why = self.kubelet._on_register(request)
        if why:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def _pod(self, a: Admitted) -> Any:
        containers = []
        for name, _asks in a.pod.containers:
            devs = [pr.ContainerDevices(resource_name=resource, device_ids=ids)
                    for (c, resource), ids in sorted(a.held.items()) if c == name and ids]
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
        with self.kubelet._lock:
            by = {r: [d for d, h in e.devices.items() if h == "Healthy"]
                  for r, e in sorted(self.kubelet._endpoints.items())}
        return pr.AllocatableResourcesResponse(devices=[
            pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in by.items()])


class FakeKubelet:
    def __init__(self, root: Path, resource: str = DEFAULT_RESOURCE) -> None:
        self.resource = resource
        self.plugin_dir = root / "device-plugins"
        self.podres_socket = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.podres_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registrations: list[Any] = []  # every accepted Register request, in order
        self.active: dict[tuple[str, str], Admitted] = {}
        self.podresources_calls = 0
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._admit_lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}  # by resource name: the last registered
        self._reg_server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

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
        self._close_plugins()

    def _close_plugins(self) -> None:
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints = {}
        for e in endpoints:
            e.close()

    def restart(self) -> None:
        """kubelet restarts: new kubelet.sock, plugin sockets removed, allocations kept."""
        if self._reg_server is not None:
            self._reg_server.stop(None)
        self._close_plugins()
        # the plugins' sockets first, kubelet.sock last: a plugin that notices its socket
        # gone and serves it anew must not see the new one deleted too (it would then
        # register twice for one restart)
        kubelet = self.plugin_dir / "kubelet.sock"
        for sock in self.plugin_dir.glob("*.sock"):
            if sock != kubelet:
                sock.unlink(missing_ok=True)
        kubelet.unlink(missing_ok=True)
        self._serve_registration()

    def __enter__(self) -> FakeKubelet:
        self.start_servers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- registration and ListAndWatch -----------------------------------------------------

    def _on_register(self, request: Any) -> str:
        """Accept a registration (the empty string) or say why not."""
        if request.version != "v1beta1":
            return f"unsupported version {request.version!r}"
        if not _EXTENDED.match(request.resource_name):
            return f"{request.resource_name!r} is not an extended resource name"
        endpoint = _Endpoint(request.resource_name, request.options)
        with self._cond:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self.registrations.append(request)
            self._cond.notify_all()
        # kubelet dials the plugin after answering Register; the last plugin of a name wins
        threading.Thread(target=self._connect, args=(endpoint, request.endpoint, old),
                         daemon=True).start()
        return ""

    def _connect(self, e: _Endpoint, socket: str, old: _Endpoint | None) -> None:
        if old is not None:
            old.close()
        # a connection of its own, as kubelet dials each plugin anew: grpcio would otherwise
        # reuse a live connection of the same target from its global subchannel pool, one
        # to the plugin that registered before (in tests, a stopped plugin in this process)
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / socket}",
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        e.channel, e.stub = channel, dp_grpc.DevicePluginStub(channel)
        e.watch = threading.Thread(target=self._follow, args=(e,), daemon=True)
        e.watch.start()

    def _follow(self, e: _Endpoint) -> None:
        try:
            for reply in e.stub.ListAndWatch(dp.Empty()):
                with self._cond:
                    e.devices = {d.ID: d.health for d in reply.devices}
                    e.history.append(dict(e.devices))
                    e.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in reply.devices}
                    e.updates += 1
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # the plugin went away or we closed the channel

    def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError("the fake kubelet waited in vain")

    def registrations_of(self, resource: str | None = None) -> list[Any]:
        with self._lock:
            return [r for r in self.registrations
                    if r.resource_name == (resource or self.resource)]

    def wait_registered(self, count: int = 1, timeout: float = 10.0,
                        resources: Sequence[str] | None = None) -> None:
        """Until each of ``resources`` (the default one) was registered ``count`` times
        and its plugin has sent a device list."""
        names = list(resources or [self.resource])

        def done() -> bool:
            return all(len(self.registrations_of(r)) >= count and r in self._endpoints
                       and self._endpoints[r].updates > 0 for r in names)

        self.wait(done, timeout)

    def registered(self) -> set[str]:
        """The resource names a plugin is registered for now."""
        with self._lock:
            return set(self._endpoints)

    def _endpoint(self, resource: str | None) -> _Endpoint | None:
        with self._lock:
            return self._endpoints.get(resource or self.resource)

    def devices(self, resource: str | None = None) -> dict[str, str]:
        e = self._endpoint(resource)
        with self._lock:
            return {} if e is None else dict(e.devices)

    def topology(self, resource: str | None = None) -> dict[str, list[int]]:
        e = self._endpoint(resource)
        with self._lock:
            return {} if e is None else dict(e.topology)

    def device_history(self, resource: str | None = None) -> list[dict[str, str]]:
        """Every device list the plugin sent, oldest first (ID -> health)."""
        e = self._endpoint(resource)
        with self._lock:
            return [] if e is None else list(e.history)

    def list_and_watch_updates(self, resource: str | None = None) -> int:
        e = self._endpoint(resource)
        return 0 if e is None else e.updates

    def stub(self, resource: str | None = None) -> Any:
        e = self._endpoint(resource)
        return None if e is None else e.stub

    # -- pods ------------------------------------------------------------------------------

    def asks(self, pod: FakePod) -> list[tuple[str, str, int]]:
        """(container, resource, n) for every device-plugin resource the pod asks for, in
        the order kubelet allocates them; resources no plugin registered are left out."""
        out = []
        with self._lock:
            for name, wants in pod.containers:
                table = {self.resource: wants} if isinstance(wants, int) else dict(wants)
                out += [(name, r, n) for r, n in sorted(table.items())
                        if n > 0 and r in self._endpoints]
        return out

    def _free(self, resource: str) -> list[str]:
        with self._lock:
            e = self._endpoints.get(resource)
            taken = {i for a in self.active.values() for (_c, r), ids in a.held.items()
                     if r == resource for i in ids}
            return [] if e is None else [d for d, h in e.devices.items()
                                         if h == "Healthy" and d not in taken]

    def admit(self, pod: FakePod, choose: Chooser | None = None) -> Admitted:
        """Allocate every container of ``pod``; the pod stays active even on failure.

        ``choose(container, free, preferred, n)`` may override the IDs of any resource.
        """
        with self._admit_lock:
            a = Admitted(pod, self.resource)
            with self._lock:
                self.active[(pod.namespace, pod.name)] = a
            for name, resource, n in self.asks(pod):
                e = self._endpoint(resource)
                assert e is not None
                free = self._free(resource)
                if len(free) < n:
                    raise AdmitError(name, "admission", f"OutOf{resource}",
                                     f"{len(free)} free, {n} asked")
                ids = free[:n]
                if e.options is not None and e.options.get_preferred_allocation_available:
                    req = dp.PreferredAllocationRequest(container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=free, must_include_deviceIDs=[],
                            allocation_size=n)])
                    got = list(e.stub.GetPreferredAllocation(req, timeout=10)
                               .container_responses[0].deviceIDs)
                    if len(got) == n and set(got) <= set(free):
                        ids = got
                if choose is not None:
                    ids = choose(name, free, ids, n)
                try:
                    resp = e.stub.Allocate(dp.AllocateRequest(container_requests=[
                        dp.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
                except grpc.RpcError as err:
                    raise AdmitError(name, "Allocate", err.code(), err.details() or "") from None
                with self._lock:
                    a.held[(name, resource)] = list(ids)
                    a.replies[(name, resource)] = resp.container_responses[0]
            return a

    def start(self, a: Admitted, containers: Sequence[str] | None = None) -> None:
        """PreStartContainer for each (GPU) container and each of its resources, as
        kubelet does before creating it."""
        for (name, resource), ids in list(a.held.items()):
            if containers is not None and name not in containers:
                continue
            e = self._endpoint(resource)
            if e is None or e.options is None or not e.options.pre_start_required:
                continue
            try:
                e.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=ids),
                                         timeout=30)
            except grpc.RpcError as err:
                raise AdmitError(name, "PreStartContainer", err.code(),
                                 err.details() or "") from None

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
