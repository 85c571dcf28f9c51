"""``/metrics`` of the plugin (prometheus-client), computed at scrape time.

Per GPU: capacity, memory and cores allocated, memory used (from the GPU source),
containers sharing it, health. Per container: its limits and, when the shim's usage
state is readable (``vgpud.shm``), the memory it uses. Labels name the GPU by uuid
and index and the container by namespace, pod and container.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpud import shm
from vgpud.plugin.allocations import AllocationStore
from vgpud.plugin.devices import NodeDevices

log = structlog.get_logger(__name__)
MIB = 1 << 20

UsageReader = Callable[[Path, Sequence[str]], Mapping[str, int] | None]


def shim_usage(state: Path, uuids: Sequence[str]) -> Mapping[str, int] | None:
    """Bytes used per GPU uuid from the shim's usage-state file, None if there is none yet.

    The file's devices are the container's CUDA ordinals, i.e. the limits file's order.
    """
    if not (state / shm.STATE_FILE).exists():
        return None
    snap = shm.read_usage(state)
    return {uuids[d.index]: d.used for d in snap.devices if d.index < len(uuids)}


class PluginCollector(Collector):
    def __init__(self, node: str, devices: NodeDevices, store: AllocationStore,
                 used: Callable[[], Mapping[str, int]],
                 usage_reader: UsageReader | None = None) -> None:
        self.node = node
        self.devices = devices
        self.store = store
        self.used = used
        self.usage_reader = usage_reader if usage_reader is not None else shim_usage

    def collect(self) -> Iterator[Any]:
        inv = self.devices.inventory()
        gl = ["node", "uuid", "index", "model"]
        cap_mem = GaugeMetricFamily("vgpud_gpu_memory_capacity_bytes",
                                    "Device memory a GPU offers (physical × scaling)", labels=gl)
        alloc_mem = GaugeMetricFamily("vgpud_gpu_memory_allocated_bytes",
                                      "Device memory granted to containers", labels=gl)
        alloc_cores = GaugeMetricFamily("vgpud_gpu_cores_allocated_percent",
                                        "SM share granted to containers (% of one GPU)",
                                        labels=gl)
        used_mem = GaugeMetricFamily("vgpud_gpu_memory_used_bytes",
                                     "Device memory in use (all processes)", labels=gl)
        sharing = GaugeMetricFamily("vgpud_gpu_containers",
                                    "Containers holding a vGPU of this GPU", labels=gl)
        health = GaugeMetricFamily("vgpud_gpu_healthy", "1 when the GPU is healthy", labels=gl)
        cl = ["node", "namespace", "pod", "container", "uuid"]
        c_mem = GaugeMetricFamily("vgpud_container_memory_limit_bytes",
                                  "A container's device memory limit on a GPU", labels=cl)
        c_cores = GaugeMetricFamily("vgpud_container_cores_limit_percent",
                                    "A container's SM limit on a GPU", labels=cl)
        c_used = GaugeMetricFamily("vgpud_container_memory_used_bytes",
                                   "Device memory a container uses (the shim's count)",
                                   labels=cl)
        mem: dict[str, int] = {}
        cores: dict[str, int] = {}
        count: dict[str, int] = {}
        for g in self.store.configured():
            assert g.owner is not None  # configured() holds owned allocations only
            usage = None
            if self.usage_reader is not None:
                try:
                    usage = self.usage_reader(g.state, [d.uuid for d in g.devices])
                except Exception as e:  # a scrape never fails on one unreadable file
                    log.debug("usage_unreadable", key=g.key, error=str(e))
            for d in g.devices:
                mem[d.uuid] = mem.get(d.uuid, 0) + d.memory
                cores[d.uuid] = cores.get(d.uuid, 0) + d.cores
                count[d.uuid] = count.get(d.uuid, 0) + 1
                labels = [self.node, g.owner.namespace, g.owner.pod, g.owner.container, d.uuid]
                c_mem.add_metric(labels, d.memory * MIB)
                c_cores.add_metric(labels, d.cores)
                if usage is not None and d.uuid in usage:
                    c_used.add_metric(labels, usage[d.uuid])
        used = self.used()
        for gpu in inv.devices:
            labels = [self.node, gpu.uuid, str(gpu.index), gpu.model]
            cap_mem.add_metric(labels, inv.capacity(gpu).memory * MIB)
            alloc_mem.add_metric(labels, mem.get(gpu.uuid, 0) * MIB)
            alloc_cores.add_metric(labels, cores.get(gpu.uuid, 0))
            if gpu.uuid in used:
                used_mem.add_metric(labels, used[gpu.uuid] * MIB)
            sharing.add_metric(labels, count.get(gpu.uuid, 0))
            health.add_metric(labels, 1 if gpu.healthy else 0)
        yield from (cap_mem, alloc_mem, alloc_cores, used_mem, sharing, health,
                    c_mem, c_cores, c_used)


def metrics_app(registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(registry))

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    return app
