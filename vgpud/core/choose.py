"""Choose the GPUs of one node for every container of a pod.

Containers are placed in *phases*, as Kubernetes runs them: each regular init
container alone (with the restartable sidecars declared before it), then the app
containers together with every sidecar. Containers of one phase may share a GPU,
but one container's vGPUs are distinct GPUs. A sidecar keeps the GPUs it got in the
last phase through every earlier phase.

:meth:`~vgpud.core.model.Placement.charge` turns a placement back into what it holds
per GPU: the maximum over its phases, since phases never run at the same time. The
ledger holds exactly that.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from vgpud.core.cluster import Cluster, GpuView
from vgpud.core.fit import demand, gpu_reason, gpu_selected
from vgpud.core.model import (
    ContainerGrant,
    ContainerRequest,
    DeviceGrant,
    GpuUsage,
    Placement,
    PodRequest,
    Policy,
    Reason,
    TopologyMode,
    phases,
)

MAX_LINK_SEARCH = 20_000  # combinations tried for an NVLink clique before giving up


class _Free:
    """One GPU while a pod is being placed: what others and this pod hold on it, under
    the names the rules read (:class:`~vgpud.core.fit.GpuState`'s), kept up to date as
    this pod's containers take their share, so checking a GPU builds nothing."""

    __slots__ = ("cap_cores", "cap_memory", "cap_vgpus", "free_cores", "free_memory",
                 "free_vgpus", "healthy", "held_exclusive", "held_vgpus", "selected",
                 "uuid", "view", "whole")  # whole: offers the container being placed

    def __init__(self, g: GpuView, pod: PodRequest, *, pristine: bool = False) -> None:
        self.view = g
        self.uuid = g.gpu.uuid
        self.healthy = g.gpu.healthy
        self.whole = not g.gpu.mig
        self.selected = gpu_selected(pod, g.gpu.model, g.gpu.uuid)
        self.cap_vgpus, self.cap_memory, self.cap_cores = g.gpu.split, g.cap_memory, g.cap_cores
        if pristine:
            self.held_vgpus, self.held_exclusive = 0, 0
            self.free_vgpus, self.free_memory, self.free_cores = (
                self.cap_vgpus, self.cap_memory, self.cap_cores)
        else:
            self.held_vgpus, self.held_exclusive = g.used_vgpus, 1 if g.exclusive else 0
            self.free_vgpus, self.free_memory, self.free_cores = (
                g.free_split, g.free_memory, g.free_cores)

    @property
    def memory(self) -> int:
        return self.free_memory

    @property
    def vgpus(self) -> int:
        return self.held_vgpus

    def take(self, u: GpuUsage) -> None:
        self.held_vgpus += u.vgpus
        self.held_exclusive += u.exclusive
        self.free_vgpus -= u.vgpus
        self.free_memory -= u.memory
        self.free_cores -= u.cores


def _order(cands: list[_Free], policy: Policy) -> list[_Free]:
    if policy is Policy.BINPACK:
        return sorted(cands, key=lambda f: (-f.vgpus, f.memory, f.view.gpu.index))
    return sorted(cands, key=lambda f: (f.vgpus, -f.memory, f.view.gpu.index))


def _linked(a: _Free, b: _Free) -> bool:
    return b.view.gpu.uuid in a.view.gpu.links or a.view.gpu.uuid in b.view.gpu.links


def _pick(c: ContainerRequest, cands: list[_Free], pod: PodRequest) -> list[_Free] | None:
    n = c.number
    ordered = _order(cands, pod.device_policy)
    if len(ordered) < n:
        return None
    if n == 1:
        return ordered[:1]
    if pod.topology is TopologyMode.LINK:
        for tried, combo in enumerate(itertools.combinations(ordered, n)):
            if tried >= MAX_LINK_SEARCH:
                return None
            if all(_linked(a, b) for a, b in itertools.combinations(combo, 2)):
                return list(combo)
        return None
    groups: dict[int, list[_Free]] = {}
    for f in ordered:
        groups.setdefault(f.view.gpu.numa, []).append(f)
    fitting = [g for g in groups.values() if len(g) >= n]
    if fitting:
        # Binpack: the NUMA node with least room left; spread: the one with most.
        sign = 1 if pod.device_policy is Policy.BINPACK else -1
        best = min(fitting, key=lambda g: (sign * sum(f.memory for f in g), g[0].view.gpu.index))
        return best[:n]
    if pod.topology is TopologyMode.NUMA:
        return None
    return ordered[:n]


def _place_container(c: ContainerRequest, state: list[_Free], pod: PodRequest,
                     ) -> ContainerGrant | str:
    cands = []
    reasons: dict[str, int] = {}
    for f in state:
        f.whole = f.view.gpu.offers(c.profile)
        why = gpu_reason(f, demand(c, f.cap_memory))
        if why is None:
            cands.append(f)
        else:
            reasons[why.code] = reasons.get(why.code, 0) + 1
    chosen = _pick(c, cands, pod)
    if chosen is None:
        detail = "; ".join(f"{k} ({v})" for k, v in sorted(reasons.items()))
        mode = {TopologyMode.NUMA: " on one NUMA node", TopologyMode.LINK: " NVLink-connected",
                TopologyMode.NONE: ""}[pod.topology]
        return (f"container {c.name}: {len(cands)} GPUs fit, needs {c.number}{mode}"
                + (f" — others: {detail}" if detail else ""))
    devices = []
    for f in sorted(chosen, key=lambda f: f.view.gpu.index):
        d = demand(c, f.view.cap_memory)
        f.take(d)
        devices.append(DeviceGrant(uuid=f.view.gpu.uuid, memory=d.memory, cores=c.cores))
    return ContainerGrant(name=c.name, init=c.init, devices=tuple(devices), sidecar=c.sidecar)


def _place_all(pod: PodRequest, views: list[GpuView], *, pristine: bool,
               ) -> list[ContainerGrant] | str:
    grants: dict[str, ContainerGrant] = {}
    ph = phases(pod.containers)
    main = sorted(ph[0], key=lambda c: (-c.number, -(c.memory or 0), -c.cores))
    state = [_Free(g, pod, pristine=pristine) for g in views]
    by_uuid = {f.uuid: i for i, f in enumerate(state)}
    for c in main:
        got = _place_container(c, state, pod)
        if isinstance(got, str):
            return got
        grants[c.name] = got
    for phase in ph[1:]:
        state = [_Free(g, pod, pristine=pristine) for g in views]
        *sidecars, init = phase
        for s in sidecars:  # they keep the GPUs they got in the main phase
            for d in grants[s.name].devices:
                state[by_uuid[d.uuid]].take(d.usage)
        got = _place_container(init, state, pod)
        if isinstance(got, str):
            return got
        grants[init.name] = got
    return [grants[c.name] for c in pod.containers]


def place(cluster: Cluster, pod: PodRequest, node: str) -> Placement | Reason:
    """The GPUs of ``node`` for every container of ``pod``, or why there are none."""
    if not cluster.has_node(node):
        return Reason("unknown-node", f"node {node} has no GPU inventory", False)
    views = cluster.gpus(node)
    got = _place_all(pod, views, pristine=False)
    if isinstance(got, str):
        resolvable = not isinstance(_place_all(pod, views, pristine=True), str)
        return Reason("no-fit", got, resolvable)
    return Placement(node=node, containers=tuple(got), compute_policy=pod.compute_policy,
                     priority=pod.priority)


def place_released(cluster: Cluster, pod: PodRequest, node: str,
                   released: Mapping[str, GpuUsage]) -> Placement | str:
    """Where ``pod`` would go on ``node`` if the holders of ``released`` (per uuid) were
    gone, or why it still would not fit. A what-if: the cluster is not changed."""
    got = _place_all(pod, cluster.gpus(node, released), pristine=False)
    if isinstance(got, str):
        return got
    return Placement(node=node, containers=tuple(got), compute_policy=pod.compute_policy,
                     priority=pod.priority)


def never_fits(cluster: Cluster, pod: PodRequest, node: str) -> str | None:
    """Why ``pod`` cannot fit ``node`` even with no other pod there; None when it would."""
    got = _place_all(pod, cluster.gpus(node), pristine=True)
    return got if isinstance(got, str) else None
