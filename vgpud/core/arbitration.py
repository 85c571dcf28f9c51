"""Priority across the containers sharing a GPU: what the node decides, as values.

What priority means: when containers share a GPU, the one with the highest
``nvidia.com/vgpu-priority`` that is *active* (its processes use the SMs) runs by its
own policy; every container of lower priority on that GPU is held to the *floor*
until no higher priority is active any more. Containers of equal priority do not
hold each other back. Memory is not arbitrated: it is a hard limit, granted at
scheduling, and taking it back would kill work.

The floor is a few per cent of the SMs (``priorityFloorPercent``, default 5), never
more than a container's own limit. Zero would starve: a held container's health
checks, NCCL heartbeats and data loaders time out, and a training job dies instead of
slowing down. A small floor keeps it alive and leaves the rest to the higher one.

Activity is what NVML on the host measures per process (a container cannot forge
another's utilisation), summed over the container's processes on that GPU. A container
stays active for ``hold`` seconds after its last busy sample, so an inference server
between two requests does not let the lower ones in and out at every gap.

A container can only make itself look busy (by being busy, or by naming processes in
its own usage file): that holds back containers of *lower* priority only, which
burning the SMs would do anyway. It can never lift its own priority, which comes from
its read-only limits file.

The node publishes one :class:`Record` per GPU (``vgpud/node/arbiter.py`` writes it
where the shims read it); :func:`shares` is what the shims then do with the SMs, for
the simulator and the docs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpud.core.model import ComputePolicy

BUSY_PERCENT = 1  # NVML's smallest non-zero reading: any measurable use


@dataclass(frozen=True, slots=True)
class Contender:
    """One container's use of one GPU in the last sample."""

    key: str
    uuid: str
    priority: int
    sm_percent: int  # what NVML saw its processes use, summed


@dataclass(frozen=True, slots=True)
class Record:
    """What the node publishes for one GPU."""

    uuid: str
    active: bool
    top_priority: int
    floor_permille: int
    held: tuple[str, ...] = ()  # the containers this record holds at the floor
    running: tuple[str, ...] = ()  # the active ones at the top priority


@dataclass
class Arbiter:
    """Activity with hysteresis, and the per-GPU records it implies."""

    floor_permille: int = 50
    hold: float = 1.0
    busy_percent: int = BUSY_PERCENT
    _last_busy: dict[tuple[str, str], float] = field(default_factory=dict)

    def decide(self, now: float, gpus: Iterable[str],
               members: Mapping[str, Sequence[tuple[str, int]]],
               samples: Iterable[Contender]) -> dict[str, Record]:
        """``members``: per GPU, its containers as (key, priority); ``samples``: this
        round's measured use. Returns one record per GPU in ``gpus``."""
        for c in samples:
            if c.sm_percent >= self.busy_percent:
                self._last_busy[(c.key, c.uuid)] = now
        live = {(k, u) for u, ms in members.items() for k, _ in ms}
        for k in [k for k in self._last_busy if k not in live]:
            del self._last_busy[k]  # the container left the GPU
        out = {}
        for uuid in gpus:
            ms = members.get(uuid, ())
            active = [(k, p) for k, p in ms
                      if now - self._last_busy.get((k, uuid), -1e18) <= self.hold]
            if not active:
                out[uuid] = Record(uuid, False, 0, self.floor_permille)
                continue
            top = max(p for _, p in active)
            out[uuid] = Record(
                uuid, True, top, self.floor_permille,
                held=tuple(sorted(k for k, p in ms if p < top)),
                running=tuple(sorted(k for k, p in active if p == top)))
        return out


@dataclass(frozen=True, slots=True)
class Share:
    """A container on one GPU, for :func:`shares`."""

    key: str
    priority: int
    limit: int  # percent of the SMs; 0 = none
    policy: ComputePolicy
    busy: bool  # wants the SMs (runs kernels flat out)


def shares(containers: Sequence[Share], floor_percent: int = 5) -> dict[str, float]:
    """The SM percent each busy container gets once the shims follow the record, in
    the steady state: the top priority's containers by their policy (fixed: the limit;
    balance: the limit plus an even part of what the others leave; none or no limit:
    an even part of what is left), the lower ones at most the floor. Idle ones get 0."""
    busy = [c for c in containers if c.busy]
    if not busy:
        return {c.key: 0.0 for c in containers}
    top = max(c.priority for c in busy)
    out = {c.key: 0.0 for c in containers}
    left = 100.0
    for c in busy:
        if c.priority < top:
            out[c.key] = float(min(floor_percent, c.limit) if c.limit else floor_percent)
            left -= out[c.key]
    leaders = [c for c in busy if c.priority == top]
    for c in leaders:
        if c.limit and c.policy is not ComputePolicy.NONE:
            out[c.key] = float(c.limit)
    want = sum(out[c.key] for c in leaders)
    if want > left:  # limits over-subscribed: the device is shared in their proportion
        for c in leaders:
            out[c.key] = out[c.key] * left / want
        return out
    left -= want
    greedy = [c for c in leaders
              if not c.limit or c.policy in (ComputePolicy.BALANCE, ComputePolicy.NONE)]
    for c in greedy:
        out[c.key] += left / len(greedy)
    return out
