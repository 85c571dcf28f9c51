"""Which nodes and GPUs can hold a pod, and why the others cannot.

Two forms of the same predicates:

* :func:`filter_nodes` evaluates them for every GPU of every candidate node at once
  (numpy), counts per node the GPUs that pass, and names for each rejected node the
  first predicate that left it short. For a pod with one GPU container and no NVLink
  constraint this count *is* the answer; otherwise it is a necessary condition and
  the exact answer comes from :func:`vgpud.core.choose.place` on the survivors.
* :func:`gpu_reason` checks one GPU for one container (used while choosing devices).

Predicates come in two kinds. *Static* ones (health, MIG, type and uuid filters,
capacity) fail whatever else runs on the node: the reason is unresolvable. *Dynamic*
ones (free split slots, free memory, free cores, idle GPU) would pass if other pods
left: the reason is resolvable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vgpud.core.cluster import Cluster, GpuView
from vgpud.core.model import ContainerRequest, PodRequest, Reason, TopologyMode

NUMA_BUCKETS = 9  # NUMA ids -1..7 are told apart; larger ids share the last bucket


def needed_memory(c: ContainerRequest, cap_memory: int) -> int:
    """MiB one vGPU of this container takes on a GPU of this capacity."""
    if c.memory is not None:
        return c.memory
    pct = c.memory_percent if c.memory_percent is not None else 100
    return cap_memory * pct // 100


def type_matches(model: str, patterns: Sequence[str]) -> bool:
    """HAMi's rule: a pattern matches a model whose name contains it (case-insensitive)."""
    m = model.lower()
    return any(p.lower() in m for p in patterns)


def gpu_static_ok(pod: PodRequest, model: str, uuid: str) -> bool:
    if pod.include_types and not type_matches(model, pod.include_types):
        return False
    if pod.exclude_types and type_matches(model, pod.exclude_types):
        return False
    if pod.include_uuids and uuid not in pod.include_uuids:
        return False
    return not (pod.exclude_uuids and uuid in pod.exclude_uuids)


def gpu_reason(pod: PodRequest, c: ContainerRequest, g: GpuView, *, free_memory: int,
               free_cores: int, free_split: int, used_vgpus: int, exclusive: bool) -> str | None:
    """Why GPU ``g`` (with the given free amounts) cannot take one vGPU of ``c``; None if it can."""
    gpu = g.gpu
    if not gpu.healthy:
        return "unhealthy"
    if gpu.mig:
        return "in MIG mode"
    if not gpu_static_ok(pod, gpu.model, gpu.uuid):
        return "excluded by the pod's GPU type/uuid filters"
    need = needed_memory(c, g.cap_memory)
    if need > g.cap_memory or c.cores > g.cap_cores:
        return "too small"
    if free_split < 1:
        return "split count used up"
    if exclusive:
        return "held whole by another container"
    if c.exclusive and used_vgpus > 0:
        return "not idle (a whole-GPU request needs an idle GPU)"
    if need > free_memory:
        return f"{free_memory} MiB free, needs {need}"
    if c.cores > free_cores:
        return f"{free_cores}% cores free, needs {c.cores}"
    return None


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Per candidate node: feasible (by the vector predicates) or a reason."""

    feasible: npt.NDArray[np.int64]  # node indices, ascending
    failed: dict[int, Reason]  # filled only when reasons were asked for
    exact: bool  # True when ``feasible`` needs no per-node confirmation
    masks: tuple[tuple[ContainerRequest, npt.NDArray[np.bool_]], ...]  # per shape: GPUs that fit
    slot_node: npt.NDArray[np.int64]  # node index of each slot looked at (dead: past the end)
    slots: npt.NDArray[np.int64] | None  # the slots looked at (None: all of them)

    def take(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """A per-slot cluster array, restricted to the slots this result looked at."""
        return values[: len(self.slot_node)] if self.slots is None else values[self.slots]


_Stage = tuple[str, str, bool]  # code, message template, resolvable


def _stage_reason(stage: _Stage, have: int, need: int, c: ContainerRequest,
                  cache: dict[tuple[str, int, int, str], Reason]) -> Reason:
    code, template, resolvable = stage
    key = (code, have, need, c.name)
    r = cache.get(key)
    if r is None:
        mem = f"{c.memory} MiB" if c.memory is not None else f"{c.memory_percent}% of memory"
        msg = template.format(have=have, need=need, mem=mem, cores=c.cores, name=c.name)
        r = cache[key] = Reason(code, msg, resolvable)
    return r


_STAGES: tuple[_Stage, ...] = (
    ("no-gpus", "container {name} needs {need} GPU(s); the node has {have}", False),
    ("unhealthy", "container {name} needs {need} healthy GPU(s); the node has {have}", False),
    ("mig", "container {name} needs {need} GPU(s) not in MIG mode; the node has {have}", False),
    ("gpu-filter", "container {name} needs {need} GPU(s) matching the pod's GPU type/uuid "
     "filters; the node has {have}", False),
    ("too-small", "container {name} needs {need} GPU(s) with room for {mem} and {cores}% "
     "cores; the node has {have} that large", False),
    ("split", "container {name} needs {need} GPU(s) with a free vGPU slot; the node has {have} "
     "(split count used up)", True),
    ("exclusive", "container {name} needs {need} GPU(s) not held whole by another container; "
     "the node has {have}", True),
    ("idle", "container {name} needs {need} idle GPU(s) for a whole-GPU request; the node has "
     "{have}", True),
    ("memory", "container {name} needs {need} GPU(s) with {mem} free; the node has {have}", True),
    ("cores", "container {name} needs {need} GPU(s) with {cores}% cores free; the node has "
     "{have}", True),
)
_NUMA = ("numa", "container {name} needs {need} GPU(s) on one NUMA node; none has that many "
         "free", True)
_NUMA_STATIC = ("numa", "container {name} needs {need} GPU(s) on one NUMA node; none has "
                "that many", False)


def _lut(cluster: Cluster, pod: PodRequest) -> npt.NDArray[np.bool_] | None:
    if not (pod.include_types or pod.exclude_types):
        return None
    lut = np.ones(len(cluster.type_names), dtype=np.bool_)
    for tid, model in enumerate(cluster.type_names):
        if pod.include_types and not type_matches(model, pod.include_types):
            lut[tid] = False
        if pod.exclude_types and type_matches(model, pod.exclude_types):
            lut[tid] = False
    return lut


def _uuid_mask(cluster: Cluster, pod: PodRequest, n: int) -> npt.NDArray[np.bool_] | None:
    if not (pod.include_uuids or pod.exclude_uuids):
        return None
    mask = np.zeros(n, dtype=np.bool_) if pod.include_uuids else np.ones(n, dtype=np.bool_)
    for idx in cluster.live_node_indices():
        node = cluster.nodes[idx]
        if node is None:
            continue
        for k, g in zip(cluster.node_slots(idx), node.inventory.devices, strict=True):
            if pod.include_uuids and g.uuid in pod.include_uuids:
                mask[k] = True
            if pod.exclude_uuids and g.uuid in pod.exclude_uuids:
                mask[k] = False
    return mask


def filter_nodes(cluster: Cluster, pod: PodRequest,
                 candidates: npt.NDArray[np.int64] | None = None, *,
                 reasons: bool = True) -> FilterResult:
    """Evaluate every GPU predicate for every container of ``pod`` on every candidate.

    With ``reasons=False`` the rejected nodes are only left out (the simulator's and
    the benchmark's path); the extender asks for the reasons.
    """
    n_nodes = len(cluster.node_names)
    cand_mask = np.zeros(n_nodes + 1, dtype=np.bool_)
    slots: npt.NDArray[np.int64] | None
    if candidates is None or 2 * len(candidates) > cluster.n_nodes():
        # All (or most) nodes: a slice of every array beats gathering their slots.
        if candidates is None:
            cand_mask[:n_nodes] = True
            for i in cluster.free_node_indices():
                cand_mask[i] = False
        else:
            cand_mask[candidates] = True
        slots = None
        n = cluster.slots

        def take(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return values[:n]
    else:
        # Only the candidates' GPUs: kube-scheduler sends a tenth of a large cluster.
        cand_mask[candidates] = True
        sel = slots = cluster.slots_of(candidates)
        n = len(sel)

        def take(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return values[sel]
    alive = take(cluster.alive)
    slot_node = np.where(alive, take(cluster.node_of), n_nodes).astype(np.int64)
    slot_node = np.where(cand_mask[slot_node], slot_node, n_nodes)
    cap_mem = take(cluster.cap_mem)
    cap_cores = take(cluster.cap_cores)
    cap_split = take(cluster.cap_split)
    used_split = take(cluster.used_split)
    excl = take(cluster.excl)
    free_mem = cap_mem - take(cluster.used_mem)
    free_cores = cap_cores - take(cluster.used_cores)
    free_split = cap_split - used_split
    numa_of = take(cluster.numa)
    filt: npt.NDArray[np.bool_] | None = None
    lut = _lut(cluster, pod)
    if lut is not None:
        filt = lut[take(cluster.type_id)]
    um = _uuid_mask(cluster, pod, cluster.slots)
    if um is not None:
        um = take(um)
        filt = um if filt is None else filt & um
    static: list[npt.NDArray[np.bool_] | None] = [
        slot_node < n_nodes, take(cluster.healthy), ~take(cluster.mig), filt]

    ok_nodes = cand_mask[:n_nodes].copy()
    failed: dict[int, Reason] = {}
    cache: dict[tuple[str, int, int, str], Reason] = {}
    masks = []
    # Containers that run at the same time must each fit; init containers too.
    shapes: dict[tuple[int, int | None, int | None, int], ContainerRequest] = {}
    for c in pod.containers:
        shapes.setdefault((c.number, c.memory, c.memory_percent, c.cores), c)
    numa = pod.topology is TopologyMode.NUMA
    for c in shapes.values():
        need_mem: npt.NDArray[np.int64] | int = (
            c.memory if c.memory is not None else cap_mem * (c.memory_percent or 100) // 100)
        stages = [
            *static,
            (cap_mem >= need_mem) & (cap_cores >= c.cores) & (cap_split >= 1),
            free_split >= 1,
            excl == 0,
            (used_split == 0) if c.exclusive else None,
            free_mem >= need_mem,
            free_cores >= c.cores,
        ]
        running = np.ones(n, dtype=np.bool_)
        cumulative = []
        for m in stages:
            if m is not None:
                running = running & m
            cumulative.append(running)
        masks.append((c, running))
        if numa and c.number > 1:
            counts = _numa_counts(numa_of, slot_node, running, n_nodes)
        else:
            counts = np.bincount(slot_node[running], minlength=n_nodes + 1)[:n_nodes]
        short = ok_nodes & (counts < c.number)
        if not short.any():
            continue
        ok_nodes &= ~short
        if not reasons:
            continue
        short_idx = np.flatnonzero(short)
        # The first predicate that left each short node with too few GPUs, vectorised.
        have = np.stack([np.bincount(slot_node[m], minlength=n_nodes + 1)[short_idx]
                         for m in cumulative])
        if numa and c.number > 1:
            have = np.vstack([have, _numa_counts(numa_of, slot_node, cumulative[4],
                                                 n_nodes)[short_idx][None, :],
                              counts[short_idx][None, :]])
            stage_list = (*_STAGES, _NUMA_STATIC, _NUMA)
        else:
            stage_list = _STAGES
        below = have < c.number
        first = below.argmax(axis=0)
        for i, st, h in zip(short_idx.tolist(), first.tolist(),
                            have[first, np.arange(len(short_idx))].tolist(), strict=True):
            if i not in failed:
                failed[i] = _stage_reason(stage_list[st], h, c.number, c, cache)
    feasible = np.flatnonzero(ok_nodes).astype(np.int64)
    exact = (len(pod.containers) == 1 and pod.topology is not TopologyMode.LINK)
    return FilterResult(feasible=feasible, failed=failed, exact=exact, masks=tuple(masks),
                        slot_node=slot_node, slots=slots)


def topology_fit(cluster: Cluster, res: FilterResult, nodes: npt.NDArray[np.int64],
                 ) -> npt.NDArray[np.float64]:
    """Per node in [0, 1]: half for fitting each multi-GPU container on one NUMA node,
    half for having enough fitting GPUs with NVLink peers to link them all."""
    n_nodes = len(cluster.node_names)
    score = np.ones(len(nodes), dtype=np.float64)
    numa_of = res.take(cluster.numa)
    degree = res.take(cluster.link_degree)
    for c, mask in res.masks:
        if c.number < 2:
            continue
        numa_ok = _numa_counts(numa_of, res.slot_node, mask, n_nodes)[nodes] >= c.number
        linked = mask & (degree >= c.number - 1)
        link_ok = np.bincount(res.slot_node[linked], minlength=n_nodes + 1)[nodes] >= c.number
        score = np.minimum(score, 0.5 * numa_ok + 0.5 * link_ok)
    return score


def _numa_counts(numa: npt.NDArray[np.int32], slot_node: npt.NDArray[np.int64],
                 mask: npt.NDArray[np.bool_], n_nodes: int) -> npt.NDArray[np.int64]:
    bucket = np.clip(numa + 1, 0, NUMA_BUCKETS - 1)
    key = slot_node * NUMA_BUCKETS + bucket
    per = np.bincount(key[mask], minlength=(n_nodes + 1) * NUMA_BUCKETS)
    out: npt.NDArray[np.int64] = per.reshape(n_nodes + 1, NUMA_BUCKETS).max(axis=1)[:n_nodes]
    return out
