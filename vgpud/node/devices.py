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

from vgpud.core.model import Gpu, NodeInventory


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as discovered: the model's fields and its /dev/nvidiaN minor."""

    gpu: Gpu
    minor: int


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU became healthy or unhealthy, and why."""

    uuid: str
    healthy: bool
    reason: str


class GpuSource(Protocol):
    """A backend of physical GPUs. Every method keeps blocking work off the event loop."""

    async def discover(self) -> tuple[DeviceInfo, ...]: ...

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


class NodeDevices:
    """The node's GPUs, their health, and the settings that shape the inventory."""

    def __init__(self, found: tuple[DeviceInfo, ...], *, split: int, memory_scaling: float,
                 core_scaling: float) -> None:
        self._info = {d.gpu.uuid: d for d in found}
        self._healthy = {d.gpu.uuid: d.gpu.healthy for d in found}
        self._reasons: dict[str, str] = {}
        self.split = split
        self.memory_scaling = memory_scaling
        self.core_scaling = core_scaling
        self.version = 0
        self._changed = anyio.Event()

    @property
    def uuids(self) -> list[str]:
        return [d.gpu.uuid for d in sorted(self._info.values(), key=lambda d: d.gpu.index)]

    def info(self, uuid: str) -> DeviceInfo | None:
        return self._info.get(uuid)

    def healthy(self, uuid: str) -> bool:
        return self._healthy.get(uuid, False)

    def reason(self, uuid: str) -> str:
        return self._reasons.get(uuid, "")

    def inventory(self) -> NodeInventory:
        gpus = tuple(replace(d.gpu, split=self.split, healthy=self._healthy[d.gpu.uuid])
                     for d in sorted(self._info.values(), key=lambda d: d.gpu.index))
        return NodeInventory(devices=gpus, memory_scaling=self.memory_scaling,
                             core_scaling=self.core_scaling)

    def apply(self, event: HealthEvent) -> bool:
        """Record a health transition; True when it changed anything."""
        if event.uuid not in self._info or self._healthy[event.uuid] == event.healthy:
            return False
        self._healthy[event.uuid] = event.healthy
        self._reasons[event.uuid] = "" if event.healthy else event.reason
        self._bump()
        return True

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_change(self, seen: int) -> int:
        """Return the current version once it differs from ``seen``."""
        while self.version == seen:
            await self._changed.wait()
        return self.version
