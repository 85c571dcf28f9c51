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

Between prioritize and bind a pod is *intended* for its best-scored nodes, with the
GPUs it would get on each (:meth:`Allocator.intend`; its bind takes those GPUs while
they have room): kube-scheduler will most likely bind it to one, but the
extender only learns at bind, and pods scored meanwhile would chase the same room (a
bind race: the later bind no longer fits and is retried). An intent is not a hold —
filter stays exact and ignores it — but scoring does not: a node on which the pod no
longer fits once the other pods' intents there are counted scores 0. An intent ends at
the pod's bind (assume) or after :data:`INTENT_TTL`.

Prioritize reuses the filter's work for the same pod while nothing changed (same
candidates, inventory and usage).

Time comes from an injected clock (seconds, monotonic).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vgpud.core.choose import never_fits, place, place_released
from vgpud.core.cluster import Cluster
from vgpud.core.fit import FilterResult, filter_nodes, topology_fit
from vgpud.core.ledger import Entry, Ledger
from vgpud.core.model import (
    ZERO,
    Defaults,
    GpuUsage,
    Node,
    Placement,
    PodRequest,
    Policy,
    Reason,
    phases,
)

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
INTENT_TTL = 2.0  # seconds an intent outlives its prioritize without a bind
MAX_INTENTS = 256  # past this many, expired intents are swept when a new one comes
MAX_TIED = 8  # top-scored nodes an intent covers (kube-scheduler picks one at random)

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
        self._index_cache: dict[tuple[tuple[str, ...], int], tuple[
            npt.NDArray[np.int64], dict[str, Reason], npt.NDArray[np.int64]]] = {}
        # the last filter: (pod uid, generations), its candidates (None: all) and result
        self._last: tuple[tuple[str, int, int], npt.NDArray[np.int64] | None,
                          FilterResult] | None = None
        # intents: pod uid -> (per node, the placement it would get there; deadline)
        self._intents: dict[str, tuple[dict[str, Placement], float]] = {}
        self._intended: dict[str, dict[str, None]] = {}  # node -> uids intended there

    # -- inventory -------------------------------------------------------------------------------

    def set_node(self, node: Node) -> None:
        self.cluster.set_node(node)

    def remove_node(self, name: str) -> None:
        self.cluster.remove_node(name)

    # -- questions -------------------------------------------------------------------------------

    def _indices(self, names: Sequence[str] | None, *, ascending: bool = False,
                 ) -> tuple[npt.NDArray[np.int64] | None, dict[str, Reason]]:
        """Candidate names to node indices (cached: kube-scheduler sends the same list
        for pod after pod), and the names this allocator has no inventory for. The
        indices are in the names' order, or ``ascending`` and each once (a filter's
        candidate set)."""
        if names is None:
            return None, {}
        key = (tuple(names), self.cluster.generation)
        hit = self._index_cache.get(key)
        if hit is None:
            # at C speed (3,250 names of 65,000 nodes: about 0.6 ms, most of it cache
            # misses in the name table); -1: a name with no inventory
            arr = np.fromiter(map(self.cluster.node_index.get, names, itertools.repeat(-1)),
                              dtype=np.int64, count=len(names))
            unknown: dict[str, Reason] = {}
            if len(arr) and arr.min() < 0:
                unknown = {n: NO_INVENTORY for n, i in zip(names, arr.tolist(), strict=True)
                           if i < 0}
                arr = arr[arr >= 0]
            ordered = np.sort(arr)  # np.unique costs ten times a sort: only for repeats
            if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
                ordered = np.unique(ordered)
            if len(self._index_cache) >= 4:
                self._index_cache.pop(next(iter(self._index_cache)))
            hit = self._index_cache[key] = (arr, unknown, ordered)
        return hit[2] if ascending else hit[0], dict(hit[1])

    def _key(self, pod: PodRequest) -> tuple[str, int, int]:
        return (pod.uid, self.cluster.generation, self.cluster.usage_generation)

    def _reuse(self, pod: PodRequest, nodes: npt.NDArray[np.int64]) -> FilterResult | None:
        """The last filter's result, if it was this pod's, nothing changed since, and it
        covered ``nodes``."""
        last = self._last
        if last is None or not pod.uid or last[0] != self._key(pod):
            return None
        if last[1] is not None and not bool(np.isin(nodes, last[1]).all()):
            return None
        return last[2]

    def _filter(self, pod: PodRequest, idx: npt.NDArray[np.int64] | None, *, reasons: bool,
                ) -> tuple[FilterResult, npt.NDArray[np.int64], dict[int, Reason]]:
        res = filter_nodes(self.cluster, pod, idx, reasons=reasons)
        if pod.uid:
            self._last = (self._key(pod), idx, res)
        feasible = res.feasible
        failed = dict(res.failed)
        if not res.exact:
            keep = []
            names = self.cluster.node_names
            for i in feasible.tolist():
                got = place(self.cluster, pod, names[i])
                if isinstance(got, Reason):
                    failed[i] = got
                else:
                    keep.append(i)
            feasible = np.array(keep, dtype=np.int64)
            if reasons:
                self._settle(pod, res.failed, failed)
        return res, feasible, failed

    def _settle(self, pod: PodRequest, vector: dict[int, Reason],
                failed: dict[int, Reason]) -> None:
        """The vector filter checks a pod's containers one at a time; for a pod it is not
        exact for, a node it refused as *resolvable* may still never fit the pod as a
        whole. Decided by a placement on the empty node, once per hardware shape."""
        by_shape: dict[int, str | None] = {}
        per_uuid = bool(pod.include_uuids or pod.exclude_uuids)
        names = self.cluster.node_names
        for i, r in vector.items():
            if not r.resolvable:
                continue
            shape = self.cluster.node_shape[i]
            if per_uuid or shape not in by_shape:
                why = never_fits(self.cluster, pod, names[i])
                if not per_uuid:
                    by_shape[shape] = why
            else:
                why = by_shape[shape]
            if why is not None:
                failed[i] = Reason("never-fits", f"{why} (even with no other pod on the node)",
                                   False)

    def filter(self, pod: PodRequest, candidates: Sequence[str] | None = None) -> Filtered:
        """Every feasible candidate and why each other one is not (all nodes if None)."""
        idx, failed = self._indices(candidates, ascending=True)
        _, feasible, failed_idx = self._filter(pod, idx, reasons=True)
        names = self.cluster.node_names
        for i, reason in failed_idx.items():
            failed[names[i]] = reason
        return Filtered([names[i] for i in feasible.tolist()], failed)

    def _scores(self, pod: PodRequest, res: FilterResult | None, nodes: npt.NDArray[np.int64],
                ) -> npt.NDArray[np.float64]:
        c = self.cluster
        cap_mem = c.node_cap_mem[nodes]
        cap_cores = c.node_cap_cores[nodes]
        gpus = c.node_count[nodes].astype(np.float64)
        mean_cap = np.divide(cap_mem, gpus, out=np.zeros_like(cap_mem), where=gpus > 0)
        main = phases(pod.containers)[0]
        want_mem = np.zeros(len(nodes))
        want_cores = 0.0
        for x in main:
            if x.memory is not None:
                want_mem += x.number * x.memory
            else:
                want_mem += x.number * mean_cap * (x.memory_percent or 100) / 100
            want_cores += x.number * x.cores
        with np.errstate(divide="ignore", invalid="ignore"):
            mem_util = np.where(cap_mem > 0, (c.node_used_mem[nodes] + want_mem) / cap_mem, 1.0)
            core_util = np.where(cap_cores > 0,
                                 (c.node_used_cores[nodes] + want_cores) / cap_cores, 1.0)
        util = (np.clip(mem_util, 0, 1) + np.clip(core_util, 0, 1)) / 2
        policy = util if pod.node_policy is Policy.BINPACK else 1.0 - util
        scores: npt.NDArray[np.float64] = policy * MAX_SCORE
        if any(x.number > 1 for x in main):
            if res is None:
                res = filter_nodes(c, pod, nodes, reasons=False)
            scores = 0.7 * scores + 0.3 * topology_fit(c, res, nodes) * MAX_SCORE
        if self._intended:
            self._discount_intents(pod, nodes, scores)
        return scores

    # -- intents: pods scored, not yet bound --------------------------------------------------

    def intend(self, pod: PodRequest, nodes: Sequence[str]) -> list[str]:
        """``pod`` was scored best on ``nodes`` (kube-scheduler breaks a tie among them at
        random): until its bind (or :data:`INTENT_TTL`), other pods' scores count what it
        would take on each of them. Returns the nodes (of the first :data:`MAX_TIED`) it
        still fits, beside the other intents there; the intent covers those."""
        self._drop_intent(pod.uid)
        now = self.clock()
        if len(self._intents) > MAX_INTENTS:  # pods scored and never bound: let them go
            for uid in [u for u, (_, t) in self._intents.items() if t < now]:
                self._drop_intent(uid)
        where: dict[str, Placement] = {}
        for node in nodes[:MAX_TIED]:
            if not self.cluster.has_node(node):
                continue
            # its GPUs as they would be chosen beside the other pods' intents there, so
            # that two intents never count on the same room
            got = self._beside_intents(pod, node, now) or place(self.cluster, pod, node)
            if isinstance(got, Placement):
                where[node] = got
                self._intended.setdefault(node, {})[pod.uid] = None
        if where:
            self._intents[pod.uid] = (where, now + INTENT_TTL)
        return list(where)

    def _drop_intent(self, uid: str) -> None:
        old = self._intents.pop(uid, None)
        if old is not None:
            for node in old[0]:
                uids = self._intended[node]
                uids.pop(uid, None)
                if not uids:
                    del self._intended[node]

    def intents(self) -> int:
        """Intents outstanding (expired ones are dropped as they are met)."""
        return len(self._intents)

    def _beside_intents(self, pod: PodRequest, node: str, now: float,
                        ) -> Placement | str | None:
        """Where ``pod`` would go on ``node`` with what the other pods' live intents there
        would hold counted as held (a what-if), or why it would not fit; None when no
        other pod intends ``node``."""
        extra: dict[str, GpuUsage] = {}
        for other in list(self._intended.get(node, ())):
            placements, deadline = self._intents[other]
            if deadline < now:
                self._drop_intent(other)
            elif other != pod.uid:
                for uuid, u in placements[node].charge().items():
                    extra[uuid] = extra.get(uuid, ZERO) + u
        if not extra:
            return None
        return place_released(self.cluster, pod, node, {u: ZERO - x for u, x in extra.items()})

    def _discount_intents(self, pod: PodRequest, nodes: npt.NDArray[np.int64],
                          scores: npt.NDArray[np.float64]) -> None:
        """Score 0 where ``pod`` no longer fits once other pods' intents are counted."""
        now = self.clock()
        names = self.cluster.node_names
        where = {names[i]: k for k, i in enumerate(nodes.tolist())}
        for node in [n for n in self._intended if n in where]:
            if isinstance(self._beside_intents(pod, node, now), str):
                scores[where[node]] = 0.0

    def prioritize(self, pod: PodRequest, nodes: Sequence[str]) -> dict[str, float]:
        """Scores in [0, 10] (floats; the extender rounds them) for the given nodes."""
        known, scores = self.score_array(pod, nodes)
        return dict(zip(known, scores.tolist(), strict=True))

    def score_array(self, pod: PodRequest, nodes: Sequence[str],
                    ) -> tuple[list[str], npt.NDArray[np.float64]]:
        """The nodes this allocator knows, in the given order, and their scores."""
        if not nodes:
            return [], np.zeros(0)
        idx, unknown = self._indices(nodes)
        assert idx is not None
        known = list(nodes) if not unknown else [n for n in nodes if n not in unknown]
        return known, self._scores(pod, self._reuse(pod, idx), idx)

    def place(self, pod: PodRequest, node: str) -> Placement | Reason:
        """The GPUs of ``node`` for ``pod``: the ones its intent there named, while they
        still have room (the other pods' scores counted exactly those), else a fresh
        choice."""
        intent = self._intents.get(pod.uid)
        if intent is not None and node in intent[0] and intent[1] >= self.clock():
            p = intent[0][node]
            if self.ledger.room(p) is None:
                return p
        return place(self.cluster, pod, node)

    # -- the ledger ------------------------------------------------------------------------------

    def assume(self, pod: PodRequest, placement: Placement) -> Reason | None:
        self._drop_intent(pod.uid)
        return self.ledger.assume(pod.uid, pod.key, placement, self.clock())

    def confirm(self, uid: str, key: str, placement: Placement) -> None:
        self.ledger.confirm(uid, key, placement)

    def forget(self, uid: str) -> bool:
        self._drop_intent(uid)
        return self.ledger.forget(uid)

    def expire(self) -> list[Entry]:
        return self.ledger.expire(self.clock())

    # -- the whole cycle -------------------------------------------------------------------------

    def schedule(self, pod: PodRequest, candidates: Sequence[str] | None = None) -> Decision:
        """Filter, score, pick the best node (ties: the first), place and assume."""
        if not pod.wants_gpu:
            return Decision(pod, None, Reason("no-gpu", "the pod asks for no vGPU", False))
        idx, _ = self._indices(candidates, ascending=True)
        res, feasible, _ = self._filter(pod, idx, reasons=False)
        if len(feasible) == 0:
            return Decision(pod, None, summarize(self.filter(pod, candidates).failed))
        scores = self._scores(pod, res, feasible)
        best = self.cluster.node_names[int(feasible[int(np.argmax(scores))])]
        placement = self.place(pod, best)
        if isinstance(placement, Reason):
            return Decision(pod, None, placement, len(feasible))
        why = self.assume(pod, placement)
        if why is not None:
            return Decision(pod, None, why, len(feasible))
        return Decision(pod, placement, None, len(feasible))


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
