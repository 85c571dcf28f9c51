"""Choose the GPUs of one node for every container of a pod.

Containers are placed in *phases*, as Kubernetes runs them: each regular init
container alone (with the restartable sidecars declared before it), then the app
containers together with every sidecar. Containers of one phase may share a GPU,
but one container's vGPUs are distinct GPUs. A sidecar keeps the GPUs it got in the
last phase through every earlier phase.

:func:`charge` turns a placement back into what it holds per GPU: the maximum over
its phases, since phases never run at the same time. The ledger holds exactly that.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from vgpud.core.cluster import Cluster, GpuView
from vgpud.core.fit import gpu_reason, needed_memory
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
)

MAX_LINK_SEARCH = 20_000  # combinations tried for an NVLink clique before giving up


@dataclass(slots=True)
class _Free:
    """Mutable free amounts of one GPU while a pod is being placed."""

    view: GpuView
    memory: int
    cores: int
    split: int
    vgpus: int
    exclusive: bool

    @classmethod
    def of(cls, g: GpuView, *, pristine: bool = False) -> _Free:
        if pristine:
            return cls(g, g.cap_memory, g.cap_cores, g.gpu.split, 0, False)
        return cls(g, g.free_memory, g.free_cores, g.free_split, g.used_vgpus, g.exclusive)

    def take(self, memory: int, cores: int, exclusive: bool, sign: int = 1) -> None:
        self.memory -= sign * memory
        self.cores -= sign * cores
        self.split -= sign
        self.vgpus += sign
        if exclusive:
            self.exclusive = sign > 0


def phases(containers: Sequence[ContainerRequest]) -> list[list[ContainerRequest]]:
    """The containers that run together, main phase first, then each init container's."""
    main = [c for c in containers if c.sidecar or not c.init]
    out = [main]
    sidecars: list[ContainerRequest] = []
    for c in containers:
        if c.sidecar:
            sidecars.append(c)
        elif c.init:
            out.append([*sidecars, c])
    return out


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
                     ) -> tuple[ContainerGrant, list[tuple[_Free, int, int]]] | str:
    cands = []
    reasons: dict[str, int] = {}
    for f in state:
        why = gpu_reason(pod, c, f.view, free_memory=f.memory, free_cores=f.cores,
                         free_split=f.split, used_vgpus=f.vgpus, exclusive=f.exclusive)
        if why is None:
            cands.append(f)
        else:
            key = why.split(",")[0] if "free" in why else why
            reasons[key] = reasons.get(key, 0) + 1
    chosen = _pick(c, cands, pod)
    if chosen is None:
        detail = "; ".join(f"{k} ({v})" for k, v in sorted(reasons.items()))
        mode = {TopologyMode.NUMA: " on one NUMA node", TopologyMode.LINK: " NVLink-connected",
                TopologyMode.NONE: ""}[pod.topology]
        return (f"container {c.name}: {len(cands)} GPUs fit, needs {c.number}{mode}"
                + (f" — others: {detail}" if detail else ""))
    taken = []
    devices = []
    for f in sorted(chosen, key=lambda f: f.view.gpu.index):
        mem = needed_memory(c, f.view.cap_memory)
        f.take(mem, c.cores, c.exclusive)
        taken.append((f, mem, c.cores))
        devices.append(DeviceGrant(uuid=f.view.gpu.uuid, memory=mem, cores=c.cores))
    return ContainerGrant(name=c.name, init=c.init, devices=tuple(devices),
                          sidecar=c.sidecar), taken


def _place_all(pod: PodRequest, views: list[GpuView], *, pristine: bool,
               ) -> list[ContainerGrant] | str:
    grants: dict[str, ContainerGrant] = {}
    ph = phases(pod.containers)
    main = sorted(ph[0], key=lambda c: (-c.number, -(c.memory or 0), -c.cores))
    state = [_Free.of(g, pristine=pristine) for g in views]
    by_uuid = {f.view.gpu.uuid: i for i, f in enumerate(state)}
    for c in main:
        got = _place_container(c, state, pod)
        if isinstance(got, str):
            return got
        grants[c.name] = got[0]
    for phase in ph[1:]:
        state = [_Free.of(g, pristine=pristine) for g in views]
        *sidecars, init = phase
        for s in sidecars:  # they keep the GPUs they got in the main phase
            for d in grants[s.name].devices:
                state[by_uuid[d.uuid]].take(d.memory, d.cores, s.exclusive)
        got = _place_container(init, state, pod)
        if isinstance(got, str):
            return got
        grants[init.name] = got[0]
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


def charge(p: Placement) -> dict[str, GpuUsage]:
    """What a placement holds per GPU uuid: the maximum over its phases."""
    main = [c for c in p.containers if c.sidecar or not c.init]
    groups = [main]
    sidecars: list[ContainerGrant] = []
    for c in p.containers:
        if c.sidecar:
            sidecars.append(c)
        elif c.init:
            groups.append([*sidecars, c])
    out: dict[str, GpuUsage] = {}
    for group in groups:
        per: dict[str, GpuUsage] = {}
        for c in group:
            for d in c.devices:
                u = per.get(d.uuid, GpuUsage())
                per[d.uuid] = GpuUsage(u.vgpus + 1, u.memory + d.memory, u.cores + d.cores,
                                       u.exclusive + (1 if d.cores >= 100 else 0))
        for uuid, u in per.items():
            o = out.get(uuid)
            out[uuid] = u if o is None else GpuUsage(
                max(o.vgpus, u.vgpus), max(o.memory, u.memory), max(o.cores, u.cores),
                max(o.exclusive, u.exclusive))
    return out
