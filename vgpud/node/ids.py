"""Device IDs: the names of a GPU's shares that an adapter hands out and the node keys its
allocations by (:func:`vgpud.node.allocations.allocation_key`). Pure: no I/O, no async.

An ID is ``<uuid>::<i>``, the ``i``-th share of one GPU. What one ID is worth is its
resource's unit (``per_gpu``): :data:`VGPU_IDS`, one ID is one vGPU (the container's
share of that GPU is what its assignment grants there), or :data:`PERCENT_IDS`, one ID
is 1 % of the GPU (TKE's ``tencent.com/vcuda-core``): :func:`ids_for`.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpud.core.model import DeviceGrant

SEP = "::"
MAX_ID_LEN = 63  # kubelet's limit on a device ID
VGPU_IDS = 1  # per_gpu: one ID is one vGPU
PERCENT_IDS = 100  # per_gpu: one ID is 1 % of a GPU (TKE's vcuda-core)


class ReplicaIdError(ValueError):
    """A device ID that is not ``<uuid>::<i>``."""


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


def ids_for(per_gpu: int, grant: DeviceGrant) -> int:
    """IDs a container holds on one GPU for ``grant``: one vGPU is one ID; in percent
    units the grant's cores (at least one ID, so no granted GPU goes unnamed)."""
    if per_gpu <= VGPU_IDS:
        return 1
    return max(1, grant.cores * per_gpu // 100)
