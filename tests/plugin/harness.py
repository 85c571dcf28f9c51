"""One node's plugin against the API stand-in and the fake kubelet.

``async with node_harness(...) as h``: an :class:`~tests.standin.ApiServer` with the
node, a :class:`~tests.fakekubelet.FakeKubelet` on sockets in a short temporary
directory, and ``vgpud.plugin.run.run_plugin`` in a task group (``h.stop_plugin()``
/ ``h.start_plugin()`` restart it). Fake kubelet calls are blocking: run them with
``h.kubelet_call(fn, ...)`` (a worker thread); the fake kubelet writes the pod statuses
kubelet would into the stand-in. ``resources`` names what the test expects the plugin to
register (the first is the fake kubelet's default resource); the harness waits for each.
:meth:`Harness.schedule` places a pod with the scheduler's own core (the request parser
under the harness's settings, the allocator and its ledger), as the scheduler writes
``vgpud.io/assignment``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup

from tests import builders
from tests.builders import container, gpu_pod
from tests.fakekubelet import AdmitError, FakeKubelet, FakePod
from tests.standin import ApiServer
from vgpud.config import Settings, parse_settings
from vgpud.core.allocate import Allocator
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES, decode_node_devices, encode_assignment
from vgpud.core.model import Node, NodeInventory, Placement
from vgpud.core.requests import enabled_presets, parse_pod
from vgpud.kube.client import KubeClient
from vgpud.node.cluster import KubeCluster
from vgpud.node.devices import GpuSource
from vgpud.node.fakegpus import FakeGpus
from vgpud.node.vendors import Nvidia
from vgpud.plugin.run import PluginOptions, Running, run_plugin

NODE = "gpu-node-1"
VGPU = "nvidia.com/vgpu-number"
Limits = Mapping[str, int | str]  # a container's resource limits


def uuid_of(i: int) -> str:
    """GPU ``i``'s UUID, the fake CUDA driver's own scheme (tests/fakes/CONTRACT.md), so a
    limits file the plugin writes names the GPUs the shim finds under the fake driver."""
    return f"GPU-fa4ecda0-0000-4000-8000-{i:012x}"


def write_devices(path: Path, n: int, memory: int = 24576, healthy: dict[int, bool] | None = None,
                  ) -> Path:
    healthy = healthy or {}
    devs = [{"uuid": uuid_of(i), "index": i, "model": "NVIDIA Fake 24GB", "memory": memory,
             "numa": i % 2, "links": [], "healthy": healthy.get(i, True), "mig": False}
            for i in range(n)]
    path.write_text(json.dumps({"devices": devs}))
    return path


def placement(containers: dict[str, list[tuple[int, int, int]]], node: str = NODE) -> Placement:
    """{container: [(gpu index, MiB, cores)]} → a Placement on the fake driver's GPUs."""
    return builders.placement(containers, node=node, uuid=uuid_of)


def pod_manifest(name: str, containers: Mapping[str, int | Limits], assignment: str | None,
                 namespace: str = "default", node: str = NODE) -> dict[str, Any]:
    """A pod whose containers ask for ``n`` vGPUs (``nvidia.com/vgpu-number``) or for
    the given limits."""
    return gpu_pod(name, namespace=namespace, assignment=assignment, node=node, phase="Pending",
                   containers=[container(c, {k: str(v) for k, v in (
                       {VGPU: n} if isinstance(n, int) else n).items()}, image="cuda")
                       for c, n in containers.items()])


async def kubelet_picks_a_full_gpu(h: Harness) -> AdmitError:
    """GPU 1 filled by one pod, then a pod placed on GPU 0 whose GPUs kubelet chooses
    itself, onto GPU 1: the refusal kubelet sees."""
    h.add_pod("big", {"main": 1}, placement({"main": [(1, 24000, 50)]}))
    await h.kubelet_call(h.kubelet.run, FakePod("default", "big", [("main", 1)]))
    h.add_pod("p1", {"main": 1}, placement({"main": [(0, 4000, 20)]}))

    def onto_full(name, free, preferred, n):  # type: ignore[no-untyped-def]
        return [f"{uuid_of(1)}::9"]

    with pytest.raises(AdmitError) as e:
        await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]),
                             onto_full)
    return e.value


async def wait_for(predicate: Callable[[], Any], seconds: float = 10.0) -> None:
    """Poll a condition the plugin reaches asynchronously, with a deadline."""
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the condition lives in other threads' state
            await anyio.sleep(0.02)


class Harness:
    def __init__(self, api: ApiServer, kube: KubeClient, kubelet: FakeKubelet, root: Path,
                 tg: TaskGroup, settings: Settings, devices_file: Path,
                 source: Callable[[Path], GpuSource] | None = None) -> None:
        self.api = api
        self.kube = kube
        self.kubelet = kubelet
        self.root = root
        self.tg = tg
        self.settings = settings
        self.devices_file = devices_file
        self.source = source or (lambda path: FakeGpus(path, poll_interval=0.05))
        self.state_dir = root / "state"
        self.running: Running | None = None
        self.allocator: Allocator | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()

    async def start_plugin(self) -> Running:
        opts = PluginOptions(node_name=NODE, device_plugin_dir=self.kubelet.plugin_dir,
                             pod_resources_socket=self.kubelet.podres_socket,
                             state_dir=self.state_dir, settings=self.settings,
                             metrics_listen="127.0.0.1:0", kubelet_poll=0.05,
                             require_shim=False)

        async def body(*, task_status: Any) -> None:
            with anyio.CancelScope() as scope:
                self._scope = scope
                source = self.source(self.devices_file)
                try:
                    await run_plugin(opts, Nvidia(source, name="fake"), KubeCluster(self.kube),
                                     task_status=task_status)
                finally:
                    self._stopped.set()

        self._stopped = anyio.Event()
        self.running = await self.tg.start(body)
        return self.running

    async def stop_plugin(self) -> None:
        assert self._scope is not None
        self._scope.cancel()
        await self._stopped.wait()

    async def kubelet_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    def add_pod(self, name: str, containers: Mapping[str, int | Limits],
                assignment: Placement | str | None, namespace: str = "default",
                ) -> dict[str, Any]:
        """A pod with its assignment. Given a :class:`Placement`, each container asks
        for what the placement grants it (the MiB and SM % of its largest vGPU), as a pod
        the scheduler placed does: the plugin believes no grant beyond the request."""
        text = encode_assignment(assignment) if isinstance(assignment, Placement) else assignment
        if isinstance(assignment, Placement):
            containers = {c: self._asking(n, assignment, c) for c, n in containers.items()}
        return self.api.create("pods", pod_manifest(name, containers, text, namespace), namespace)

    def _asking(self, n: int | Limits, placement: Placement, container: str) -> int | Limits:
        limits: dict[str, int | str] = {VGPU: n} if isinstance(n, int) else dict(n)
        grant = placement.container(container)
        if grant is None or not grant.devices:
            return n
        for preset in enabled_presets(self.settings.defaults()):
            if preset.number not in limits or preset.tke:
                continue
            if preset.memory and not {preset.memory, preset.memory_percent} & set(limits):
                limits[preset.memory] = max(d.memory for d in grant.devices)
            if preset.cores and preset.cores not in limits:
                limits[preset.cores] = max(d.cores for d in grant.devices)
        return limits

    async def published_inventory(self) -> NodeInventory:
        """The node's inventory annotation, once the plugin (which publishes it beside
        serving kubelet) has written it."""
        def annotations() -> dict[str, str]:
            return self.api.get("nodes", NODE, "")["metadata"].get("annotations") or {}
        await wait_for(lambda: NODE_DEVICES in annotations())
        return decode_node_devices(annotations()[NODE_DEVICES])

    async def schedule(self, name: str, containers: Mapping[str, Limits],
                       namespace: str = "default") -> Placement:
        """Create a pod with these limits and place it as the scheduler does: parsed under
        the harness's settings (presets included), allocated on the published inventory
        next to every pod placed before, its assignment written on the pod."""
        if self.allocator is None:
            self.allocator = Allocator(self.settings.defaults())
            self.allocator.set_node(Node(NODE, await self.published_inventory()))
        obj = self.add_pod(name, containers, None, namespace)
        decision = self.allocator.schedule(parse_pod(obj, self.settings.defaults()), [NODE])
        assert decision.placement is not None, decision.reason
        self.api.patch("pods", name, {"metadata": {"annotations": {
            ASSIGNMENT: encode_assignment(decision.placement)}}}, namespace)
        return decision.placement

    def assignment(self, name: str, namespace: str = "default") -> str:
        return str(self.api.get("pods", name, namespace)["metadata"]["annotations"][ASSIGNMENT])


def _reporter(api: ApiServer) -> Callable[[str, str, dict[str, Any]], None]:
    """The fake kubelet's status writes, into the stand-in from any thread (its store
    belongs to the event loop). A pod the test never created is not written."""
    token = anyio.lowlevel.current_token()

    def report(namespace: str, name: str, status: dict[str, Any]) -> None:
        def write() -> None:
            if api.get("pods", name, namespace) is not None:
                api.patch("pods", name, {"status": status}, namespace, subresource="status")
        anyio.from_thread.run_sync(write, token=token)

    return report


@asynccontextmanager
async def node_harness(gpus: int = 4, *, settings: dict[str, Any] | None = None,
                       memory: int = 24576, resources: Sequence[str] = (VGPU,),
                       source: Callable[[Path], GpuSource] | None = None,
                       devices: list[dict[str, Any]] | None = None,
                       ) -> AsyncIterator[Harness]:
    """A plugin on the API stand-in and the fake kubelet, its GPUs from a fake-devices
    file of ``gpus`` devices (or of ``devices``, or from ``source(file)``)."""
    root = Path(tempfile.mkdtemp(prefix="vgp"))  # unix socket paths must stay short
    try:
        devices_file = write_devices(root / "devices.json", gpus, memory)
        if devices is not None:
            devices_file.write_text(json.dumps({"devices": devices}))
        given = dict(settings or {})  # the shim is always installed under the test's root
        s = parse_settings({**given, "plugin": {**given.get("plugin", {}),
                                                "shimHostDir": str(root / "shim")}})
        async with ApiServer() as api:
            api.create("nodes", {"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": NODE}, "status": {}})
            async with KubeClient.for_url(api.url) as kube, anyio.create_task_group() as tg:
                kubelet = FakeKubelet(root, resources[0], report=_reporter(api))
                kubelet.start_servers()
                h = Harness(api, kube, kubelet, root, tg, s, devices_file, source)
                try:
                    await h.start_plugin()
                    await anyio.to_thread.run_sync(
                        lambda: kubelet.wait_registered(resources=resources))
                    yield h
                finally:
                    # Stop kubelet first, shielded, and only then cancel: an await after
                    # the cancel would raise Cancelled, replace the test's own exception,
                    # and be swallowed by the task group (a failing test would pass).
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(kubelet.stop)
                    tg.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)
