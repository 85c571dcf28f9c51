"""Which replica device IDs kubelet is offered and steered to. Pure: no I/O, no async.

kubelet sees each GPU as interchangeable devices ``<uuid>::<i>``
(:mod:`vgpud.node.ids`), ``split`` of them for a vGPU resource, one per percent for
TKE's ``tencent.com/vcuda-core`` (:mod:`vgpud.plugin.resources`). This module decides

- what ListAndWatch advertises (:func:`advertised`),
- which IDs to prefer when kubelet asks (:func:`preferred`), for either unit.

Whether kubelet's actual choice can stand is the node's decision
(:func:`vgpud.node.startup.reconcile`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from vgpud.core.model import NodeInventory
from vgpud.node.ids import VGPU_IDS, ReplicaIdError, parse_id, replica_id


@dataclass(frozen=True, slots=True)
class Replica:
    """One advertised device: a share of one GPU."""

    id: str
    uuid: str
    index: int
    healthy: bool
    numa: int  # -1: unknown


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
