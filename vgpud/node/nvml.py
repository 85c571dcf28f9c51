"""GPUs from NVML (nvidia-ml-py). The only module that imports ``pynvml``.

Every NVML call runs in a worker thread (``anyio.to_thread``); the health watcher
blocks in ``nvmlEventSetWait_v2`` in its own thread with a short timeout so it can
be cancelled.

Discovery: uuid, index, model, memory (MiB), the /dev/nvidiaN minor, the NUMA node
(from sysfs, by PCI bus id), NVLink peers (remote PCI bus ids mapped back to uuids)
and MIG mode.

Health: critical Xid and double-bit ECC events mark a GPU unhealthy (Xids caused by
applications are ignored, as NVIDIA's plugin does), and so does a GPU recovery
action event asking for a reset, reboot or drain. Unlike NVIDIA's plugin, this is not
a one-way latch: a recovery action event of "none" (the driver's all-clear) makes the
GPU healthy again at once if it passes a probe; otherwise an unhealthy GPU is probed
every ``recheck`` seconds, and after ``quiet`` seconds without a new error, a GPU
that answers NVML and has no pending page retirement or row remapping is healthy.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pynvml
import structlog
from anyio.abc import ObjectSendStream

from vgpud.core.model import Gpu
from vgpud.node.devices import DeviceInfo, HealthEvent

log = structlog.get_logger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MIB = 1 << 20
SYS_PCI = Path("/sys/bus/pci/devices")


class NvmlError(RuntimeError):
    """NVML failed; the message names the call."""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it: ``0000:3b:00.0``."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def numa_node(bus_id: str, handle: Any = None, root: Path = SYS_PCI) -> int:
    """The NUMA node of a PCI device from sysfs; else NVML's answer; else -1 (unknown)."""
    try:
        node = int((root / sysfs_bus_id(bus_id) / "numa_node").read_text().strip())
        if node >= 0:  # -1: the kernel does not know (single-node machines)
            return node
    except (OSError, ValueError):
        pass
    if handle is not None:
        try:
            return int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        except (pynvml.NVMLError, AttributeError):
            pass
    return -1


def _discover() -> tuple[DeviceInfo, ...]:
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bus = {}
    for h in handles:
        bus[_text(pynvml.nvmlDeviceGetPciInfo(h).busId).upper()] = _text(
            pynvml.nvmlDeviceGetUUID(h))
    out = []
    for i, h in enumerate(handles):
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
        links: set[str] = set()
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).upper()
            except pynvml.NVMLError:
                break
            if remote in bus and bus[remote] != uuid:
                links.add(bus[remote])
        try:
            mig = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:
            mig = False
        try:
            minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
        except pynvml.NVMLError:
            minor = i
        gpu = Gpu(uuid=uuid, index=int(pynvml.nvmlDeviceGetIndex(h)),
                  model=_text(pynvml.nvmlDeviceGetName(h)),
                  memory=int(pynvml.nvmlDeviceGetMemoryInfo(h).total // MIB),
                  numa=numa_node(bus_id, h), links=tuple(sorted(links)), mig=mig)
        out.append(DeviceInfo(gpu=gpu, minor=minor))
    return tuple(out)


def _memory_used() -> dict[str, int]:
    out = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out[_text(pynvml.nvmlDeviceGetUUID(h))] = int(pynvml.nvmlDeviceGetMemoryInfo(h).used
                                                       // MIB)
    return out


def _processes() -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        rows = []
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            used = p.usedGpuMemory
            if used is not None:  # None: NVML cannot tell (not permitted, WDDM)
                rows.append((int(p.pid), int(used)))
        out[_text(pynvml.nvmlDeviceGetUUID(h))] = rows
    return out


def _utilisation(since: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Per GPU uuid, (host PID, SM %) of each process NVML sampled since the last call
    (``since``: per uuid, the newest sample's timestamp seen, updated here)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, since.get(uuid, 0))
        except pynvml.NVMLError_NotFound:
            out[uuid] = []  # no process sampled since: all idle
            continue
        rows = []
        for smp in samples:
            rows.append((int(smp.pid), int(smp.smUtil)))
            since[uuid] = max(since.get(uuid, 0), int(smp.timeStamp))
        out[uuid] = rows
    return out


def _probe(uuid: str) -> bool:
    """A GPU answers NVML and has no pending page retirement or row remapping."""
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetMemoryInfo(h)
    except pynvml.NVMLError:
        return False
    try:
        if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == pynvml.NVML_FEATURE_ENABLED:
            return False
    except pynvml.NVMLError:
        pass
    try:
        _corr, _unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
        if pending or failure:
            return False
    except pynvml.NVMLError:
        pass
    return True


class NvmlGpus:
    """A :class:`~vgpud.node.devices.GpuSource` backed by NVML."""

    def __init__(self, *, wait_ms: int = 1000, quiet: float = 120.0, recheck: float = 30.0) -> None:
        self.wait_ms = wait_ms
        self.quiet = quiet
        self.recheck = recheck
        self._uuids: list[str] = []
        self._util_since: dict[str, int] = {}

    async def discover(self) -> tuple[DeviceInfo, ...]:
        try:
            found = await anyio.to_thread.run_sync(_discover)
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML discovery failed: {e}") from None
        self._uuids = [d.gpu.uuid for d in found]
        return found

    def _wait_loop(self, send: ObjectSendStream[HealthEvent], cancelled: list[bool]) -> None:
        events = pynvml.nvmlEventSetCreate()
        wanted = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
                  | pynvml.nvmlEventTypeGpuRecoveryAction)
        try:
            for uuid in self._uuids:
                h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                try:
                    mask = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
                    pynvml.nvmlDeviceRegisterEvents(h, mask, events)
                except pynvml.NVMLError as e:
                    log.warning("health_events_unsupported", uuid=uuid, error=str(e))
            last_error: dict[str, float] = {}
            last_probe = time.monotonic()
            while not cancelled[0]:
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, self.wait_ms)
                except pynvml.NVMLError_Timeout:
                    data = None
                if data is not None:
                    uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
                    kind, xid = int(data.eventType), int(data.eventData)
                    if kind & pynvml.nvmlEventTypeGpuRecoveryAction:
                        if xid == pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
                            if uuid in last_error and _probe(uuid):
                                del last_error[uuid]
                                anyio.from_thread.run(send.send, HealthEvent(
                                    uuid, True, "the driver reports no recovery action needed"))
                            continue
                        why = f"the driver asks for recovery action {xid}"
                    elif kind & pynvml.nvmlEventTypeXidCriticalError:
                        if xid in APPLICATION_XIDS:
                            continue
                        why = f"Xid {xid}"
                    else:
                        why = "double-bit ECC error"
                    last_error[uuid] = time.monotonic()
                    anyio.from_thread.run(send.send, HealthEvent(uuid, False, why))
                now = time.monotonic()
                if last_error and now - last_probe >= self.recheck:
                    last_probe = now
                    for uuid, t in list(last_error.items()):
                        if now - t >= self.quiet and _probe(uuid):
                            del last_error[uuid]
                            anyio.from_thread.run(send.send, HealthEvent(
                                uuid, True, f"no error for {self.quiet:g} s and probe passed"))
        finally:
            pynvml.nvmlEventSetFree(events)

    async def watch_health(self, send: ObjectSendStream[HealthEvent]) -> None:
        cancelled = [False]
        async with send:
            try:
                await anyio.to_thread.run_sync(self._wait_loop, send, cancelled,
                                               abandon_on_cancel=True)
            finally:
                cancelled[0] = True

    async def memory_used(self) -> Mapping[str, int]:
        try:
            return await anyio.to_thread.run_sync(_memory_used)
        except pynvml.NVMLError as e:
            log.warning("memory_used_failed", error=str(e))
            return {}

    async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
        try:
            return await anyio.to_thread.run_sync(_processes)
        except pynvml.NVMLError as e:
            log.warning("processes_failed", error=str(e))
            return {}

    async def utilisation(self) -> Mapping[str, list[tuple[int, int]]]:
        try:
            return await anyio.to_thread.run_sync(_utilisation, self._util_since)
        except pynvml.NVMLError as e:
            log.warning("utilisation_failed", error=str(e))
            return {}

    async def aclose(self) -> None:
        try:
            await anyio.to_thread.run_sync(pynvml.nvmlShutdown)
        except pynvml.NVMLError:
            pass
