"""The node's decisions about a container's start and its allocation, as values. Pure:
no I/O, no async.

An adapter (the device plugin's servicer, :mod:`vgpud.plugin.service`) gathers facts —
who holds a set of device IDs (kubelet's PodResources), that pod's annotations and the
other pods on the node (the API), the node's inventory — and carries out what these
functions decide:

- :func:`plan`: what a container's start writes for it (:class:`Configure`, possibly
  after rewriting the assignment because kubelet chose other GPUs), or why it must fail
  (:class:`Refuse`), or that it needs to know what the other pods on the node hold
  first (:data:`NEEDS_OTHERS`);
- :func:`reconcile`: whether kubelet's actual choice of GPUs can stand: equal to the
  assignment, or moved onto GPUs that still have room (a new placement to write), or a
  :class:`~vgpud.core.model.Reason` to fail the container with;
- :func:`wanted`: which GPUs the container being admitted was assigned (the device
  plugin steers kubelet to them);
- :func:`stale`: which allocation directories housekeeping may remove;
- :func:`starting_init_container`: which regular init container kubelet is starting
  with IDs that no container PodResources lists holds (it lists no such container).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from vgpud.core.codec import ASSIGNMENT, Unreadable
from vgpud.core.fit import DEVICE, grant_exceeds, room
from vgpud.core.limits import GrantError, Limits, limits_for
from vgpud.core.model import (
    ZERO,
    ComputePolicy,
    ContainerGrant,
    GpuUsage,
    NodeInventory,
    Placement,
    PodRequest,
    Reason,
)
from vgpud.node.ids import VGPU_IDS, gpus_of, ids_for

H = TypeVar("H", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Configure:
    """Write ``limits`` for the container; first patch the pod's assignment to
    ``placement`` when ``rewrite`` (kubelet chose other GPUs that have room)."""

    placement: Placement
    grant: ContainerGrant
    limits: Limits
    rewrite: bool


@dataclass(frozen=True, slots=True)
class Refuse:
    """Fail the container; ``message`` is what kubelet shows on the pod."""

    message: str


class _Needs(enum.Enum):
    OTHERS = "others"


NEEDS_OTHERS = _Needs.OTHERS
"""kubelet chose other GPUs than assigned: call again with what the node's other pods
hold on each GPU."""


Assignment = Placement | Unreadable | None
"""A pod's assignment as its projection decoded it (:func:`vgpud.core.codec.assignment_of`)."""


def read_assignment(assignment: Assignment, node: str, where: str) -> Placement | Refuse:
    """The pod's assignment, if it is one for this node."""
    if assignment is None:
        return Refuse(f"{where}: the pod has no {ASSIGNMENT} annotation (was it placed by "
                      f"the vgpu scheduler?)")
    if isinstance(assignment, Unreadable):
        return Refuse(f"{where}: malformed assignment: {assignment.why}")
    placement = assignment
    if placement.node != node:
        return Refuse(f"{where}: the assignment is for node {placement.node!r}, not {node!r}")
    return placement


def plan(
    where: str,
    assignment: Assignment,
    *,
    node: str,
    container: str,
    chosen: Sequence[str],
    inventory: NodeInventory,
    state_dir: str,
    register: str = "",
    arbiter_dir: str = "",
    others: Mapping[str, GpuUsage] | None = None,
    per_gpu: int = VGPU_IDS,
    request: PodRequest | None = None,
    node_policy: ComputePolicy | None = None,
) -> Configure | Refuse | _Needs:
    """What PreStartContainer does for ``container`` of the pod with ``assignment``,
    given the GPUs kubelet chose (``chosen``: one uuid per replica ID).

    ``per_gpu`` is the unit of the IDs (:mod:`vgpud.node.ids`): with one ID per
    vGPU, every ID is a GPU of its own (two of one GPU are refused); with percent IDs
    (TKE), the GPUs are the distinct ones among ``chosen`` and the IDs of each must be
    what the assignment grants there (30 IDs of a GPU for 30 % of it).

    ``node_policy``: the node's ``nvidia.com/vgpu-compute-policy``, for a pod that names
    none of its own (the pod's wins).

    ``request`` (the pod's own, parsed as the scheduler parses it): a grant beyond it is
    refused, not configured (a pod may not grant itself a GPU: issue 23).

    ``others`` (what every *other* pod on the node holds per GPU) is needed only when
    kubelet's choice differs from the assignment; without it that case answers
    :data:`NEEDS_OTHERS`.
    """
    placement = read_assignment(assignment, node, where)
    if isinstance(placement, Refuse):
        return placement
    if request is not None:  # believed only within what the pod asks (issue 23)
        why = grant_exceeds(placement, request, inventory)
        if why is not None:
            return Refuse(f"{where}: {why}; the assignment is not believed and no limits are "
                          f"configured")
    counts = Counter(chosen)
    gpus = list(counts) if per_gpu > VGPU_IDS else list(chosen)
    got = reconcile(placement, container, gpus, inventory, others or {})
    if got is not placement and others is None and not (
            isinstance(got, Reason) and got.code != "no-room"):
        return NEEDS_OTHERS
    if isinstance(got, Reason):
        return Refuse(f"{where}: {got.message}")
    grant = got.container(container)
    assert grant is not None  # reconcile checked it
    if per_gpu > VGPU_IDS:
        for d in grant.devices:
            if counts[d.uuid] != ids_for(per_gpu, d):
                return Refuse(f"{where}: kubelet gave container {container!r} "
                              f"{counts[d.uuid]} device IDs of GPU {d.uuid} "
                              f"({counts[d.uuid] * 100 / per_gpu:g} % of it), but the "
                              f"assignment grants {d.cores} % there")
    try:
        limits = limits_for(grant, inventory, compute_policy=node_policy or got.compute_policy,
                            priority=got.priority, state_dir=state_dir, register=register,
                            arbiter_dir=arbiter_dir)
    except GrantError as e:
        return Refuse(f"{where}: {e}")
    return Configure(placement=got, grant=grant, limits=limits, rewrite=got is not placement)


def init_pending(assignment: Assignment, init_done: Collection[str]) -> bool:
    """Whether the pod's assignment grants a regular init container GPUs that the pod's
    status does not show completed (none, or an unreadable one: no)."""
    if not isinstance(assignment, Placement):
        return False
    return any(c.init and not c.sidecar and c.devices and c.name not in init_done
               for c in assignment.containers)


def held_by_others(pods: Iterable[tuple[str, str, str, Assignment]],
                   me: tuple[str, str]) -> dict[str, GpuUsage]:
    """Per GPU, what the assignments of the pods ``(namespace, name, phase,
    assignment)`` hold, leaving out the pod ``me`` and pods that have ended.
    Unreadable assignments are skipped (their pods fail on their own)."""
    out: dict[str, GpuUsage] = {}
    for namespace, name, phase, assignment in pods:
        if ((namespace, name) == me or phase in ("Succeeded", "Failed")
                or not isinstance(assignment, Placement)):
            continue
        for uuid, u in assignment.charge().items():
            out[uuid] = out.get(uuid, GpuUsage()) + u
    return out


def wanted(waiting: Mapping[tuple[str, str], set[str]],
           assignments: Mapping[tuple[str, str], Assignment], size: int,
           per_gpu: int = VGPU_IDS, *, init_waiting: Iterable[tuple[str, str]] = ()
           ) -> list[str]:
    """The GPUs assigned to a container kubelet is probably admitting now, one per ID
    it should get (a GPU repeated for percent IDs, as
    :func:`vgpud.plugin.replicas.preferred` takes them).

    ``waiting`` maps each pod to its containers that PodResources lists without devices
    of the resource yet. In a pod of ``init_waiting`` (being admitted) the regular init
    containers, which PodResources never lists, may wait too: kubelet allocates a pod's
    containers in spec order (the assignment's), so one may wait while no listed
    container after it with GPUs (a sidecar declared after it, an app container) holds
    IDs. The first of them, in the assignment's order, whose assignment needs ``size``
    IDs of it (one per vGPU, or in percent units the cores granted on each GPU) wins.
    """
    inits = set(init_waiting)
    for key in [*waiting, *(k for k in inits if k not in waiting)]:
        containers = waiting.get(key, set())
        placement = assignments.get(key)
        if not isinstance(placement, Placement):
            continue
        holding = [i for i, c in enumerate(placement.containers)
                   if c.devices and (c.sidecar or not c.init) and c.name not in containers]
        last = max(holding, default=-1)
        for i, c in enumerate(placement.containers):
            init_waits = key in inits and c.init and not c.sidecar and i > last
            if c.name not in containers and not init_waits:
                continue
            ids = [d.uuid for d in c.devices for _ in range(ids_for(per_gpu, d))]
            if len(ids) == size:
                return ids
    return []


def stale(allocations: Iterable[tuple[str, H, float]], live: set[H],
          now: float, grace: float) -> list[str]:
    """Keys of allocations ``(key, held, written)`` whose ``held`` (the IDs, with their
    resource) kubelet no longer lists and that were last written more than ``grace``
    seconds ago."""
    return [key for key, ids, written in allocations
            if ids not in live and now - written >= grace]


@dataclass(frozen=True, slots=True)
class ActivePod:
    """A pod kubelet's PodResources lists, as :func:`starting_init_container` needs it:
    its assignment (decoded), the init containers its status shows completed, and
    the IDs (of the resource at hand) its listed containers hold."""

    namespace: str
    name: str
    assignment: Assignment
    init_done: frozenset[str]
    held: frozenset[str]


def starting_init_container(pods: Iterable[ActivePod], ids: Collection[str], *,
                            per_gpu: int = VGPU_IDS) -> tuple[str, str, str] | str:
    """``(namespace, pod, container)`` of the regular init container kubelet is starting
    with ``ids``, or why it cannot be told (to follow "no listed container holds them,
    and").

    Called when no container PodResources lists holds exactly ``ids``: kubelet's
    PodResources ``List`` leaves regular (non-restartable) init containers out, and its
    device manager hands such a container's IDs on to the pod's later containers. So:

    - kubelet never gives one pod's IDs to another while the pod is active: a pod whose
      listed containers hold any of ``ids`` is the owner;
    - otherwise each pod's first regular init container of its assignment that needs
      ``len(ids)`` IDs and that its status does not show completed is a candidate (a
      status that lags names an earlier one of the same pod, never a later one);
    - several candidates: those on the GPUs of ``ids``; still several: none is chosen.
    """
    want = frozenset(ids)
    gpus = sorted(set(gpus_of(want)))
    pods = list(pods)
    owners = [p for p in pods if p.held & want]
    if owners:
        pods = owners
    found: list[tuple[tuple[str, str, str], bool]] = []
    for p in pods:
        if not isinstance(p.assignment, Placement):
            continue
        for c in p.assignment.containers:
            if (c.init and not c.sidecar and c.name not in p.init_done
                    and sum(ids_for(per_gpu, d) for d in c.devices) == len(want)):
                found.append(((p.namespace, p.name, c.name),
                              sorted({d.uuid for d in c.devices}) == gpus))
                break
    if len(found) > 1:
        found = [f for f in found if f[1]] or found
    if len(found) == 1:
        return found[0][0]
    if not found:
        return f"no active pod has an init container waiting for {len(want)} of them"
    return "they could be the init container of any of " + ", ".join(
        f"pod {ns}/{pod} container {c!r}" for (ns, pod, c), _ in found)


def reconcile(
    placement: Placement,
    container: str,
    chosen: Sequence[str],
    inventory: NodeInventory,
    others: Mapping[str, GpuUsage],
) -> Placement | Reason:
    """Check kubelet's choice of GPUs (``chosen``, one uuid per replica) for a container.

    Returns ``placement`` itself when the choice equals the assignment, a new placement
    with the container's vGPUs moved onto the chosen GPUs when those have room next to
    ``others`` (what every *other* pod on the node holds), or a :class:`Reason`.
    """
    grant = placement.container(container)
    if grant is None or not grant.devices:
        return Reason("no-grant", f"the assignment has no GPU for container {container!r}", False)
    if len(set(chosen)) != len(chosen):
        return Reason("same-gpu", f"kubelet gave container {container!r} two vGPUs of one GPU "
                      f"({', '.join(sorted(chosen))}); its vGPUs must be on distinct GPUs", False)
    if len(chosen) != len(grant.devices):
        return Reason("count", f"kubelet gave container {container!r} {len(chosen)} vGPUs but "
                      f"the assignment has {len(grant.devices)}", False)
    by_uuid = {g.uuid: g for g in inventory.devices}
    unknown = [u for u in chosen if u not in by_uuid]
    if unknown:
        return Reason("unknown-gpu", f"kubelet chose GPUs this node does not report: "
                      f"{', '.join(unknown)}", False)
    granted = {d.uuid for d in grant.devices}
    if granted == set(chosen):
        return placement
    index = {g.uuid: g.index for g in inventory.devices}
    moving = sorted((d for d in grant.devices if d.uuid not in set(chosen)),
                    key=lambda d: (index.get(d.uuid, 1 << 20), d.uuid))
    targets = sorted((u for u in chosen if u not in granted), key=lambda u: index[u])
    moved = {d.uuid: replace(d, uuid=t) for d, t in zip(moving, targets, strict=True)}
    devices = tuple(moved.get(d.uuid, d) for d in grant.devices)
    new_grant = ContainerGrant(name=grant.name, init=grant.init, devices=devices,
                               sidecar=grant.sidecar)
    new = replace(placement, containers=tuple(new_grant if c.name == container else c
                                              for c in placement.containers))
    mine = new.charge()
    for t in targets:
        gpu = by_uuid[t]
        why = room(t, inventory.capacity(gpu), others.get(t, ZERO), mine.get(t, ZERO),
                   healthy=gpu.healthy, whole=not gpu.mig, predicates=DEVICE)
        if why is not None:
            return Reason("no-room", f"kubelet chose GPU {t} for container {container!r} instead "
                          f"of the assigned {', '.join(sorted(granted - set(chosen)))}, and it "
                          f"has no room: {why.message}", True)
    return new
