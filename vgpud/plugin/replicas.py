"""Replica device IDs and the plugin's decisions about them. Pure: no I/O, no async.

kubelet sees each GPU as interchangeable devices ``<uuid>::<i>``, ``split`` of them for
a vGPU resource, one per percent for TKE's ``tencent.com/vcuda-core``
(:mod:`vgpud.plugin.resources`). A container's set of replica IDs of one resource is
exclusive to it while it lives, so the resource and the set name the container
(:func:`allocation_key`). This module decides

- what ListAndWatch advertises (:func:`advertised`),
- which IDs to prefer when kubelet asks (:func:`preferred`), for either unit,
- whether kubelet's actual choice can stand (:func:`reconcile`): equal to the
  assignment, or moved onto GPUs that still have room (a new placement to write), or
  a :class:`~vgpud.core.model.Reason` to fail the container with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from vgpud.core.fit import DEVICE, room
from vgpud.core.model import (
    ZERO,
    ContainerGrant,
    GpuUsage,
    NodeInventory,
    Placement,
    Reason,
)
from vgpud.plugin.resources import VGPU_IDS

SEP = "::"
MAX_ID_LEN = 63  # kubelet's limit on a device ID


class ReplicaIdError(ValueError):
    """A device ID that is not ``<uuid>::<i>``."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One advertised device: a share of one GPU."""

    id: str
    uuid: str
    index: int
    healthy: bool
    numa: int  # -1: unknown


def replica_id(uuid: str, i: int) -> str:
    rid = f"{uuid}{SEP}{i}"
    if len(rid) > MAX_ID_LEN:
        raise ReplicaIdError(f"device ID {rid!r} is longer than kubelet's {MAX_ID_LEN} characters")
    return rid


def parse_id(rid: str) -> tuple[str, int]:
    uuid, sep, i = rid.rpartition(SEP)
    if not sep or not uuid or not i.isdigit():
        raise ReplicaIdError(f"{rid!r} is not a vgpud device ID (<gpu-uuid>{SEP}<n>)")
    return uuid, int(i)


def gpus_of(ids: Iterable[str]) -> list[str]:
    """The GPU uuids of some replica IDs, in first-seen order, repeats kept."""
    return [parse_id(r)[0] for r in ids]


def advertised(inventory: NodeInventory, per_gpu: int | None = None,
               profile: str = "") -> list[Replica]:
    """Every replica of every device a resource offers, in inventory order: ``per_gpu``
    of each (its ``split`` when None).

    A vGPU resource (``profile`` "") offers the GPUs and the MIG instances shared like
    GPUs; a MIG-mode GPU none of whose instances is offered is advertised unhealthy (so
    kubelet's capacity shows it), one whose instances are offered is not advertised
    at all. A profile resource offers the instances of that profile, one ID each."""
    parents = {g.parent for g in inventory.devices if g.parent}
    out: list[Replica] = []
    for g in inventory.devices:
        if g.mig:
            if profile or g.uuid in parents:
                continue
        elif g.profile != profile:
            continue
        healthy = g.healthy and not g.mig
        n = 1 if profile else g.split if per_gpu is None else per_gpu
        out += [Replica(replica_id(g.uuid, i), g.uuid, i, healthy, g.numa) for i in range(n)]
    return out


def preferred(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    wanted: Sequence[str] = (),
    per_gpu: int = VGPU_IDS,
) -> list[str]:
    """Choose ``size`` IDs from ``available``, keeping ``must_include``.

    ``wanted`` (the scheduler's choice) names one GPU per ID wanted, a GPU repeated as
    many times as IDs of it are wanted (a vGPU resource: each GPU once; TKE's percent
    IDs: ``vcuda-core: 30`` is one GPU 30 times). Those come first; the rest are filled
    from the GPUs with the most free replicas, at most ``per_gpu`` IDs of each (one: a
    container's vGPUs must be on distinct GPUs; 100: a whole GPU's percent), and only
    then from any GPU. Within a GPU the lowest replica number is taken, so choices are
    deterministic.
    """
    free: dict[str, list[tuple[int, str]]] = {}
    for rid in available:
        try:
            uuid, i = parse_id(rid)
        except ReplicaIdError:
            continue
        free.setdefault(uuid, []).append((i, rid))
    for reps in free.values():
        reps.sort()
    chosen: list[str] = []
    held: Counter[str] = Counter()

    def take(uuid: str, upto: int) -> None:
        reps = free.get(uuid)
        while reps and held[uuid] < upto and len(chosen) < size:
            chosen.append(reps.pop(0)[1])
            held[uuid] += 1

    for rid in must_include:
        if rid not in chosen:
            chosen.append(rid)
            try:
                uuid = parse_id(rid)[0]
            except ReplicaIdError:
                continue
            held[uuid] += 1
            free[uuid] = [r for r in free.get(uuid, []) if r[1] != rid]
    for uuid, n in Counter(wanted).items():  # in the order first wanted
        take(uuid, n)
    for uuid in sorted(free, key=lambda u: (-len(free[u]), u)):
        take(uuid, per_gpu)
    for uuid in sorted(free, key=lambda u: (-len(free[u]), u)):
        take(uuid, size)
    return chosen[:max(size, len(must_include))]


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
