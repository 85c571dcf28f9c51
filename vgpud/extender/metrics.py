"""Prometheus metrics of the extender: verbs, latency, rejections, per-GPU allocation."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpud.core.allocate import Allocator

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _Allocation(Collector):
    """Per-GPU allocation, read from the allocator at scrape time."""

    def __init__(self, alloc: Allocator) -> None:
        self.alloc = alloc

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "uuid", "model"]
        mem = GaugeMetricFamily("vgpud_scheduler_gpu_memory_allocated_mib",
                                "Device memory held by pods on a GPU (MiB)", labels=labels)
        cap = GaugeMetricFamily("vgpud_scheduler_gpu_memory_capacity_mib",
                                "Schedulable memory of a GPU (physical x scaling, MiB)",
                                labels=labels)
        cores = GaugeMetricFamily("vgpud_scheduler_gpu_cores_allocated_percent",
                                  "SM percent held by pods on a GPU", labels=labels)
        vgpus = GaugeMetricFamily("vgpud_scheduler_gpu_vgpus_allocated", "vGPUs (containers) on a GPU",
                                  labels=labels)
        c = self.alloc.cluster
        for name in list(c.node_index):
            for v in c.gpus(name):
                u = c.usage(name, v.gpu.uuid)
                lv = [name, v.gpu.uuid, v.gpu.model]
                mem.add_metric(lv, u.memory)
                cap.add_metric(lv, v.cap_memory)
                cores.add_metric(lv, u.cores)
                vgpus.add_metric(lv, u.vgpus)
        ledger = GaugeMetricFamily("vgpud_scheduler_ledger_entries", "Pods holding GPUs, by state",
                                   labels=["state"])
        counts: dict[str, int] = {}
        for e in self.alloc.ledger.entries():
            counts[e.state.value] = counts.get(e.state.value, 0) + 1
        for state in ("assumed", "confirmed"):
            ledger.add_metric([state], counts.get(state, 0))
        yield from (mem, cap, cores, vgpus, ledger)


class Metrics:
    def __init__(self, alloc: Allocator) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("vgpud_extender_requests", "Extender calls by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("vgpud_extender_latency_seconds", "Extender call latency",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("vgpud_extender_node_rejections",
                                  "Nodes rejected by filter, by reason code", ["code"],
                                  registry=self.registry)
        self.expired = Counter("vgpud_scheduler_ledger_expired", "Assumed placements never confirmed",
                               registry=self.registry)
        self.registry.register(_Allocation(alloc))
