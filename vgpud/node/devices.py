"""Where the plugin's GPUs come from, and the node's live device state.

A *source* (:class:`GpuSource`) discovers the physical GPUs once and then reports
health transitions; :mod:`vgpud.node.nvml` reads NVML, :mod:`vgpud.node.fakegpus`
a file. :class:`NodeDevices` holds what the rest of the plugin reads: the GPUs with
their current health, the node's split and scaling, and a version that changes
whenever the advertised inventory changes (ListAndWatch and the node annotation
wait on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import anyio
from anyio.abc import ObjectSendStream

from vgpud.core.model import Gpu, NodeInventory, offered


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device as discovered: the model's fields and the device nodes it needs.

    A MIG instance (``gpu.parent`` set, ``gpu.profile`` its profile whatever the node's
    strategy) uses its GPU's ``/dev/nvidiaN`` and the ``/dev/nvidia-caps`` minors of
    its GPU and compute instances (``caps``)."""

    gpu: Gpu
    minor: int
    caps: tuple[int, ...] = ()


class DiscoveryError(ValueError):
    """The node's devices could not be read (a backend's own errors derive from it); the
    message says where and why."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU became healthy or unhealthy, and why."""

    uuid: str
    healthy: bool
    reason: str
    gone: bool = False  # the GPU may have left the bus: discover again now


class GpuSource(Protocol):
    """A backend of physical GPUs. Every method keeps blocking work off the event loop."""

    async def discover(self) -> tuple[DeviceInfo, ...]:
        """The devices on the node now. May run again at any time and then sees the bus
        as it is then (NVML: a new session, :class:`vgpud.node.nvml.NvmlSession`)."""
        ...

    async def watch_health(self, send: ObjectSendStream[HealthEvent]) -> None:
        """Send health transitions until cancelled."""
        ...

    async def memory_used(self) -> Mapping[str, int]:
        """Device memory in use per GPU uuid, MiB (for metrics)."""
        ...

    async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
        """Per GPU uuid, (host PID, device bytes) of every process using it (the
        watchdog's truth); empty when the source cannot tell."""
        ...

    async def utilisation(self) -> Mapping[str, list[tuple[int, int]]]:
        """Per GPU uuid, (host PID, SM %) of each process sampled since the last call
        (the arbiter's truth); an empty list for a GPU nobody used."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Changes:
    """What one discovery changed: uuids added, gone (advertised unhealthy until
    :meth:`NodeDevices.drop`), and the (old, new) uuids of boards swapped in place."""

    added: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    replaced: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.gone)


def _slot(d: DeviceInfo) -> tuple[int, str]:
    """Where a device sits: a GPU by its device node (indexes shift when a GPU before it
    leaves the bus; minor numbers do not), an instance by its GPU's and its profile."""
    return (d.minor, d.gpu.profile if d.gpu.parent else "")


class NodeDevices:
    """The node's GPUs, their health, and the settings that shape the inventory.

    ``mig`` is the node's MIG strategy: with "none" instances are not offered; "single"
    offers them as GPUs of their size, shared in vGPUs; "mixed" offers each whole under
    its profile (one vGPU). Discovery may run again (:meth:`update`): new devices are
    added, devices no longer found are marked unhealthy and then dropped (:meth:`drop`),
    and ``version`` changes only when the advertised inventory does.
    """

    def __init__(self, found: tuple[DeviceInfo, ...], *, split: int, memory_scaling: float,
                 core_scaling: float, mig: str = "none") -> None:
        self.split = split
        self.memory_scaling = memory_scaling
        self.core_scaling = core_scaling
        self.mig = mig
        self._info: dict[str, DeviceInfo] = {}
        self._healthy: dict[str, bool] = {}
        self._reasons: dict[str, str] = {}
        self._gone: set[str] = set()
        self.changes = {"added": 0, "removed": 0, "replaced": 0}  # counters, for metrics
        for d in self._offered(found):
            self._info[d.gpu.uuid] = d
            self._healthy[d.gpu.uuid] = d.gpu.healthy
        self.version = 0
        self._changed = anyio.Event()

    def _offered(self, found: tuple[DeviceInfo, ...]) -> list[DeviceInfo]:
        """The devices the node offers under its MIG strategy, shaped for it."""
        out = []
        for d in found:
            g = offered(d.gpu, self.mig)
            if g is not None:
                out.append(replace(d, gpu=g))
        return out

    @property
    def uuids(self) -> list[str]:
        return [d.gpu.uuid for d in sorted(self._info.values(), key=_order)]

    def info(self, uuid: str) -> DeviceInfo | None:
        return self._info.get(uuid)

    def found(self, uuid: str) -> bool:
        """The device is on the node: known, and found again by the last discovery (a
        device no longer found stays known, unhealthy, until :meth:`drop`)."""
        return uuid in self._info and uuid not in self._gone

    def healthy(self, uuid: str) -> bool:
        return self._healthy.get(uuid, False)

    def reason(self, uuid: str) -> str:
        return self._reasons.get(uuid, "")

    def inventory(self) -> NodeInventory:
        gpus = tuple(replace(d.gpu, split=1 if d.gpu.profile else self.split,
                             healthy=self._healthy[d.gpu.uuid])
                     for d in sorted(self._info.values(), key=_order))
        return NodeInventory(devices=gpus, memory_scaling=self.memory_scaling,
                             core_scaling=self.core_scaling)

    def apply(self, event: HealthEvent) -> bool:
        """Record a health transition; True when it changed anything."""
        if (event.uuid not in self._info or event.uuid in self._gone
                or self._healthy[event.uuid] == event.healthy):
            return False
        self._healthy[event.uuid] = event.healthy
        self._reasons[event.uuid] = "" if event.healthy else event.reason
        self._bump()
        return True

    def update(self, found: tuple[DeviceInfo, ...]) -> Changes:
        """Take a new discovery. Devices not found any more are marked unhealthy (and
        reported as ``gone``; :meth:`drop` removes them); new ones are added with the
        health they were found with; a device found again comes back. A new uuid in the
        slot of a gone one (same index; for an instance, same index and profile) is a
        board swapped in place: ``replaced``. Its pods' assignments name the old uuid,
        so nothing is carried over to the new one. A known device whose facts changed
        (its index, when a GPU before it left) is updated."""
        offered = {d.gpu.uuid: d for d in self._offered(found)}
        added = [u for u in offered if u not in self._info]
        moved = [u for u, d in offered.items()  # e.g. a new index: one before it left
                 if u in self._info and replace(self._info[u], gpu=replace(
                     self._info[u].gpu, healthy=d.gpu.healthy)) != d]
        for u in moved:
            self._info[u] = offered[u]
        gone = [u for u in self._info if u not in offered and u not in self._gone]
        back = [u for u in self._gone if u in offered]
        for u in back:
            self._gone.discard(u)
            self._healthy[u] = offered[u].gpu.healthy
            self._reasons.pop(u, None)
        for u in gone:
            self._gone.add(u)
            self._healthy[u] = False
            self._reasons[u] = "no longer found on the node (removed, or fell off the bus)"
        for u in added:
            self._info[u] = offered[u]
            self._healthy[u] = offered[u].gpu.healthy
        old_slots = {_slot(self._info[u]): u for u in self._gone}
        replaced = tuple((old_slots[_slot(offered[u])], u) for u in added
                         if _slot(offered[u]) in old_slots)
        self.changes["added"] += len(added) - len(replaced)
        self.changes["replaced"] += len(replaced)
        if added or gone or back or moved:
            self._bump()
        return Changes(tuple(added), tuple(gone), replaced)

    def drop(self, uuids: tuple[str, ...]) -> bool:
        """Remove gone devices that were not found again since."""
        dropped = [u for u in uuids if u in self._gone]
        for u in dropped:
            self._gone.discard(u)
            del self._info[u], self._healthy[u]
            self._reasons.pop(u, None)
        self.changes["removed"] += len(dropped)
        if dropped:
            self._bump()
        return bool(dropped)

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_change(self, seen: int) -> int:
        """Return the current version once it differs from ``seen``."""
        while self.version == seen:
            await self._changed.wait()
        return self.version


def _order(d: DeviceInfo) -> tuple[int, int, str]:
    """GPUs by index, each GPU's instances after it."""
    return (d.gpu.index, 1 if d.gpu.parent else 0, d.gpu.uuid)
