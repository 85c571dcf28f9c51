"""The fake kubelet: grpcio servers and clients in threads, driven synchronously.

It plays the parts of kubelet 1.37 a device plugin talks to, and follows the real code
(``k8s.io/kubernetes@v1.37.2/pkg/kubelet``; ``cm/devicemanager/`` is shortened to ``dm/``)
in everything vgpud's plugin depends on. Checked against the real kubelet by
``tests/realkube/test_fakekubelet_agrees.py``.

**Registration** (``dm/plugin/v1beta1/server.go`` ``Register``, ``handler.go``
``connectClient``, ``client.go`` ``Connect``, ``dm/manager.go`` ``PluginConnected``):
``Register`` on ``<plugin_dir>/kubelet.sock`` checks the version (``v1beta1``) and that
the name is an extended resource name, then, *before it answers*, dials
``<plugin_dir>/<endpoint>`` (blocking, 10 s) and asks the plugin's
``GetDevicePluginOptions``: those options, not the request's, decide whether
GetPreferredAllocation and PreStartContainer are called. A plugin that does not serve
its socket yet, or whose socket path is still connected for that resource ("device plugin
already connected"), is refused. The last plugin to connect for a name is the one called;
an earlier one of another socket stays connected, and every ``ListAndWatch`` reply of
either replaces the resource's device list (``genericDeviceUpdateCallback``). When one of
them leaves while another is connected, another is called from then on (kubelet takes any
remaining one, the fake the latest) and the devices keep their health.

**Health, allocatable** (``genericDeviceUpdateCallback``, ``PluginDisconnected``,
``markResourceUnhealthy``, ``GetCapacity``): allocatable is the healthy devices, capacity
healthy plus unhealthy (:meth:`FakeKubelet.allocatable`, :meth:`FakeKubelet.capacity`).
When a resource's last plugin goes away (its ListAndWatch stream ends) every device of it
turns unhealthy: allocatable 0, capacity unchanged, and the resource is still one the
device manager allocates (so a pod asking for it is rejected: "no healthy devices").

**Admission** (``topologymanager/scope.go`` ``admitPolicyNone``; ``dm/manager.go``
``Allocate``, ``allocateContainerResources``, ``devicesToAllocate``): :meth:`admit`
makes the pod active (PodResources lists it from now on, its containers without devices
yet: ``podManager.AddPod`` precedes admission), then allocates its containers one by
one, init containers first in spec order, and in each its device-plugin resources:

- first from the pod's *reusable* devices: those of its regular (non-restartable) init
  containers allocated before (``devicesToReuse``). A regular init container adds its
  devices to them; a sidecar (restartable) or app container takes its own out. So an app
  container asking for as many as an init container had gets exactly that container's
  IDs, and a sidecar declared after it does too;
- only when devices are still needed after that: ``available`` = the healthy devices no
  active pod holds; too few fails the pod ("requested number of devices unavailable");
  then ``GetPreferredAllocation(available ∪ reused, must_include=reused,
  size=the container's whole request)`` when the plugin offers it. With the topology
  manager's default policy (``none``) there is no NUMA hint, so it is called even when
  exactly as many are available as needed. kubelet takes the preferred IDs that are
  available (never more than needed; an invalid or short answer is not an error) and
  fills up from the rest;
- ``Allocate`` with all the container's IDs, the reused included (a container whose
  whole request was reused is allocated again with the same IDs), one
  ``ContainerAllocateRequest`` per call.

A failure rejects the whole pod: status phase ``Failed`` with reason
``UnexpectedAdmissionError`` (``cm/admission/errors.go``); it is no longer active, so
PodResources forgets it and its devices are free again (``UpdateAllocatedDevices``).

**Starting containers** (``dm/manager.go`` ``GetDeviceRunContainerOptions``,
``callPreStartContainerIfNeeded``; ``kuberuntime_container.go`` ``startContainer``):
:meth:`start` starts them in kubelet's order: the init containers in spec order, each
regular one running to completion before the next starts, a sidecar running on; then the
app containers. Before creating a container, ``PreStartContainer`` (30 s timeout) with
its IDs of each of its resources whose plugin asked for it, reused IDs included, and
again at every later start of the container (a restart: no new ``Allocate``). A failure
fails only that container (``CreateContainerConfigError``); the pod stays active.

**IDs of finished containers**: they stay allocated while the pod is active (a completed
init container's IDs, a finished app container's); only when the pod is deleted
(:meth:`remove`) or ends (:meth:`finish`, phase ``Succeeded``/``Failed``) are they free.

**PodResources** (``apis/podresources/server_v1.go``; ``cm/container_manager.go``
``containerDevicesFromResourceDeviceInstances``): ``List`` returns the active pods
(``KubeletPodResourcesListUseActivePods``, on by default), in each the restartable init
containers in spec order and then the app containers; **regular init containers are left
out**. A container's devices come as one ``ContainerDevices`` per device and NUMA node
(with that node as its topology; a device without topology once, without). ``Get`` does
the same for one pod ("pod NAME in namespace NS not found" otherwise);
``GetAllocatableResources`` lists the healthy devices the same way.

**Pod status** (what the plugin reads back from the API): with ``report`` set, the fake
writes what kubelet's status manager would: after admission phase ``Pending`` and every
container waiting; a started container running, a regular init container, once done,
terminated with reason ``Completed``; ``Running`` once every app container runs; a
container whose PreStartContainer failed waiting with ``CreateContainerConfigError``; a
rejected pod ``Failed``.

**Restart** (:meth:`restart`; ``dm/manager.go`` ``CleanupPluginDirectory``,
``readCheckpoint``): every socket in the plugin directory is deleted and ``kubelet.sock``
served anew; allocations survive (the checkpoint); every resource is known with no devices
until its plugin registers again; the reusable devices of a pod are forgotten.

Deliberate differences, for reproducible tests:

- Go iterates sets and maps in random order; the fake keeps a fixed one: devices in the
  plugin's order, resources by name, pods in admission order, and the IDs it sends in the
  order it chose them (the reused first). kubelet's fill-up after a short preference is
  random; the fake takes the plugin's order. The plugin must not depend on any of it.
- kubelet's status manager writes the status some time after the fact; the fake reports
  each change at once (the plugin must also cope with a status that lags, which the fake
  does not show).
- ``choose(container, available, picked, needed)`` (a test's hook) may replace the IDs
  kubelet picks beyond the reused ones, as the topology manager's NUMA alignment could.
- kubelet sets no deadline on GetPreferredAllocation and Allocate; the fake gives each
  30 s, so that a test ends. Before it refuses a socket as "already connected" it gives
  its own thread up to 2 s to notice that the earlier connection closed (kubelet's
  goroutine notices at once; a thread of the fake may wait for the GIL).
- Not imitated: the topology manager's policies and NUMA alignment, the 5-minute grace
  after which a resource whose plugins left is dropped from capacity
  (``endpointStopGracePeriod``), the admission check of requests against the node's
  allocatable (``lifecycle/predicate.go``, run after the devices were allocated),
  ``allocatedResourcesStatus``
  in the pod status, kubelet's own retries and back-off, and re-admission after a restart.
  When it refuses a registration as "already connected" the real kubelet also forgets the
  earlier client of that socket, so that client's end is never noticed (its devices stay
  healthy, its endpoint is kept); the fake still notices it.

Its own API speaks of one *default* resource (``resource``, ``nvidia.com/vgpu-number``
unless told otherwise): a container given as ``(name, n)`` asks for ``n`` of it, and
:attr:`Admitted.ids` / :attr:`Admitted.responses` show each container's devices of its
one resource. ``(name, {resource: n, ...})`` asks for several; :attr:`Admitted.held`
and :attr:`Admitted.replies` are by ``(container, resource)``. Every call made to a
plugin is appended to :attr:`FakeKubelet.calls`.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.fakekubelet.protos import load

dp, dp_grpc, pr, pr_grpc = load()

# choose(container, available, picked, needed) -> the IDs to take instead of ``picked``
Chooser = Callable[[str, list[str], list[str], int], list[str]]
# report(namespace, pod, status): what kubelet's status manager writes
Reporter = Callable[[str, str, dict[str, Any]], None]
DEFAULT_RESOURCE = "nvidia.com/vgpu-number"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DIAL_SECONDS = 10  # dm/plugin/v1beta1/client.go dial
PRESTART_SECONDS = 30  # pluginapi.KubeletPreStartContainerRPCTimeoutInSecs
CALL_SECONDS = 30  # kubelet sets none on GetPreferredAllocation and Allocate; a test must end
GRACE_SECONDS = 2.0  # for the fake's own thread to notice a plugin's stream ended
REJECTED = "UnexpectedAdmissionError"  # cm/admission/errors.go
# kubelet's v1helper.IsExtendedResourceName, roughly: a domain-prefixed name outside
# kubernetes.io
_EXTENDED = re.compile(r"^(?!(?:[^/]*\.)?kubernetes\.io/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class AdmitError(Exception):
    """kubelet could not admit the pod (``phase`` ``Allocate``: it is rejected) or start a
    container (``PreStartContainer``: that container fails); ``message`` is the plugin's
    or kubelet's message."""

    def __init__(self, container: str, phase: str, code: Any, message: str) -> None:
        super().__init__(f"{phase} failed for container {container!r}: {code}: {message}")
        self.container, self.phase, self.code, self.message = container, phase, code, message


@dataclass
class FakePod:
    namespace: str
    name: str
    # (name, n of the kubelet's default resource) or (name, {resource: n})
    containers: Sequence[tuple[str, int | Mapping[str, int]]]
    # the init containers among them (spec order is their order in ``containers``; kubelet
    # takes init containers first wherever they are listed) ...
    init: frozenset[str] = frozenset()
    # ... and the restartable ones (``restartPolicy: Always``); a sidecar is an init
    # container even when ``init`` does not name it
    sidecars: frozenset[str] = frozenset()

    def is_init(self, container: str) -> bool:
        return container in self.init or container in self.sidecars

    def regular_init(self, container: str) -> bool:
        return container in self.init and container not in self.sidecars

    def spec_order(self) -> list[tuple[str, int | Mapping[str, int]]]:
        """``pod.Spec.InitContainers`` then ``pod.Spec.Containers``."""
        return ([c for c in self.containers if self.is_init(c[0])]
                + [c for c in self.containers if not self.is_init(c[0])])


@dataclass(frozen=True)
class Call:
    """One call kubelet made to a plugin."""

    rpc: str  # GetPreferredAllocation | Allocate | PreStartContainer
    pod: str  # namespace/name
    container: str
    resource: str
    ids: tuple[str, ...]  # sent (Allocate, PreStartContainer) or answered (preference)
    available: tuple[str, ...] = ()  # GetPreferredAllocation's arguments
    must_include: tuple[str, ...] = ()
    size: int = 0
    error: str = ""  # the gRPC status, when the call failed


@dataclass
class Admitted:
    pod: FakePod
    resource: str = DEFAULT_RESOURCE  # the kubelet's default resource
    held: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (container, resource)
    replies: dict[tuple[str, str], Any] = field(default_factory=dict)  # Allocate's, likewise
    # the NUMA nodes of each held device, as they were when it was allocated
    numa: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (resource, ID)
    phase: str = "Pending"
    # container -> its state as kubelet reports it: waiting | running | completed
    states: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # reason, message
    rejected: str = ""  # why admission failed

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
    """One connected plugin (``endpointImpl`` and its client)."""

    resource: str
    socket: str
    options: Any = None
    channel: grpc.Channel | None = None
    stub: Any = None
    watch: threading.Thread | None = None
    updates: int = 0
    history: list[dict[str, str]] = field(default_factory=list)  # every ListAndWatch reply
    stopped: bool = False  # the stream ended (``setStopTime``)
    dropped: bool = False  # kubelet closed it itself (stop, restart): nothing to notice

    def close(self) -> None:
        self.dropped = True
        if self.channel is not None:
            self.channel.close()
        if self.watch is not None and self.watch is not threading.current_thread():
            self.watch.join(timeout=5)


@dataclass
class _Resource:
    """What the device manager keeps per resource name."""

    name: str
    plugins: dict[str, _Endpoint] = field(default_factory=dict)  # endpointStore, by socket
    primary: _Endpoint | None = None  # endpoints[name]: the one called
    devices: dict[str, list[int]] = field(default_factory=dict)  # allDevices: ID -> NUMA nodes
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)

    def health(self) -> dict[str, str]:
        return {d: HEALTHY if d in self.healthy else UNHEALTHY for d in self.devices
                if d in self.healthy or d in self.unhealthy}


class _Registration(dp_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        why = self.kubelet._on_register(request)
        if why:
            # kubelet's errors are plain Go errors: gRPC status Unknown
            context.abort(grpc.StatusCode.UNKNOWN, why)
        return dp.Empty()


def _container_devices(resource: str, ids: Iterable[str],
                       numa: Callable[[str], list[int]]) -> list[Any]:
    """``containerDevicesFromResourceDeviceInstances``: one entry per device and node."""
    out = []
    for i in ids:
        nodes = numa(i)
        if not nodes:
            out.append(pr.ContainerDevices(resource_name=resource, device_ids=[i]))
        for n in nodes:
            out.append(pr.ContainerDevices(resource_name=resource, device_ids=[i],
                                           topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=n)])))
    return out


def _numa_of(table: Mapping[Any, list[int]], resource: str | None = None,
             ) -> Callable[[str], list[int]]:
    """A device's NUMA nodes from a table by ID (or by (resource, ID))."""
    return lambda i: list(table.get(i if resource is None else (resource, i), []))


class _PodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def _pod(self, a: Admitted) -> Any:
        containers = []
        for name, _asks in a.pod.spec_order():
            if a.pod.regular_init(name):
                continue  # server_v1.go: only restartable init containers are listed
            devs = [d for (c, resource), ids in sorted(a.held.items()) if c == name
                    for d in _container_devices(resource, ids, _numa_of(a.numa, resource))]
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
                context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace "
                                                       f"{request.pod_namespace} not found")
            assert a is not None  # abort raised
            return pr.GetPodResourcesResponse(pod_resources=self._pod(a))

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        with self.kubelet._lock:
            devs = [d for name, r in sorted(self.kubelet._resources.items())
                    for d in _container_devices(name, [i for i in r.devices if i in r.healthy],
                                                _numa_of(r.devices))]
        return pr.AllocatableResourcesResponse(devices=devs)


class FakeKubelet:
    def __init__(self, root: Path, resource: str = DEFAULT_RESOURCE,
                 report: Reporter | None = None) -> None:
        self.resource = resource
        self.report = report
        self.plugin_dir = root / "device-plugins"
        self.podres_socket = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.podres_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registrations: list[Any] = []  # every accepted Register request, in order
        self.active: dict[tuple[str, str], Admitted] = {}
        self.calls: list[Call] = []
        self.podresources_calls = 0
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._admit_lock = threading.Lock()
        self._resources: dict[str, _Resource] = {}
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
            endpoints = [e for r in self._resources.values() for e in r.plugins.values()]
            for r in self._resources.values():
                r.plugins.clear()
        for e in endpoints:
            e.close()

    def restart(self) -> None:
        """kubelet restarts: plugin sockets removed, ``kubelet.sock`` new, allocations kept,
        every resource known but without devices until its plugin registers again.
        (:meth:`go_down` and :meth:`come_up` do the same in two steps.)"""
        self._forget_plugins()
        # As the new kubelet does at its start (CleanupPluginDirectory, then Listen), with
        # no pause between: grpcio removes kubelet.sock when its server stops, and a plugin
        # that noticed that and served its socket anew must not see the new one deleted
        # (the real kubelet could not dial it). The plugins' sockets first, kubelet.sock
        # last.
        if self._reg_server is not None:
            self._reg_server.stop(None)
        kubelet = self.plugin_dir / "kubelet.sock"
        for sock in self.plugin_dir.glob("*.sock"):
            if sock != kubelet:
                sock.unlink(missing_ok=True)
        kubelet.unlink(missing_ok=True)
        self._serve_registration()

    def _forget_plugins(self) -> None:
        """The plugins' streams end; every resource stays known, without devices until its
        plugin registers again (readCheckpoint: a stopped endpoint each)."""
        self._close_plugins()
        with self._cond:
            for r in self._resources.values():
                r.primary, r.devices, r.healthy, r.unhealthy = None, {}, set(), set()
            self._cond.notify_all()

    def go_down(self) -> None:
        """The old kubelet stops: its streams end and ``kubelet.sock`` goes (grpcio removes
        it). Plugins may notice and serve their sockets anew before :meth:`come_up`."""
        self._forget_plugins()
        if self._reg_server is not None:
            self._reg_server.stop(None)
            self._reg_server = None

    def come_up(self) -> None:
        """The new kubelet starts: CleanupPluginDirectory removes every socket in the
        directory (a plugin's that was served anew too), then it listens."""
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink(missing_ok=True)
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
            return (f"requested device plugin API version {request.version!r} is not "
                    f"supported by kubelet. Supported versions are [v1beta1]")
        if not _EXTENDED.match(request.resource_name):
            return f"invalid name of device plugin socket: {request.resource_name!r} is not " \
                   f"an extended resource name"
        socket = str(self.plugin_dir / request.endpoint)
        # a connection of its own, as kubelet dials each plugin anew: grpcio would otherwise
        # reuse a live connection of the same target from its global subchannel pool, one
        # to the plugin that registered before (in tests, a stopped plugin in this process)
        channel = grpc.insecure_channel(f"unix://{socket}",
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        try:
            grpc.channel_ready_future(channel).result(timeout=DIAL_SECONDS)
        except grpc.FutureTimeoutError:
            channel.close()
            return f"failed to dial device plugin: context deadline exceeded ({socket})"
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=DIAL_SECONDS)
        except grpc.RpcError as err:
            channel.close()
            return f"failed to get device plugin options: {err.code()}: {err.details()}"
        e = _Endpoint(request.resource_name, socket, options, channel, stub)
        with self._cond:
            r = self._resources.setdefault(request.resource_name,
                                           _Resource(request.resource_name))
            old = r.plugins.get(socket)
            # kubelet's goroutine sees a closed plugin's stream end at once; the fake's
            # thread may need a moment (the GIL): a plugin that closed its server and
            # registers again on the same socket must not be refused for that
            if old is not None and not self._cond.wait_for(lambda: old.stopped, GRACE_SECONDS):
                channel.close()
                return f"device plugin already connected: {socket}"
            if socket in r.plugins:
                channel.close()
                return f"device plugin already connected: {socket}"
            r.plugins[socket] = e
            r.primary = e
            self.registrations.append(request)
            self._cond.notify_all()
        e.watch = threading.Thread(target=self._follow, args=(e,), daemon=True)
        e.watch.start()
        return ""

    def _follow(self, e: _Endpoint) -> None:
        try:
            for reply in e.stub.ListAndWatch(dp.Empty()):
                with self._cond:
                    if e.dropped:
                        return
                    r = self._resources[e.resource]
                    r.devices = {d.ID: [n.ID for n in d.topology.nodes] for d in reply.devices}
                    r.healthy = {d.ID for d in reply.devices if d.health == HEALTHY}
                    r.unhealthy = {d.ID for d in reply.devices if d.health != HEALTHY}
                    e.history.append({d.ID: d.health for d in reply.devices})
                    e.updates += 1
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # the plugin went away, or kubelet closed the channel
        with self._cond:
            if not e.dropped:
                self._disconnected(e)
            self._cond.notify_all()

    def _disconnected(self, e: _Endpoint) -> None:
        """``PluginDisconnected``: the last plugin of a resource leaves it all unhealthy;
        otherwise another one is called from now on."""
        e.stopped = True
        r = self._resources.get(e.resource)
        if r is None or r.plugins.get(e.socket) is not e:
            return
        del r.plugins[e.socket]
        if r.plugins:
            r.primary = list(r.plugins.values())[-1]
        else:
            r.unhealthy |= r.healthy
            r.healthy = set()

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
            return all(len(self.registrations_of(r)) >= count
                       and (e := self._endpoint(r)) is not None and not e.stopped
                       and e.updates > 0 for r in names)

        self.wait(done, timeout)

    def registered(self) -> set[str]:
        """The resource names a plugin is connected for now."""
        with self._lock:
            return {n for n, r in self._resources.items() if r.plugins}

    def _endpoint(self, resource: str | None) -> _Endpoint | None:
        with self._lock:
            r = self._resources.get(resource or self.resource)
            return None if r is None else r.primary

    def options(self, resource: str | None = None) -> Any:
        """Ask the connected plugin for its options again (``GetDevicePluginOptions``,
        answered from memory): the round trip a benchmark measures its calls against."""
        e = self._endpoint(resource)
        if e is None or e.stub is None:
            raise RuntimeError(f"no plugin connected for {resource or self.resource}")
        return e.stub.GetDevicePluginOptions(dp.Empty(), timeout=DIAL_SECONDS)

    def devices(self, resource: str | None = None) -> dict[str, str]:
        """The resource's devices, ID -> health, as the device manager sees them now."""
        with self._lock:
            r = self._resources.get(resource or self.resource)
            return {} if r is None else r.health()

    def allocatable(self, resource: str | None = None) -> int:
        with self._lock:
            r = self._resources.get(resource or self.resource)
            return 0 if r is None else len(r.healthy)

    def capacity(self, resource: str | None = None) -> int:
        with self._lock:
            r = self._resources.get(resource or self.resource)
            return 0 if r is None else len(r.healthy) + len(r.unhealthy)

    def topology(self, resource: str | None = None) -> dict[str, list[int]]:
        with self._lock:
            r = self._resources.get(resource or self.resource)
            return {} if r is None else dict(r.devices)

    def device_history(self, resource: str | None = None) -> list[dict[str, str]]:
        """Every device list the plugin called now sent, oldest first (ID -> health)."""
        e = self._endpoint(resource)
        with self._lock:
            return [] if e is None else list(e.history)

    def list_and_watch_updates(self, resource: str | None = None) -> int:
        e = self._endpoint(resource)
        return 0 if e is None else e.updates

    def stub(self, resource: str | None = None) -> Any:
        e = self._endpoint(resource)
        return None if e is None else e.stub

    def plugin_socket(self, resource: str | None = None) -> str | None:
        """The socket of the plugin kubelet calls for the resource now."""
        e = self._endpoint(resource)
        return None if e is None or e.stopped else e.socket

    # -- pods ------------------------------------------------------------------------------

    def _device_asks(self, wants: int | Mapping[str, int]) -> list[tuple[str, int]]:
        """(resource, n) of a container's limits the device manager allocates
        (``isDevicePluginResource``: a resource it knows, or has allocated before)."""
        table = {self.resource: wants} if isinstance(wants, int) else dict(wants)
        with self._lock:
            held = {r for a in self.active.values() for (_c, r) in a.held}
            return [(r, n) for r, n in sorted(table.items())
                    if n > 0 and (r in self._resources or r in held)]

    def asks(self, pod: FakePod) -> list[tuple[str, str, int]]:
        """(container, resource, n) for every device-plugin resource the pod asks for, in
        the order kubelet allocates them."""
        return [(name, r, n) for name, wants in pod.spec_order()
                for r, n in self._device_asks(wants)]

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def admit(self, pod: FakePod, choose: Chooser | None = None) -> Admitted:
        """Admit ``pod``: allocate every container's devices (see the module's docstring).

        On failure the pod is rejected (no longer active) and :class:`AdmitError` raised.
        """
        with self._admit_lock:
            a = Admitted(pod, self.resource)
            a.states = {name: "waiting" for name, _ in pod.spec_order()}
            with self._lock:
                self.active[(pod.namespace, pod.name)] = a
            reusable: dict[str, list[str]] = {}  # devicesToReuse: this pod's alone
            try:
                for name, wants in pod.spec_order():
                    for resource, n in self._device_asks(wants):
                        self._allocate(a, name, resource, n, reusable.get(resource, []),
                                       choose)
                    mine = {r: ids for (c, r), ids in a.held.items() if c == name}
                    for r, ids in mine.items():
                        if pod.regular_init(name):  # addContainerAllocatedResources
                            reusable[r] = list(dict.fromkeys([*reusable.get(r, []), *ids]))
                        else:  # removeContainerAllocatedResources
                            reusable[r] = [i for i in reusable.get(r, []) if i not in ids]
            except AdmitError as e:
                why = e.message if e.code == REJECTED else \
                    f"rpc error: code = {_go_code(e.code)} desc = {e.message}"
                with self._lock:
                    a.phase = "Failed"
                    a.rejected = f"Allocate failed due to {why}, which is unexpected"
                    self.active.pop((pod.namespace, pod.name), None)
                self._report(a)
                raise
            self._report(a)
            return a

    def _allocate(self, a: Admitted, container: str, resource: str, required: int,
                  reusable: list[str], choose: Chooser | None) -> None:
        def fail(message: str) -> AdmitError:
            return AdmitError(container, "Allocate", REJECTED, message)

        where = f"{a.pod.namespace}/{a.pod.name}"
        with self._lock:
            r = self._resources.get(resource)
            if r is None:
                raise fail(f"cannot allocate unregistered device {resource}")
            if not r.healthy:
                raise fail(f"no healthy devices present; cannot allocate unhealthy "
                            f"devices {resource}")
            allocated = list(dict.fromkeys(reusable))[:required]
            needed = required - len(allocated)
            in_use = {i for p in self.active.values() for (_c, res), ids in p.held.items()
                      if res == resource for i in ids}
            available = [d for d in r.devices if d in r.healthy and d not in in_use]
            e = r.primary
            numa = dict(r.devices)
        if needed > 0:
            if len(available) < needed:
                raise fail(f"requested number of devices unavailable for {resource}. "
                                 f"Requested: {needed}, Available: {len(available)}")
            if e is None or e.stopped:
                raise fail(f"endpoint not found in cache for a registered resource: "
                                 f"{resource}")
            preferred: list[str] = []
            if e.options.get_preferred_allocation_available:
                offered = [*available, *allocated]
                try:
                    reply = e.stub.GetPreferredAllocation(dp.PreferredAllocationRequest(
                        container_requests=[dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=offered, must_include_deviceIDs=allocated,
                            allocation_size=required)]), timeout=CALL_SECONDS)
                except grpc.RpcError as err:
                    self._record(Call("GetPreferredAllocation", where, container, resource, (),
                                      tuple(offered), tuple(allocated), required,
                                      str(err.code())))
                    raise fail(f"device plugin GetPreferredAllocation rpc failed with "
                                     f"err: {err.details()}") from None
                answer = [i for c in reply.container_responses[:1] for i in c.deviceIDs]
                self._record(Call("GetPreferredAllocation", where, container, resource,
                                  tuple(answer), tuple(offered), tuple(allocated), required))
                free = set(available)
                preferred = [i for i in dict.fromkeys(answer) if i in free][:needed]
            picked = preferred + [d for d in available if d not in preferred][
                :needed - len(preferred)]
            if choose is not None:
                picked = choose(container, list(available), picked, needed)
            allocated += picked
        if e is None or e.stopped:
            raise fail(f"unknown Device Plugin {resource}")
        try:
            resp = e.stub.Allocate(dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devices_ids=allocated)]), timeout=CALL_SECONDS)
        except grpc.RpcError as err:
            self._record(Call("Allocate", where, container, resource, tuple(allocated),
                              error=str(err.code())))
            raise AdmitError(container, "Allocate", err.code(), err.details() or "") from None
        self._record(Call("Allocate", where, container, resource, tuple(allocated)))
        if not resp.container_responses:
            raise fail(f"no containers return in allocation response {resp}")
        with self._lock:
            a.held[(container, resource)] = list(allocated)
            a.replies[(container, resource)] = resp.container_responses[0]
            for i in allocated:
                a.numa[(resource, i)] = list(numa.get(i, []))

    def start(self, a: Admitted, containers: Sequence[str] | None = None) -> None:
        """Start the pod's containers (``containers``: only those) in kubelet's order:
        PreStartContainer for each of its device-plugin resources first; a regular init
        container then runs to completion. Calling it again for a container is a restart."""
        for name, wants in a.pod.spec_order():
            if containers is not None and name not in containers:
                continue
            try:
                self._prestart(a, name, wants)
            except AdmitError as e:
                with self._lock:
                    a.states[name] = "waiting"
                    a.waiting[name] = ("CreateContainerConfigError", e.message)
                self._report(a)
                raise
            with self._lock:
                a.waiting.pop(name, None)
                a.states[name] = "completed" if a.pod.regular_init(name) else "running"
                if all(a.states.get(c) == "running" for c, _ in a.pod.spec_order()
                       if not a.pod.is_init(c)):
                    a.phase = "Running"
            self._report(a)

    def _prestart(self, a: Admitted, name: str, wants: int | Mapping[str, int]) -> None:
        where = f"{a.pod.namespace}/{a.pod.name}"
        for resource, _n in self._device_asks(wants):
            e = self._endpoint(resource)
            if e is None or e.stopped:
                raise AdmitError(name, "PreStartContainer", "Unknown",
                                 f"endpoint not found in cache for a registered resource: "
                                 f"{resource}")
            if e.options is None or not e.options.pre_start_required:
                continue
            ids = a.held.get((name, resource))
            if ids is None:
                raise AdmitError(name, "PreStartContainer", "Unknown",
                                 f"no devices found allocated in local cache for pod {where}, "
                                 f"container {name}, resource {resource}")
            try:
                e.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=ids),
                                         timeout=PRESTART_SECONDS)
            except grpc.RpcError as err:
                self._record(Call("PreStartContainer", where, name, resource, tuple(ids),
                                  error=str(err.code())))
                raise AdmitError(name, "PreStartContainer", err.code(),
                                 err.details() or "") from None
            self._record(Call("PreStartContainer", where, name, resource, tuple(ids)))

    def run(self, pod: FakePod, choose: Chooser | None = None) -> Admitted:
        a = self.admit(pod, choose)
        self.start(a)
        return a

    def finish(self, a: Admitted, phase: str = "Succeeded") -> None:
        """The pod ended (``phase``): no longer active, its devices free."""
        with self._lock:
            self.active.pop((a.pod.namespace, a.pod.name), None)
            a.phase = phase
            for c, state in a.states.items():
                a.states[c] = "completed" if state != "waiting" else state
        self._report(a)

    def remove(self, namespace: str, name: str) -> None:
        """The pod was deleted: no longer active, its devices free."""
        with self._lock:
            self.active.pop((namespace, name), None)

    # -- status ----------------------------------------------------------------------------

    def _report(self, a: Admitted) -> None:
        if self.report is None:
            return
        with self._lock:
            status = status_of(a)
        self.report(a.pod.namespace, a.pod.name, status)


def _go_code(code: Any) -> str:
    """A gRPC status code as Go's ``codes.Code.String()`` writes it (FailedPrecondition)."""
    name = getattr(code, "name", str(code))
    return "".join(w.capitalize() for w in name.split("_"))


def status_of(a: Admitted) -> dict[str, Any]:
    """The pod status kubelet would write for ``a``."""
    if a.rejected:
        return {"phase": "Failed", "reason": REJECTED,
                "message": f"Pod was rejected: {a.rejected}"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def one(name: str) -> dict[str, Any]:
        state = a.states.get(name, "waiting")
        if state == "running":
            st: dict[str, Any] = {"running": {"startedAt": now}}
        elif state == "completed":
            st = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
        else:
            reason, message = a.waiting.get(name, ("PodInitializing", ""))
            st = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return {"name": name, "state": st, "ready": state == "running", "restartCount": 0,
                "image": "", "imageID": "", "started": state == "running"}

    order = [c for c, _ in a.pod.spec_order()]
    return {"phase": a.phase,
            "initContainerStatuses": [one(c) for c in order if a.pod.is_init(c)],
            "containerStatuses": [one(c) for c in order if not a.pod.is_init(c)]}


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
