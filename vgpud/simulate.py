"""``vgpud simulate``: the scheduler's core over a scenario, with no cluster.

Pods arrive in order (at their ``at`` time) and go through the same cycle the
extender runs — filter → score → choose devices → assume — on the same
:class:`~vgpud.core.allocate.Allocator`. Pods with a ``duration`` leave when it
ends; pending pods are retried, first come first served, whenever a pod leaves.
Time is virtual: a scenario of a day runs in milliseconds.

Priorities, both kinds:

* Kubernetes priority (``spec.priority``, or ``priorityClassName`` looked up in the
  scenario's ``priorityClasses``): a pod that fits nowhere preempts, as kube-scheduler
  with the extender's ``/preempt`` would: on each node the extender's victim choice
  (:func:`vgpud.core.preempt.select_victims`, with no CPU victims of kube-scheduler's
  own), then the node whose victims are least important (kube-scheduler's order:
  lowest highest-priority victim, then fewest). Victims are shown as ``preempted``
  and do not come back (a controller would recreate them as new pods).
* Run-time priority (``nvidia.com/vgpu-priority``): for every GPU the SM share each
  holder gets when all of them are busy (:func:`vgpud.core.arbitration.shares`).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vgpud.config import PluginSettings
from vgpud.core.allocate import Allocator
from vgpud.core.arbitration import Share, shares
from vgpud.core.model import ComputePolicy, Gpu, PodRequest, Reason
from vgpud.core.preempt import Holder, Proposal, select_victims
from vgpud.core.requests import RequestError, parse_pod
from vgpud.scenario import Scenario, build_nodes, settings_of


@dataclass
class PodResult:
    name: str
    namespace: str
    status: str  # placed | pending | rejected | preempted
    node: str | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    containers: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    arrived: float = 0.0
    started: float | None = None
    left: float | None = None
    priority: int = 0  # Kubernetes priority
    preempted: list[str] = field(default_factory=list)  # the pods it evicted

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "namespace": self.namespace, "status": self.status,
            "node": self.node, "devices": self.devices, "containers": self.containers,
            "reason": self.reason, "arrived": self.arrived, "started": self.started,
            "left": self.left, "priority": self.priority, "preempted": self.preempted,
        }


@dataclass
class GpuResult:
    node: str
    uuid: str
    index: int
    model: str
    memory: int  # capacity MiB (physical × scaling)
    memory_used: int
    cores: int
    cores_used: int
    split: int
    vgpus_used: int
    holders: list[tuple[str, int]]  # (pod, MiB)
    sm: list[tuple[str, float]] = field(default_factory=list)  # (pod, SM %) all busy
    mig: str = ""  # "mode": a GPU in MIG mode (its instances are rows of their own);
    # a MIG instance: its profile, and "(shared)" when it is shared in vGPUs


@dataclass
class SimResult:
    name: str
    pods: list[PodResult]
    gpus: list[GpuResult]

    @property
    def summary(self) -> dict[str, int]:
        out = {"placed": 0, "pending": 0, "rejected": 0, "preempted": 0}
        for p in self.pods:
            out[p.status] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary,
                "pods": [p.to_json() for p in self.pods],
                "gpus": [g.__dict__ for g in self.gpus]}


def _expand(s: Scenario) -> Iterator[tuple[float, float | None, dict[str, Any], str]]:
    for w_index, w in enumerate(s.workload):
        raw_meta = w.pod.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        base = str(meta.get("name") or meta.get("generateName") or f"pod-{w_index}").rstrip("-")
        for i in range(w.replicas):
            name = base if w.replicas == 1 else f"{base}-{i}"
            pod = dict(w.pod)
            pod["metadata"] = {**meta, "name": name, "uid": f"{s.name}/{w_index}/{i}",
                               "namespace": meta.get("namespace", "default")}
            yield w.at, w.duration, pod, name


def _priority(manifest: dict[str, Any], classes: dict[str, int]) -> int:
    spec = manifest.get("spec") or {}
    p = spec.get("priority")
    if isinstance(p, int) and not isinstance(p, bool):
        return p
    return classes.get(str(spec.get("priorityClassName") or ""), 0)


def run(s: Scenario) -> SimResult:
    """Run one scenario to its end."""
    settings = settings_of(s)
    defaults = settings.defaults()
    now = 0.0
    alloc = Allocator(defaults, clock=lambda: now)
    for node in build_nodes(s, settings):
        alloc.set_node(node)

    results: list[PodResult] = []
    # events: (time, order, kind, payload); departures (kind 0) before arrivals (kind 1)
    events: list[tuple[float, int, int, int]] = []
    pods: list[tuple[PodRequest | None, float | None]] = []
    for order, (at, duration, manifest, name) in enumerate(_expand(s)):
        res = PodResult(name=name, namespace=manifest["metadata"]["namespace"], status="pending",
                        arrived=at, priority=_priority(manifest, dict(s.priorityClasses)))
        try:
            req: PodRequest | None = parse_pod(manifest, defaults)
        except RequestError as e:
            req = None
            res.status, res.reason = "rejected", f"invalid request: {e}"
        if req is not None and not req.wants_gpu:
            res.status, res.reason = "rejected", "the pod asks for no vGPU"
            req = None
        results.append(res)
        pods.append((req, duration))
        heapq.heappush(events, (at, 1, order, order))
    waiting: list[int] = []
    by_uid = {req.uid: i for i, (req, _) in enumerate(pods) if req is not None}

    def holder(uid: str) -> Holder | None:
        e = alloc.ledger.get(uid)
        i = by_uid.get(uid)
        if e is None or i is None:
            return None
        r = results[i]
        return Holder(uid, r.namespace, r.name, r.priority, e.placement,
                      start_time=f"{r.started or 0:020.6f}")

    def preempt(i: int) -> bool:
        """kube-scheduler's PostFilter with the extender's victims; True if it evicted."""
        req, _ = pods[i]
        assert req is not None
        me = results[i]
        best: tuple[tuple[int, int], str, tuple[str, ...]] | None = None
        for node in alloc.cluster.node_names:
            if not alloc.cluster.has_node(node):
                continue
            holders = [h for e in alloc.ledger.on_node(node) if (h := holder(e.uid))]
            got = select_victims(alloc.cluster, req, me.priority, node, Proposal(()), holders)
            if got.victims is None or not got.victims:
                continue
            prios = [results[by_uid[u]].priority for u in got.victims]
            rank = (max(prios), len(prios))
            if best is None or rank < best[0]:
                best = (rank, node, got.victims)
        if best is None:
            return False
        for uid in best[2]:
            j = by_uid[uid]
            alloc.forget(uid)
            results[j].status, results[j].left = "preempted", now
            results[j].reason = f"preempted by {me.name} (priority {me.priority})"
            me.preempted.append(results[j].name)
        return True

    def try_place(i: int) -> bool:
        req, duration = pods[i]
        assert req is not None
        decision = alloc.schedule(req)
        res = results[i]
        if decision.placement is None:
            assert isinstance(decision.reason, Reason)
            res.reason = decision.reason.message
            return False
        alloc.confirm(req.uid, req.key, decision.placement)
        res.status, res.node, res.reason, res.started = "placed", decision.placement.node, None, now
        res.containers = [
            {"name": c.name, "init": c.init,
             "devices": [{"uuid": d.uuid, "memory": d.memory, "cores": d.cores}
                         for d in c.devices]}
            for c in decision.placement.containers]
        res.devices = [d for c in res.containers for d in c["devices"]]
        if duration is not None:
            heapq.heappush(events, (now + duration, 0, i, i))
        return True

    while events:
        now, kind, _, i = heapq.heappop(events)
        if kind == 0:  # departure
            req, _ = pods[i]
            assert req is not None
            alloc.forget(req.uid)
            results[i].left = now
            still = []
            for j in waiting:
                if not try_place(j):
                    still.append(j)
            waiting = still
        elif pods[i][0] is not None and not try_place(i) and not (
                results[i].priority > 0 and preempt(i) and try_place(i)):
            waiting.append(i)
    return SimResult(s.name, results, _gpus(alloc, results, pods, settings.plugin))


def _gpus(alloc: Allocator, results: list[PodResult],
          pods: list[tuple[PodRequest | None, float | None]],
          plugin: PluginSettings) -> list[GpuResult]:
    holders: dict[tuple[str, str], list[tuple[str, int]]] = {}
    users: dict[tuple[str, str], list[Share]] = {}
    for r, (req, _) in zip(results, pods, strict=True):
        if r.status == "placed" and r.left is None and r.node is not None:
            assert req is not None
            for d in r.devices:
                holders.setdefault((r.node, d["uuid"]), []).append((r.name, d["memory"]))
                users.setdefault((r.node, d["uuid"]), []).append(Share(
                    r.name, req.priority, d["cores"] % 100,
                    req.compute_policy if d["cores"] else ComputePolicy.NONE, busy=True))
    out = []
    c = alloc.cluster
    for name in sorted(c.node_index):
        for v in c.gpus(name):
            u = c.usage(name, v.gpu.uuid)
            sm = shares(users.get((name, v.gpu.uuid), []), plugin.priorityFloorPercent)
            out.append(GpuResult(name, v.gpu.uuid, v.gpu.index, v.gpu.model, v.cap_memory,
                                 u.memory, v.cap_cores, u.cores, v.gpu.split, u.vgpus,
                                 holders.get((name, v.gpu.uuid), []),
                                 sorted(sm.items(), key=lambda kv: -kv[1]), _mig(v.gpu)))
    return out


def _mig(g: Gpu) -> str:
    if g.mig:
        return "mode"
    if g.parent:
        return g.profile or "shared"
    return ""


# -- rendering ------------------------------------------------------------------------------------

def render_json(results: list[SimResult]) -> str:
    if len(results) == 1:
        return json.dumps(results[0].to_json(), indent=2)
    total = {"placed": 0, "pending": 0, "rejected": 0, "preempted": 0}
    pods = []
    for r in results:
        for k, v in r.summary.items():
            total[k] += v
        pods += [{**p.to_json(), "scenario": r.name} for p in r.pods]
    return json.dumps({"summary": total, "pods": pods,
                       "scenarios": [r.to_json() for r in results]}, indent=2)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def render_text(results: list[SimResult], *, max_pods: int = 200) -> str:
    out = []
    for r in results:
        s = r.summary
        out.append(f"== {r.name}: {s['placed']} placed, {s['pending']} pending"
                   + (f", {s['rejected']} rejected" if s["rejected"] else "")
                   + (f", {s['preempted']} preempted" if s["preempted"] else ""))
        rows = [["POD", "STATUS", "NODE", "GPUS (MiB, cores %)", "REASON"]]
        for p in r.pods[:max_pods]:
            devs = " ".join(f"{d['uuid']}:{d['memory']}/{d['cores']}%" for d in p.devices)
            status = (p.status if p.left is None else "preempted" if p.status == "preempted"
                      else f"left@{p.left:g}s")
            reason = p.reason or (f"preempted {', '.join(p.preempted)}" if p.preempted else "")
            rows.append([p.name, status, p.node or "-", devs or "-", reason])
        out.append(_table(rows))
        if len(r.pods) > max_pods:
            out.append(f"… and {len(r.pods) - max_pods} more pods (use --output json)")
        out.append("")
        rows = [["NODE", "GPU", "MODEL", "VGPUS", "MEMORY MiB", "CORES %",
                 "SM % WHEN ALL BUSY"]]
        for g in r.gpus[:max_pods]:
            sm = " ".join(f"{pod}:{pct:.0f}" for pod, pct in g.sm[:6])
            if len(g.sm) > 6:
                sm += " …"
            if g.mig == "mode":
                rows.append([g.node, str(g.index), g.model, "MIG mode", "-", "-", "-"])
                continue
            rows.append([g.node, str(g.index), g.model, f"{g.vgpus_used}/{g.split}",
                         f"{g.memory_used}/{g.memory}", f"{g.cores_used}/{g.cores}", sm or "-"])
        out.append(_table(rows))
        out.append("")
    return "\n".join(out)


def render_plot(results: list[SimResult], path: str) -> None:
    """Per-GPU memory allocation as stacked bars, one panel per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, squeeze=False,
                             figsize=(9, max(2.5, sum(0.35 * len(r.gpus) + 1 for r in results))))
    for ax, r in zip(axes[:, 0], results, strict=True):
        labels = [f"{g.node}/{g.index}" for g in r.gpus]
        for y, g in enumerate(r.gpus):
            left = 0
            for pod, mib in g.holders:
                ax.barh(y, mib, left=left, edgecolor="white", linewidth=0.5)
                if mib > g.memory * 0.08:
                    ax.text(left + mib / 2, y, pod.rsplit("-", 1)[-1], ha="center",
                            va="center", fontsize=7)
                left += mib
            ax.plot([g.memory, g.memory], [y - 0.4, y + 0.4], color="black")
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("MiB allocated (black bar: capacity)")
        s = r.summary
        ax.set_title(f"{r.name}: {s['placed']} placed, {s['pending']} pending")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
