"""Prometheus metrics of the scheduler process: extender verbs, latency, rejections,
per-GPU allocation, GPU pods waiting to be placed.

Memory is in bytes and SM shares are ratios of one GPU (the ledger counts MiB and
percent); ``docs/metrics.md`` lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpud.core.allocate import Allocator
from vgpud.core.model import Node
from vgpud.kube.cache import LISTING, STREAMING, Event, Informer, Synced
from vgpud.kube.clock import SYSTEM_CLOCK, Clock

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25,
                   0.5, 1, 2.5, 5)  # finer around the 10 ms a filter must stay under
MIB = 1 << 20
VERBS = ("filter", "prioritize", "bind", "preempt")
# how a verb call ended (vgpud/extender/server.py): "error" is an answer with its
# Error field set (a bind that failed, a filter that could not run)
OUTCOMES = ("ok", "error", "not_ready", "bad_request", "internal_error")
PREEMPTION_OUTCOMES = ("kept", "extended", "dropped")
RESCHEDULE_ACTIONS = ("deleted", "recreated", "gave_up")
SYNC_MODES = (STREAMING, LISTING)


_FAMILIES = (
    ("vgpud_scheduler_gpu_memory_allocated_bytes", "Device memory held by pods on a GPU"),
    ("vgpud_scheduler_gpu_memory_capacity_bytes",
     "Schedulable memory of a GPU (physical x scaling)"),
    ("vgpud_scheduler_gpu_cores_allocated_ratio",
     "SM share held by pods on a GPU (1 = one GPU's SMs)"),
    ("vgpud_scheduler_gpu_vgpus_allocated", "vGPUs (containers) on a GPU"),
)


@dataclass(frozen=True)
class AllocationSnapshot:
    """What the per-GPU metrics need, copied on the event loop in a few ms."""

    nodes: list[Node | None]
    start: npt.NDArray[np.int64]
    used_mem: npt.NDArray[np.int64]
    cap_mem: npt.NDArray[np.int64]
    used_cores: npt.NDArray[np.int64]
    used_split: npt.NDArray[np.int64]
    entries: dict[str, int]


def snapshot(alloc: Allocator) -> AllocationSnapshot:
    c = alloc.cluster
    n = c.slots
    counts = {state.value: k for state, k in alloc.ledger.counts().items()}
    return AllocationSnapshot(list(c.nodes), c.node_start[: len(c.nodes)].copy(),
                              c.used_mem[:n].copy(), c.cap_mem[:n].copy(),
                              c.used_cores[:n].copy(), c.used_split[:n].copy(), counts)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def allocation_chunks(snap: AllocationSnapshot, nodes_per_chunk: int = 250) -> Iterator[str]:
    """The per-GPU allocation in Prometheus text format, a few hundred nodes at a time.

    40,000 GPUs make 160,000 samples (~20 MB of text): produced in small chunks the
    server streams out, rather than through prometheus-client's per-sample objects or
    one large buffer, either of which leaves tens of MiB behind after every scrape.
    Each chunk turns only its own slots into Python numbers: converting whole columns
    at once made 160,000 short-lived objects, and the allocator kept their pages
    (about 6 MiB of resident memory left behind after the first scrape at 5,000 nodes).
    Pure formatting of a snapshot: the server yields to other requests between chunks.
    """
    columns = (snap.used_mem * MIB, snap.cap_mem * MIB, snap.used_cores / 100,
               snap.used_split)
    models: dict[str, str] = {}
    live = [(i, n) for i, n in enumerate(snap.nodes) if n is not None]
    chunks = []  # (nodes, their slots), the same for every family
    for lo in range(0, len(live), nodes_per_chunk):
        chunk = [node for _, node in live[lo:lo + nodes_per_chunk]]
        slots = np.array([int(snap.start[idx]) + i for idx, node in live[lo:lo + nodes_per_chunk]
                          for i in range(len(node.inventory.devices))], dtype=np.int64)
        chunks.append((chunk, slots))
    for (name, help_text), column in zip(_FAMILIES, columns, strict=True):
        yield f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        for chunk, slots in chunks:
            values = iter(column[slots].tolist())
            lines = []
            for node in chunk:
                node_label = _label(node.name)
                for g in node.inventory.devices:
                    model = models.get(g.model)
                    if model is None:
                        model = models[g.model] = _label(g.model)
                    lines.append(f'{name}{{node="{node_label}",uuid="{_label(g.uuid)}",'
                                 f'model="{model}"}} {next(values)}\n')
            yield "".join(lines)
    yield ("# HELP vgpud_scheduler_ledger_entries Pods holding GPUs, by state\n"
           "# TYPE vgpud_scheduler_ledger_entries gauge\n"
           + "".join(f'vgpud_scheduler_ledger_entries{{state="{state}"}} {count}\n'
                     for state, count in sorted(snap.entries.items())))


def render_allocation(snap: AllocationSnapshot) -> str:
    return "".join(allocation_chunks(snap))


class PendingGpuPods(Collector):
    """GPU pods waiting for this scheduler: how many, and how long the oldest has waited
    (since its creation). ``since`` gives their creation times (epoch seconds)."""

    def __init__(self, since: Callable[[], Collection[float]] = tuple,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.since = since
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = self.since()
        oldest = min(waiting, default=None)
        yield GaugeMetricFamily(
            "vgpud_scheduler_pending_gpu_pods",
            "Pods asking for a vGPU that name this scheduler and are not bound to a node yet",
            value=len(waiting))
        yield GaugeMetricFamily(
            "vgpud_scheduler_oldest_pending_gpu_pod_age_seconds",
            "How long the oldest of those pods has existed (0 when there is none)",
            value=0.0 if oldest is None else max(0.0, self.clock.wall().timestamp() - oldest))


class Metrics:
    def __init__(self, alloc: Allocator) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("vgpud_extender_requests", "Extender calls by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("vgpud_extender_request_duration_seconds",
                                 "Time to answer one extender call, body read included",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("vgpud_extender_node_rejections",
                                  "Nodes rejected by filter, by reason code", ["code"],
                                  registry=self.registry)
        self.preemption = Counter("vgpud_extender_preemption_nodes",
                                  "Nodes kube-scheduler proposed for preemption, by what the "
                                  "extender did: kept as proposed, extended with GPU victims, "
                                  "dropped", ["outcome"], registry=self.registry)
        self.reschedules = Counter("vgpud_scheduler_reschedules",
                                   "GPU pods kubelet refused, by what the Reschedule "
                                   "controller did: deleted (its controller recreates it), "
                                   "recreated (a bare pod), gave_up", ["action"],
                                   registry=self.registry)
        self.expired = Counter("vgpud_scheduler_ledger_expired",
                               "Assumed placements never confirmed", registry=self.registry)
        self.informer_syncs = Counter("vgpud_scheduler_informer_syncs",
                                      "Completed (re)syncs of the scheduler's caches, by "
                                      "informer and how: watch-list (a streaming list) or "
                                      "list (paged list, the fallback)",
                                      ["informer", "mode"], registry=self.registry)
        self.pending = PendingGpuPods()
        self.registry.register(self.pending)
        # Every known label value starts at 0, so rates and error ratios have series to
        # work on before the first event (Prometheus' advice for known label sets).
        for verb in VERBS:
            self.latency.labels(verb)
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
        for outcome in PREEMPTION_OUTCOMES:
            self.preemption.labels(outcome)
        for action in RESCHEDULE_ACTIONS:
            self.reschedules.labels(action)

    def count_syncs(self, informer: Informer[Any]) -> None:
        """Count ``informer``'s syncs by the way each was made (its series start at 0)."""
        for mode in SYNC_MODES:
            self.informer_syncs.labels(informer.name, mode)

        def on_event(event: Event[Any]) -> None:
            if isinstance(event, Synced):
                self.informer_syncs.labels(informer.name, informer.sync_mode).inc()
        informer.subscribe(on_event)

    def count_pending(self, since: Callable[[], Collection[float]]) -> None:
        """Where the pending GPU pods' creation times come from
        (:meth:`vgpud.scheduling.state.SchedulerState.pending_since`)."""
        self.pending.since = since
