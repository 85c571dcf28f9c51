"""The allocator: one object that the extender, the simulator and the tests drive.

It owns a :class:`~vgpud.core.cluster.Cluster` and a :class:`~vgpud.core.ledger.Ledger`
and answers the scheduler's questions as values:

* :meth:`Allocator.filter` — every feasible candidate node, and a :class:`Reason` for
  each rejected one (resolvable or not);
* :meth:`Allocator.prioritize` — a 0–10 score per node from the pod's node policy and
  topology fit;
* :meth:`Allocator.place` — the GPUs of one node for every container;
* :meth:`Allocator.schedule` — filter → score → best node → place → assume, the
  whole cycle as the simulator runs it.

Time comes from an injected clock (seconds, monotonic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vgpud.core.choose import place
from vgpud.core.cluster import Cluster
from vgpud.core.fit import filter_nodes
from vgpud.core.ledger import Entry, Ledger
from vgpud.core.model import Defaults, Node, Placement, PodRequest, Policy, Reason

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority

NO_INVENTORY = Reason("no-inventory", "node has no vgpud GPU inventory (is the vgpud plugin "
                      "running there?)", False)


@dataclass(frozen=True, slots=True)
class Filtered:
    feasible: list[str]
    failed: dict[str, Reason]


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one scheduling cycle."""

    pod: PodRequest
    placement: Placement | None
    reason: Reason | None
    feasible: int = 0


class Allocator:
    def __init__(self, defaults: Defaults | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.defaults = defaults or Defaults()
        self.clock = clock or _no_clock
        self.cluster = Cluster()
        self.ledger = Ledger(self.cluster, ttl=self.defaults.assume_ttl)

    # -- inventory -------------------------------------------------------------------------------

    def set_node(self, node: Node) -> None:
        self.cluster.set_node(node)

    def remove_node(self, name: str) -> None:
        self.cluster.remove_node(name)

    # -- questions -------------------------------------------------------------------------------

    def _indices(self, names: Sequence[str] | None,
                 ) -> tuple[npt.NDArray[np.int64] | None, dict[str, Reason]]:
        if names is None:
            return None, {}
        index = self.cluster.node_index
        idx = []
        unknown: dict[str, Reason] = {}
        for n in names:
            i = index.get(n)
            if i is None:
                unknown[n] = NO_INVENTORY
            else:
                idx.append(i)
        return np.fromiter(idx, dtype=np.int64, count=len(idx)), unknown

    def filter(self, pod: PodRequest, candidates: Sequence[str] | None = None) -> Filtered:
        """Every feasible candidate and why each other one is not (all nodes if None)."""
        idx, failed = self._indices(candidates)
        res = filter_nodes(self.cluster, pod, idx)
        names = self.cluster.node_names
        for i, reason in res.failed.items():
            failed[names[i]] = reason
        feasible = [names[i] for i in res.feasible.tolist()]
        if not res.exact:
            confirmed = []
            for n in feasible:
                got = place(self.cluster, pod, n)
                if isinstance(got, Reason):
                    failed[n] = got
                else:
                    confirmed.append(n)
            feasible = confirmed
        return Filtered(feasible, failed)

    def prioritize(self, pod: PodRequest, nodes: Sequence[str]) -> dict[str, float]:
        """Scores in [0, 10] (floats; the extender rounds them) for feasible nodes."""
        if not nodes:
            return {}
        idx, _ = self._indices(nodes)
        assert idx is not None
        known = [n for n in nodes if n in self.cluster.node_index]
        c = self.cluster
        n = c.slots
        n_nodes = len(c.node_names)
        live = c.alive[:n]
        node_of = np.where(live, c.node_of[:n], n_nodes)

        def per_node(values: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
            out: npt.NDArray[np.float64] = np.bincount(
                node_of, weights=values, minlength=n_nodes + 1)[idx].astype(np.float64)
            return out

        cap_mem = per_node(c.cap_mem[:n])
        used_mem = per_node(c.used_mem[:n])
        cap_cores = per_node(c.cap_cores[:n])
        used_cores = per_node(c.used_cores[:n])
        gpus = np.bincount(node_of, minlength=n_nodes + 1)[idx].astype(np.float64)
        mean_cap = np.divide(cap_mem, gpus, out=np.zeros_like(cap_mem), where=gpus > 0)
        main = [x for x in pod.containers if x.sidecar or not x.init]
        want_mem = np.zeros(len(idx))
        want_cores = 0.0
        for x in main:
            if x.memory is not None:
                want_mem += x.number * x.memory
            else:
                want_mem += x.number * mean_cap * (x.memory_percent or 100) / 100
            want_cores += x.number * x.cores
        with np.errstate(divide="ignore", invalid="ignore"):
            mem_util = np.clip(np.where(cap_mem > 0, (used_mem + want_mem) / cap_mem, 1.0), 0, 1)
            core_util = np.clip(np.where(cap_cores > 0, (used_cores + want_cores) / cap_cores,
                                         1.0), 0, 1)
        util = (mem_util + core_util) / 2
        policy = util if pod.node_policy is Policy.BINPACK else 1.0 - util
        scores = policy * MAX_SCORE
        if any(x.number > 1 for x in main):
            topo = np.array([self._topology_fit(pod, name) for name in known])
            scores = 0.7 * scores + 0.3 * topo * MAX_SCORE
        return {name: float(s) for name, s in zip(known, scores.tolist(), strict=True)}

    def _topology_fit(self, pod: PodRequest, node: str) -> float:
        """1.0 when every multi-GPU container's GPUs share a NUMA node or are NVLinked."""
        got = place(self.cluster, pod, node)
        if isinstance(got, Reason):
            return 0.0
        views = {v.gpu.uuid: v.gpu for v in self.cluster.gpus(node)}
        pairs = good = 0
        for cg in got.containers:
            uuids = [d.uuid for d in cg.devices]
            for i, a in enumerate(uuids):
                for b in uuids[i + 1:]:
                    pairs += 1
                    ga, gb = views[a], views[b]
                    if b in ga.links or a in gb.links:
                        good += 2
                    elif ga.numa == gb.numa:
                        good += 1
        return 1.0 if pairs == 0 else good / (2 * pairs)

    def place(self, pod: PodRequest, node: str) -> Placement | Reason:
        return place(self.cluster, pod, node)

    # -- the ledger ------------------------------------------------------------------------------

    def assume(self, pod: PodRequest, placement: Placement) -> Reason | None:
        return self.ledger.assume(pod.uid, pod.key, placement, self.clock())

    def confirm(self, uid: str, key: str, placement: Placement) -> None:
        self.ledger.confirm(uid, key, placement)

    def forget(self, uid: str) -> bool:
        return self.ledger.forget(uid)

    def expire(self) -> list[Entry]:
        return self.ledger.expire(self.clock())

    # -- the whole cycle -------------------------------------------------------------------------

    def schedule(self, pod: PodRequest, candidates: Sequence[str] | None = None) -> Decision:
        """Filter, score, pick the best node (ties: first candidate), place and assume."""
        if not pod.wants_gpu:
            return Decision(pod, None, Reason("no-gpu", "the pod asks for no vGPU", False))
        got = self.filter(pod, candidates)
        if not got.feasible:
            return Decision(pod, None, summarize(got.failed))
        scores = self.prioritize(pod, got.feasible)
        best = max(got.feasible, key=lambda n: scores.get(n, 0.0))
        placement = self.place(pod, best)
        if isinstance(placement, Reason):
            return Decision(pod, None, placement, len(got.feasible))
        why = self.assume(pod, placement)
        if why is not None:
            return Decision(pod, None, why, len(got.feasible))
        return Decision(pod, placement, None, len(got.feasible))


def summarize(failed: dict[str, Reason]) -> Reason:
    """One reason for a pod that fits nowhere, like kube-scheduler's '0/N nodes…'."""
    if not failed:
        return Reason("no-nodes", "0 nodes are available", False)
    counts: dict[str, int] = {}
    for r in failed.values():
        counts[r.message] = counts.get(r.message, 0) + 1
    parts = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n} × {msg}" for msg, n in parts[:4])
    more = len(parts) - 4
    if more > 0:
        text += f", and {more} other reasons"
    resolvable = any(r.resolvable for r in failed.values())
    return Reason("unschedulable", f"0/{len(failed)} nodes fit: {text}", resolvable)


def _no_clock() -> float:
    return 0.0
