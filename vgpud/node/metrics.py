"""``/metrics`` of the node runtime (prometheus-client), computed at scrape time; whichever
adapter runs the node (the kubelet device plugin today) serves it.

Per GPU: capacity, memory and cores allocated, memory used (from the GPU source),
containers sharing it, health, the top priority active on it. Per container: its
limits; the memory its shim counts (``vgpud.node.usage_state``; slots of processes that
are gone are left out, whatever the file says); the memory NVML says it uses and whether it is
over its limit past the grace period (the watchdog); its SM use as NVML measured it
in the last arbitration round and whether a higher priority holds it at the floor.
Node-wide: process registrations, ``VGPUD_*`` variables that containers set and the
shim ignored, the watchdog's reports and kills. Labels name the GPU by uuid and index
and the container by namespace, pod and container. Memory is in bytes, shares of SMs
are ratios of one GPU (0.3 = 30 %); ``docs/metrics.md`` lists every metric.

The usage files are the containers' to write: a scrape reads them first, through
:class:`~vgpud.node.tenant.TenantReads` (worker threads, bounded in number and time; the
event loop never waits on a container's file), then formats everything on the loop from
memory. A file not read in time leaves its container without a usage figure for that
scrape.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpud.node import procfs, usage_state
from vgpud.node.allocations import AllocationStore
from vgpud.node.arbiter import Observed
from vgpud.node.devices import NodeDevices
from vgpud.node.registration import Registry
from vgpud.node.tenant import NotRead, TenantReads
from vgpud.node.watchdog import Watchdog
from vgpud.process import add_probes

log = structlog.get_logger(__name__)
MIB = 1 << 20

UsageReader = Callable[[Path, Sequence[str]], Mapping[str, int] | None]


def _alive(p: usage_state.ProcessSlot) -> bool:
    """The slot's process still runs (by its host PID and start time); a slot whose host
    PID is not known yet counts as alive."""
    if p.host_pid <= 0:
        return True
    facts = procfs.read(p.host_pid)
    return facts is not None and (not p.start_time or facts.start_time == p.start_time)


def shim_usage(state: Path, uuids: Sequence[str]) -> Mapping[str, int] | None:
    """Device bytes per GPU uuid that the shim charged to live processes, None if there
    is no usage file yet.

    The file's devices are the limits file's (the shim indexes them by UUID).
    """
    if not (state / usage_state.STATE_FILE).exists():
        return None
    snap = usage_state.read_usage(state)
    out = dict.fromkeys(uuids[: snap.device_count], 0)
    for p in snap.processes:
        if any(p.used[: len(uuids)]) and _alive(p):
            for i, b in enumerate(p.used[: len(uuids)]):
                out[uuids[i]] += b
    return out


Target = tuple[str, Path, tuple[str, ...]]  # allocation key, its state directory, its GPUs


def read_usages(targets: Sequence[Target], reader: UsageReader,
                out: dict[str, Mapping[str, int]], until: float) -> None:
    """Each target's usage that ``reader`` found, into ``out`` as it goes (a caller that
    stops waiting keeps what was read), reading until ``until`` (monotonic): blocking
    file I/O, for a worker thread."""
    for n, (key, state, uuids) in enumerate(targets):
        if time.monotonic() >= until:
            log.warning("usage_files_not_read", left=len(targets) - n,
                        why="out of time for this scrape")
            break
        try:
            usage = reader(state, uuids)
        except Exception as e:  # a scrape never fails on one unreadable file
            log.debug("usage_unreadable", key=key, error=str(e))
            continue
        if usage is not None:
            out[key] = usage


class NodeCollector(Collector):
    def __init__(self, node: str, devices: NodeDevices, store: AllocationStore,
                 used: Callable[[], Mapping[str, int]],
                 usage_reader: UsageReader | None = None, *,
                 registry: Registry | None = None, watchdog: Watchdog | None = None,
                 arbiter: Observed | None = None, reads: TenantReads | None = None) -> None:
        self.registry = registry
        self.watchdog = watchdog
        self.arbiter = arbiter
        self.node = node
        self.devices = devices
        self.store = store
        self.used = used
        self.usage_reader = usage_reader if usage_reader is not None else shim_usage
        self.reads = reads if reads is not None else TenantReads()
        self.usage: Mapping[str, Mapping[str, int]] = {}  # the last read, by allocation key

    async def refresh(self) -> None:
        """Read the containers' usage files for the next :meth:`collect` (off the loop)."""
        targets = [(g.key, g.state, tuple(d.uuid for d in g.devices))
                   for g in self.store.configured()]
        got: dict[str, Mapping[str, int]] = {}
        try:
            await self.reads.run(partial(read_usages, targets, self.usage_reader, got),
                                 "usage files")
        except NotRead as e:
            log.warning("usage_files_not_read", why=str(e), read=len(got), of=len(targets))
        self.usage = dict(got)  # a copy: a read left behind may still add to 'got'

    def collect(self) -> Iterator[Any]:
        inv = self.devices.inventory()
        gl = ["node", "uuid", "index", "model"]
        cap_mem = GaugeMetricFamily("vgpud_gpu_memory_capacity_bytes",
                                    "Device memory a GPU offers (physical × scaling)", labels=gl)
        alloc_mem = GaugeMetricFamily("vgpud_gpu_memory_allocated_bytes",
                                      "Device memory granted to containers", labels=gl)
        alloc_cores = GaugeMetricFamily("vgpud_gpu_cores_allocated_ratio",
                                        "SM share granted to containers (1 = one GPU)",
                                        labels=gl)
        used_mem = GaugeMetricFamily("vgpud_gpu_memory_used_bytes",
                                     "Device memory in use (all processes)", labels=gl)
        sharing = GaugeMetricFamily("vgpud_gpu_containers",
                                    "Containers holding a vGPU of this GPU", labels=gl)
        health = GaugeMetricFamily("vgpud_gpu_healthy", "1 when the GPU is healthy", labels=gl)
        cl = ["node", "namespace", "pod", "container", "uuid"]
        c_mem = GaugeMetricFamily("vgpud_container_memory_limit_bytes",
                                  "A container's device memory limit on a GPU", labels=cl)
        c_cores = GaugeMetricFamily("vgpud_container_cores_limit_ratio",
                                    "A container's SM limit on a GPU (1 = all; 0 = none set)",
                                    labels=cl)
        c_used = GaugeMetricFamily("vgpud_container_memory_used_bytes",
                                   "Device memory a container uses (the shim's count)",
                                   labels=cl)
        mem: dict[str, int] = {}
        cores: dict[str, int] = {}
        count: dict[str, int] = {}
        containers: dict[tuple[str, str], list[str]] = {}  # (allocation key, uuid) -> labels
        for g in self.store.configured():
            assert g.owner is not None  # configured() holds owned allocations only
            usage = self.usage.get(g.key)
            for d in g.devices:
                mem[d.uuid] = mem.get(d.uuid, 0) + d.memory
                cores[d.uuid] = cores.get(d.uuid, 0) + d.cores
                count[d.uuid] = count.get(d.uuid, 0) + 1
                labels = [self.node, g.owner.namespace, g.owner.pod, g.owner.container, d.uuid]
                containers[(g.key, d.uuid)] = labels
                c_mem.add_metric(labels, d.memory * MIB)
                c_cores.add_metric(labels, d.cores / 100)
                if usage is not None and d.uuid in usage:
                    c_used.add_metric(labels, usage[d.uuid])
        used = self.used()
        gpus: dict[str, list[str]] = {}
        for gpu in inv.devices:
            labels = [self.node, gpu.uuid, str(gpu.index), gpu.model]
            gpus[gpu.uuid] = labels
            cap_mem.add_metric(labels, inv.capacity(gpu).memory * MIB)
            alloc_mem.add_metric(labels, mem.get(gpu.uuid, 0) * MIB)
            alloc_cores.add_metric(labels, cores.get(gpu.uuid, 0) / 100)
            if gpu.uuid in used:
                used_mem.add_metric(labels, used[gpu.uuid] * MIB)
            sharing.add_metric(labels, count.get(gpu.uuid, 0))
            health.add_metric(labels, 1 if gpu.healthy else 0)
        yield from (cap_mem, alloc_mem, alloc_cores, used_mem, sharing, health,
                    c_mem, c_cores, c_used)
        yield from self._arbitration(gl, gpus, cl, containers)
        yield from self._node_side(cl, containers)

    def _arbitration(self, gl: list[str], gpus: Mapping[str, list[str]], cl: list[str],
                     containers: Mapping[tuple[str, str], list[str]]) -> Iterator[Any]:
        """The last arbitration round: measured SM use, and who held whom back."""
        seen = self.arbiter
        if seen is None or not seen.rounds:
            return
        active = GaugeMetricFamily(
            "vgpud_gpu_arbitration_active",
            "1 while a container is busy on the GPU (it has a top priority)", labels=gl)
        top = GaugeMetricFamily(
            "vgpud_gpu_arbitration_top_priority",
            "The highest nvidia.com/vgpu-priority busy on the GPU (0 when none is)",
            labels=gl)
        gpu_sm = GaugeMetricFamily(
            "vgpud_gpu_sm_utilization_ratio",
            "SM use of every process on the GPU in the last arbitration round, by NVML on "
            "the host (1 = the whole GPU)", labels=gl)
        sm = GaugeMetricFamily(
            "vgpud_container_sm_utilization_ratio",
            "SM use of a container's processes on a GPU in the last arbitration round, "
            "by NVML on the host (1 = the whole GPU)", labels=cl)
        held = GaugeMetricFamily(
            "vgpud_container_arbitration_held",
            "1 while a higher priority busy on the GPU holds the container to the floor",
            labels=cl)
        for uuid, r in seen.records.items():
            lab = gpus.get(uuid)
            if lab is not None:
                active.add_metric(lab, 1 if r.active else 0)
                top.add_metric(lab, r.top_priority if r.active else 0)
        for uuid, lab in gpus.items():  # every GPU: one NVML listed no process on is idle
            gpu_sm.add_metric(lab, seen.gpu_percent.get(uuid, 0) / 100)
        for (key, uuid), pct in seen.sm_percent.items():
            lab = containers.get((key, uuid))
            if lab is None:
                continue
            sm.add_metric(lab, pct / 100)
            rec = seen.records.get(uuid)
            held.add_metric(lab, 1 if rec is not None and key in rec.held else 0)
        yield from (active, top, gpu_sm, sm, held)

    def _node_side(self, cl: list[str],
                   containers: Mapping[tuple[str, str], list[str]]) -> Iterator[Any]:
        if self.watchdog is not None:
            device = GaugeMetricFamily(
                "vgpud_container_memory_device_bytes",
                "Device memory a container's processes hold on a GPU, by NVML on the host "
                "(the watchdog's view; 0 when NVML lists none of its processes)", labels=cl)
            over = GaugeMetricFamily(
                "vgpud_container_over_limit",
                "1 while a container is over its memory limit past the grace period",
                labels=cl)
            over_sm = GaugeMetricFamily(
                "vgpud_container_over_sm_limit",
                "1 while a container's SM use, by NVML on the host over the watchdog's "
                "window, is past its fixed SM limit by the margin, past the grace period",
                labels=cl)
            seen = {(u.key, u.uuid): u.used for u in self.watchdog.last}
            over_now = {(u.key, u.uuid) for u in self.watchdog.over}
            over_sm_now = {(u.key, u.uuid) for u in self.watchdog.sm_over}
            for k, lab in containers.items():
                device.add_metric(lab, seen.get(k, 0))
                over.add_metric(lab, 1 if k in over_now else 0)
                over_sm.add_metric(lab, 1 if k in over_sm_now else 0)
            actions = CounterMetricFamily("vgpud_watchdog_actions",
                                          "Over-limit incidents reported, and processes killed",
                                          labels=["node", "action"])
            actions.add_metric([self.node, "report"], self.watchdog.reports)
            actions.add_metric([self.node, "kill"], self.watchdog.kills)
            yield from (device, over, over_sm, actions)
        changes = CounterMetricFamily(
            "vgpud_gpu_changes", "GPUs (and MIG instances) found after start (added), "
            "dropped after leaving the node (removed, the old board of a swap included), and "
            "boards swapped in place (replaced)", labels=["node", "change"])
        for change, n in sorted(self.devices.changes.items()):
            changes.add_metric([self.node, change], n)
        yield changes
        if self.registry is not None:
            regs = CounterMetricFamily("vgpud_container_process_registrations",
                                       "GPU processes that registered with the plugin",
                                       labels=["node", "result"])
            regs.add_metric([self.node, "accepted"], self.registry.accepted)
            regs.add_metric([self.node, "refused"], self.registry.refused)
            env = CounterMetricFamily(
                "vgpud_container_env_ignored",
                "Processes that set a VGPUD_* variable the shim ignored (limits come from "
                "the plugin only)", labels=["node", "variable"])
            for name, n in sorted(self.registry.ignored_env.items()):
                env.add_metric([self.node, name], n)
            yield from (regs, env)


def metrics_app(registry: CollectorRegistry,
                before: Callable[[], Awaitable[None]] | None = None) -> web.Application:
    """``/metrics`` and ``/healthz``; ``before`` (if given) runs before each scrape is
    formatted (:meth:`NodeCollector.refresh`)."""
    app = web.Application()
    exposition = make_aiohttp_handler(registry)

    async def scrape(request: web.Request) -> web.StreamResponse:
        if before is not None:
            await before()
        return await exposition(request)

    app.router.add_get("/metrics", scrape)
    add_probes(app)
    return app
