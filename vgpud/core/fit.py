"""Whether a GPU can take a vGPU, and why not: the one fit vocabulary.

:data:`PREDICATES` is the one table of the rules, in the order they are reported: a
code, whether a failure is *resolvable* (the pod would fit if other pods left) or not,
the test, and the messages. A test is one expression over the GPU's *columns*
(:class:`GpuState` names them) and a *demand* (a :class:`~vgpud.core.model.GpuUsage`:
vGPUs, MiB, cores and exclusivity asked of that GPU). The expressions use only
comparisons, ``&`` and ``|``, so the same test runs

* on one GPU, with plain integers: :func:`gpu_reason` (device choice in
  :mod:`vgpud.core.choose`), :func:`room` (the ledger's admission check and the
  plugin's re-check of kubelet's choice), each over the subset of the table it needs;
* on every GPU of every candidate node at once, with numpy arrays:
  :func:`filter_nodes`, which counts per node the GPUs that pass and names, for each
  rejected node, the first rule that left it short. For a pod with one GPU container
  and no NVLink constraint this count *is* the answer; otherwise it is a necessary
  condition and the exact answer comes from :func:`vgpud.core.choose.place`.

*Static* rules (health, MIG, the pod's type/uuid filters, capacity) fail whatever else
runs on the node: unresolvable. *Dynamic* ones (a free vGPU slot, not held whole,
idle for a whole-GPU request, free memory, free cores) are resolvable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vgpud.core.cluster import Cluster
from vgpud.core.model import (
    ContainerRequest,
    GpuUsage,
    NodeInventory,
    Placement,
    PodRequest,
    Reason,
    TopologyMode,
)

NUMA_BUCKETS = 9  # NUMA ids -1..7 are told apart; larger ids share the last bucket


def needed_memory(c: ContainerRequest, cap_memory: Any) -> Any:
    """MiB one vGPU of ``c`` takes on a GPU of capacity ``cap_memory`` (an int, or an
    array of capacities)."""
    if c.memory is not None:
        return c.memory
    pct = c.memory_percent if c.memory_percent is not None else 100
    return cap_memory * pct // 100


def grant_exceeds(placement: Placement, request: PodRequest,
                  inventory: NodeInventory) -> str | None:
    """Why ``placement`` grants more than the pod's own ``request`` asks, or None
    (issue 23: a grant is believed only within what the pod asks). Per container: no
    more vGPUs than asked, each no more memory than asked of the GPU it is on (a
    percentage of the largest GPU of the node, since a reassignment keeps the MiB when
    it moves a vGPU) and no more cores."""
    asks = {c.name: c for c in request.containers}
    gpus = {g.uuid: g for g in inventory.devices}
    largest = max((inventory.capacity(g).memory for g in inventory.devices), default=0)
    for grant in placement.containers:
        c = asks.get(grant.name)
        if not grant.devices:
            continue
        if c is None:
            return (f"container {grant.name!r} asks for no vGPU, but the assignment grants "
                    f"it {len(grant.devices)}")
        if len(grant.devices) > c.number:
            return (f"container {grant.name!r} asks for {c.number} vGPU(s), but the "
                    f"assignment grants {len(grant.devices)}")
        for d in grant.devices:
            gpu = gpus.get(d.uuid)
            cap = inventory.capacity(gpu).memory if gpu is not None else largest
            most = c.memory if c.memory is not None else needed_memory(c, max(cap, largest))
            if d.memory > most:
                return (f"container {grant.name!r} asks for at most {most} MiB of GPU "
                        f"{d.uuid}, but the assignment grants {d.memory}")
            if d.cores > c.cores:
                return (f"container {grant.name!r} asks for {c.cores} % of GPU {d.uuid}'s "
                        f"SMs, but the assignment grants {d.cores}")
    return None


def demand(c: ContainerRequest, cap_memory: Any) -> GpuUsage:
    """What one vGPU of ``c`` asks of a GPU of capacity ``cap_memory``. (With an array
    of capacities, ``memory`` is an array: the vectorised filter's demand.)"""
    return GpuUsage(vgpus=1, memory=needed_memory(c, cap_memory), cores=c.cores,
                    exclusive=1 if c.exclusive else 0)


def type_matches(model: str, patterns: Sequence[str]) -> bool:
    """HAMi's rule: a pattern matches a model whose name contains it (case-insensitive)."""
    m = model.lower()
    return any(p.lower() in m for p in patterns)


def gpu_selected(pod: PodRequest, model: str, uuid: str) -> bool:
    """The pod's include/exclude filters on GPU type and uuid let this GPU through."""
    if pod.include_types and not type_matches(model, pod.include_types):
        return False
    if pod.exclude_types and type_matches(model, pod.exclude_types):
        return False
    if pod.include_uuids and uuid not in pod.include_uuids:
        return False
    return not (pod.exclude_uuids and uuid in pod.exclude_uuids)


@dataclass(frozen=True, slots=True)
class GpuState:
    """The columns the rules read, for one GPU. :func:`filter_nodes` builds the same
    names as arrays over many GPUs."""

    uuid: str
    cap_vgpus: int
    cap_memory: int
    cap_cores: int
    held_vgpus: int
    held_exclusive: int
    free_vgpus: int
    free_memory: int
    free_cores: int
    healthy: bool = True
    whole: bool = True  # offers what is asked: not in MIG mode, the asked MIG profile
    selected: bool = True  # passes the pod's type/uuid filters

    @classmethod
    def of(cls, uuid: str, cap: GpuUsage, held: GpuUsage, *, healthy: bool = True,
           whole: bool = True, selected: bool = True) -> GpuState:
        return cls(uuid=uuid, cap_vgpus=cap.vgpus, cap_memory=cap.memory, cap_cores=cap.cores,
                   held_vgpus=held.vgpus, held_exclusive=held.exclusive,
                   free_vgpus=cap.vgpus - held.vgpus, free_memory=cap.memory - held.memory,
                   free_cores=cap.cores - held.cores, healthy=healthy, whole=whole,
                   selected=selected)


# A test returns a bool for one GPU, a bool array for many, or True for "no constraint".
Test = Callable[[Any, GpuUsage], Any]


@dataclass(frozen=True, slots=True)
class Predicate:
    code: str
    resolvable: bool
    test: Test
    gpu_message: str  # str.format(g=GpuState, n=demand)
    node_message: str  # str.format(name, need, have, mem, cores): a node short of GPUs


def _idle(g: Any, n: GpuUsage) -> Any:
    return (g.held_vgpus == 0) if n.exclusive else True


PREDICATES: tuple[Predicate, ...] = (
    Predicate("unhealthy", False, lambda g, n: g.healthy,
              "GPU {g.uuid} is unhealthy",
              "container {name} needs {need} healthy GPU(s); the node has {have}"),
    Predicate("mig", False, lambda g, n: g.whole,
              "GPU {g.uuid} is in MIG mode, or a MIG instance of another kind than asked",
              "container {name} needs {need} {what}; the node has {have}"),
    Predicate("gpu-filter", False, lambda g, n: g.selected,
              "GPU {g.uuid} is excluded by the pod's GPU type/uuid filters",
              "container {name} needs {need} GPU(s) matching the pod's GPU type/uuid filters; "
              "the node has {have}"),
    Predicate("too-small", False,
              lambda g, n: ((g.cap_memory >= n.memory) & (g.cap_cores >= n.cores)
                            & (g.cap_vgpus >= n.vgpus)),
              "GPU {g.uuid} is too small ({g.cap_memory} MiB, {g.cap_cores}% cores, "
              "{g.cap_vgpus} vGPUs) for {n.memory} MiB and {n.cores}% cores",
              "container {name} needs {need} GPU(s) with room for {mem} and {cores}% cores; "
              "the node has {have} that large"),
    Predicate("split", True, lambda g, n: g.free_vgpus >= n.vgpus,
              "GPU {g.uuid} has no free vGPU ({g.held_vgpus} of {g.cap_vgpus} in use)",
              "container {name} needs {need} GPU(s) with a free vGPU slot; the node has {have} "
              "(split count used up)"),
    Predicate("exclusive", True, lambda g, n: g.held_exclusive == 0,
              "GPU {g.uuid} is held whole by another container",
              "container {name} needs {need} GPU(s) not held whole by another container; "
              "the node has {have}"),
    Predicate("idle", True, _idle,
              "GPU {g.uuid} is not idle (a whole-GPU request needs an idle GPU)",
              "container {name} needs {need} idle GPU(s) for a whole-GPU request; the node "
              "has {have}"),
    Predicate("memory", True, lambda g, n: g.free_memory >= n.memory,
              "GPU {g.uuid} has {g.free_memory} MiB free, needs {n.memory}",
              "container {name} needs {need} GPU(s) with {mem} free; the node has {have}"),
    Predicate("cores", True, lambda g, n: g.free_cores >= n.cores,
              "GPU {g.uuid} has {g.free_cores}% cores free, needs {n.cores}",
              "container {name} needs {need} GPU(s) with {cores}% cores free; the node has "
              "{have}"),
)
_TESTS = tuple((p.test, p) for p in PREDICATES)  # device choice checks GPUs in a loop
# What a GPU must pass whoever asks: all but the pod's own filters.
DEVICE = tuple(p for p in PREDICATES if p.code != "gpu-filter")
# Capacity and what others hold: the ledger's admission check.
ROOM = tuple(p for p in PREDICATES if p.code not in ("unhealthy", "mig", "gpu-filter"))


def gpu_reason(g: Any, n: GpuUsage,
               predicates: Sequence[Predicate] = PREDICATES) -> Reason | None:
    """The first rule GPU ``g`` (a :class:`GpuState`, or anything with its names)
    breaks for demand ``n``; None when it passes them all."""
    tests = _TESTS if predicates is PREDICATES else tuple((p.test, p) for p in predicates)
    for test, p in tests:
        if not test(g, n):
            return Reason(p.code, p.gpu_message.format(g=g, n=n), p.resolvable)
    return None


def room(uuid: str, cap: GpuUsage, held: GpuUsage, add: GpuUsage, *, healthy: bool = True,
         whole: bool = True, predicates: Sequence[Predicate] = ROOM) -> Reason | None:
    """Why ``add`` does not fit on a GPU of capacity ``cap`` next to ``held``, or None."""
    return gpu_reason(GpuState.of(uuid, cap, held, healthy=healthy, whole=whole), add,
                      predicates)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Per candidate node: feasible (by the vector predicates) or a reason."""

    feasible: npt.NDArray[np.int64]  # node indices, ascending
    failed: dict[int, Reason]  # filled only when reasons were asked for
    exact: bool  # True when ``feasible`` needs no per-node confirmation
    masks: tuple[tuple[ContainerRequest, npt.NDArray[np.bool_]], ...]  # per shape: GPUs that fit
    # Per slot looked at, its node's position in ``nodes`` (left out: ``len(nodes)``).
    # Counting per position keeps a filter over a few thousand candidates of 65,000
    # nodes from touching arrays of 65,000.
    slot_node: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int64] | None  # the slots looked at (None: all of them)
    nodes: npt.NDArray[np.int64] | None  # the candidates, ascending (None: every node index)
    width: int  # positions counted in (``len(nodes)``, or every node index)

    def take(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """A per-slot cluster array, restricted to the slots this result looked at."""
        return values[: len(self.slot_node)] if self.slots is None else values[self.slots]

    def positions(self, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Node indices (among the candidates) to their positions in ``slot_node``."""
        if self.nodes is None:
            return nodes
        out: npt.NDArray[np.int64] = np.searchsorted(self.nodes, nodes)
        return out


_Stage = tuple[str, str, bool]  # code, node message template, resolvable

_NO_GPUS: _Stage = ("no-gpus", "container {name} needs {need} GPU(s); the node has {have}", False)
_STAGES: tuple[_Stage, ...] = (_NO_GPUS, *((p.code, p.node_message, p.resolvable)
                                           for p in PREDICATES))
_NUMA: _Stage = ("numa", "container {name} needs {need} GPU(s) on one NUMA node; none has that "
                 "many free", True)
_NUMA_STATIC: _Stage = ("numa", "container {name} needs {need} GPU(s) on one NUMA node; none has "
                        "that many", False)
_CAPACITY_STAGE = 1 + [p.code for p in PREDICATES].index("too-small")


def _stage_reason(stage: _Stage, have: int, need: int, c: ContainerRequest,
                  cache: dict[tuple[str, int, int, str], Reason]) -> Reason:
    code, template, resolvable = stage
    key = (code, have, need, c.name)
    r = cache.get(key)
    if r is None:
        mem = f"{c.memory} MiB" if c.memory is not None else f"{c.memory_percent}% of memory"
        what = f"whole MIG {c.profile} instance(s)" if c.profile else "GPU(s) not in MIG mode"
        msg = template.format(have=have, need=need, mem=mem, cores=c.cores, name=c.name,
                              what=what)
        r = cache[key] = Reason(code, msg, resolvable)
    return r


_TOO_SMALL = next(p for p in PREDICATES if p.code == "too-small")


def _no_gpu_too_small(smallest: GpuUsage, need: GpuUsage) -> bool:
    """Every GPU of the cluster is large enough for ``need`` (a scalar demand)."""
    return (isinstance(need.memory, int) and need.memory <= smallest.memory
            and need.cores <= smallest.cores and need.vgpus <= smallest.vgpus)


class _Columns:
    """:class:`GpuState`'s names over many GPUs (``selected`` ``True``: no constraint),
    each gathered from the cluster's arrays when a rule first reads it: over a few
    thousand candidates of a large cluster a gather is most of a rule's cost, and some
    rules need none (``_idle`` for a shared request, ``too-small`` when every GPU is
    large enough)."""

    def __init__(self, cluster: Cluster, take: Callable[[npt.NDArray[Any]], npt.NDArray[Any]],
                 whole: npt.NDArray[np.bool_], selected: npt.NDArray[np.bool_] | bool) -> None:
        self._cluster = cluster
        self._take = take
        self.whole = whole
        self.selected = selected

    def offering(self, whole: npt.NDArray[np.bool_]) -> _Columns:
        """The same GPUs for a request of another kind (what they offer it: ``whole``)."""
        other = _Columns(self._cluster, self._take, whole, self.selected)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k != "whole"})
        return other

    @functools.cached_property
    def healthy(self) -> npt.NDArray[np.bool_]:
        return self._take(self._cluster.healthy)

    @functools.cached_property
    def cap_vgpus(self) -> npt.NDArray[np.int64]:
        return self._take(self._cluster.cap_split)

    @functools.cached_property
    def cap_memory(self) -> npt.NDArray[np.int64]:
        return self._take(self._cluster.cap_mem)

    @functools.cached_property
    def cap_cores(self) -> npt.NDArray[np.int64]:
        return self._take(self._cluster.cap_cores)

    @functools.cached_property
    def held_vgpus(self) -> npt.NDArray[np.int64]:
        return self._take(self._cluster.used_split)

    @functools.cached_property
    def held_exclusive(self) -> npt.NDArray[np.int64]:
        return self._take(self._cluster.excl)

    @functools.cached_property
    def free_vgpus(self) -> npt.NDArray[np.int32]:
        return self._take(self._cluster.free_split)

    @functools.cached_property
    def free_memory(self) -> npt.NDArray[np.int32]:
        return self._take(self._cluster.free_mem)

    @functools.cached_property
    def free_cores(self) -> npt.NDArray[np.int32]:
        return self._take(self._cluster.free_cores)


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
    """Evaluate every rule for every container of ``pod`` on every GPU of every candidate.

    With ``reasons=False`` the rejected nodes are only left out (the simulator's and
    the benchmark's path); the extender asks for the reasons.
    """
    n_nodes = len(cluster.node_names)
    slots: npt.NDArray[np.int64] | None
    nodes: npt.NDArray[np.int64] | None
    if candidates is None or 2 * len(candidates) > cluster.n_nodes():
        # All (or most) nodes: a slice of every array beats gathering their slots;
        # positions are node indices.
        cand_mask = np.zeros(n_nodes + 1, dtype=np.bool_)
        if candidates is None:
            cand_mask[:n_nodes] = True
            for i in cluster.free_node_indices():
                cand_mask[i] = False
        else:
            cand_mask[candidates] = True
        slots = nodes = None
        width = n_nodes
        n = cluster.slots

        def take(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return values[:n]
        slot_node = np.where(take(cluster.alive), take(cluster.node_of), n_nodes).astype(np.int64)
        slot_node = np.where(cand_mask[slot_node], slot_node, n_nodes)
        ok_nodes = cand_mask[:n_nodes].copy()
    else:
        # Only the candidates' GPUs (kube-scheduler sends a twentieth of a large
        # cluster), counted by the candidate's position: nothing here is as long as
        # the cluster.
        ascending = len(candidates) < 2 or bool((candidates[1:] > candidates[:-1]).all())
        nodes = candidates if ascending else np.unique(candidates)
        width = len(nodes)
        sel = slots = cluster.slots_of(nodes)

        def take(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return values[sel]
        # (a live node's slots are all alive: nothing to leave out)
        slot_node = np.repeat(np.arange(width, dtype=np.int64), cluster.node_count[nodes])
        ok_nodes = np.ones(width, dtype=np.bool_)
    selected: npt.NDArray[np.bool_] | None = None
    lut = _lut(cluster, pod)
    if lut is not None:
        selected = lut[take(cluster.type_id)]
    um = _uuid_mask(cluster, pod, cluster.slots)
    if um is not None:
        um = take(um)
        selected = um if selected is None else selected & um
    profile_of = take(cluster.profile_id)
    cols = _Columns(cluster, take, whole=profile_of == 0,
                    selected=True if selected is None else selected)
    smallest = cluster.smallest()
    numa_of = take(cluster.numa) if pod.topology is TopologyMode.NUMA else None
    on_candidate = slot_node < width

    failed: dict[int, Reason] = {}
    cache: dict[tuple[str, int, int, str], Reason] = {}
    masks = []
    # Containers that run at the same time must each fit; init containers too.
    shapes: dict[tuple[int, int | None, int | None, int, str], ContainerRequest] = {}
    for c in pod.containers:
        shapes.setdefault((c.number, c.memory, c.memory_percent, c.cores, c.profile), c)
    vgpu_cols = cols
    for c in shapes.values():
        cols = vgpu_cols if not c.profile else vgpu_cols.offering(
            profile_of == cluster.profile_code(c.profile))
        need = demand(c, cols.cap_memory if c.memory is None else 0)
        running = on_candidate
        cumulative = [running]
        for p in PREDICATES:
            if p is _TOO_SMALL and _no_gpu_too_small(smallest, need):
                m = True
            else:
                m = p.test(cols, need)
            if m is not True:
                running = running & m
            cumulative.append(running)
        masks.append((c, running))
        if numa_of is not None and c.number > 1:
            counts = _numa_counts(numa_of, slot_node, running, width)
        else:
            counts = np.bincount(slot_node[running], minlength=width + 1)[:width]
        short = ok_nodes & (counts < c.number)
        if not short.any():
            continue
        ok_nodes &= ~short
        if not reasons:
            continue
        short_idx = np.flatnonzero(short)
        # The first rule that left each short node with too few GPUs, vectorised: the
        # masks are nested (each rule narrows the last), so a slot's depth (how many
        # hold it) says which it passed, and one count per (node, depth) gives, per rule,
        # how many of a node's GPUs passed it (one bincount, not one per rule).
        depth = np.zeros(len(slot_node), dtype=np.int64)
        for passed in cumulative:
            depth += passed
        levels = len(cumulative) + 1
        hist = np.bincount(slot_node * levels + depth, minlength=(width + 1) * levels)
        at_least = np.cumsum(hist.reshape(width + 1, levels)[short_idx][:, ::-1], axis=1)
        rows = list(at_least[:, ::-1][:, 1:].T)
        stage_list: tuple[_Stage, ...] = _STAGES
        if numa_of is not None and c.number > 1:
            # static before dynamic: no NUMA node ever has enough GPUs, then not now
            k = _CAPACITY_STAGE + 1
            rows = [*rows[:k], _numa_counts(numa_of, slot_node, cumulative[_CAPACITY_STAGE],
                                            width)[short_idx], *rows[k:], counts[short_idx]]
            stage_list = (*_STAGES[:k], _NUMA_STATIC, *_STAGES[k:], _NUMA)
        have = np.stack(rows)
        below = have < c.number
        first = below.argmax(axis=0)
        short_nodes = short_idx if nodes is None else nodes[short_idx]
        for i, st, h in zip(short_nodes.tolist(), first.tolist(),
                            have[first, np.arange(len(short_idx))].tolist(), strict=True):
            if i not in failed:
                failed[i] = _stage_reason(stage_list[st], h, c.number, c, cache)
    feasible = np.flatnonzero(ok_nodes).astype(np.int64)
    if nodes is not None:
        feasible = nodes[feasible]
    exact = (len(pod.containers) == 1 and pod.topology is not TopologyMode.LINK)
    return FilterResult(feasible=feasible, failed=failed, exact=exact, masks=tuple(masks),
                        slot_node=slot_node, slots=slots, nodes=nodes, width=width)


def topology_fit(cluster: Cluster, res: FilterResult, nodes: npt.NDArray[np.int64],
                 ) -> npt.NDArray[np.float64]:
    """Per node in [0, 1]: half for fitting each multi-GPU container on one NUMA node,
    half for having enough fitting GPUs with NVLink peers to link them all."""
    score = np.ones(len(nodes), dtype=np.float64)
    numa_of = res.take(cluster.numa)
    degree = res.take(cluster.link_degree)
    at = res.positions(nodes)
    for c, mask in res.masks:
        if c.number < 2:
            continue
        numa_ok = _numa_counts(numa_of, res.slot_node, mask, res.width)[at] >= c.number
        linked = mask & (degree >= c.number - 1)
        link_ok = np.bincount(res.slot_node[linked], minlength=res.width + 1)[at] >= c.number
        score = np.minimum(score, 0.5 * numa_ok + 0.5 * link_ok)
    return score


def _numa_counts(numa: npt.NDArray[np.int32], slot_node: npt.NDArray[np.int64],
                 mask: npt.NDArray[np.bool_], n_nodes: int) -> npt.NDArray[np.int64]:
    """Per position, the most fitting GPUs on one NUMA node (``n_nodes`` positions)."""
    bucket = np.clip(numa + 1, 0, NUMA_BUCKETS - 1)
    key = slot_node * NUMA_BUCKETS + bucket
    per = np.bincount(key[mask], minlength=(n_nodes + 1) * NUMA_BUCKETS)
    out: npt.NDArray[np.int64] = per.reshape(n_nodes + 1, NUMA_BUCKETS).max(axis=1)[:n_nodes]
    return out
