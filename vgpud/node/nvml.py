"""GPUs from NVML (nvidia-ml-py). The only module that imports ``pynvml``.

Every NVML call runs in a worker thread (``anyio.to_thread``); the health watcher
blocks in ``nvmlEventSetWait_v2`` in its own thread with a short timeout so it can
be cancelled.

Discovery: uuid, index, model, memory (MiB), the /dev/nvidiaN minor, the NUMA node
(from sysfs, by PCI bus id), NVLink peers (remote PCI bus ids mapped back to uuids)
and MIG mode; for a GPU in MIG mode, each MIG device (a compute instance): its
``MIG-`` uuid, name, memory, profile (``<g>g.<GB>gb`` from its attributes, as NVIDIA
names them; ``<c>c.<g>g.<GB>gb`` for a compute instance smaller than its GPU instance)
and the ``/dev/nvidia-caps`` minors of its GPU and compute instances (from
``/proc/driver/nvidia/capabilities``). Discovery may run again at any time: GPUs
that left the bus are missing from the answer, new ones appear.

Health: Xid 79 (the GPU fell off the bus) asks for discovery at once. Critical Xid and
double-bit ECC events mark a GPU unhealthy (Xids caused by
applications are ignored, as NVIDIA's plugin does), and so does a GPU recovery
action event asking for a reset, reboot or drain. Unlike NVIDIA's plugin, this is not
a one-way latch: a recovery action event of "none" (the driver's all-clear) makes the
GPU healthy again at once if it passes a probe; otherwise an unhealthy GPU is probed
every ``recheck`` seconds, and after ``quiet`` seconds without a new error, a GPU
that answers NVML and has no pending page retirement or row remapping is healthy.
"""

from __future__ import annotations

import ctypes
import math
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
FELL_OFF_THE_BUS = 79
MIB = 1 << 20
SYS_PCI = Path("/sys/bus/pci/devices")
NVIDIA_CAPS = Path("/proc/driver/nvidia/capabilities")


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


def cap_minor(gpu_minor: int, path: str, root: Path = NVIDIA_CAPS) -> int | None:
    """The ``/dev/nvidia-caps`` minor of a MIG capability (``gi1/access``,
    ``gi1/ci0/access``) of GPU ``/dev/nvidia<gpu_minor>``: the ``DeviceFileMinor`` line
    of its file under /proc; None when the driver does not say."""
    try:
        text = (root / f"gpu{gpu_minor}" / "mig" / path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def mig_profile(attrs: Any, gpu_mib: int) -> str:
    """NVIDIA's name of a MIG device's profile from its attributes and its GPU's memory:
    ``1g.10gb``; with a compute instance smaller than its GPU instance, ``1c.2g.20gb``.

    The GB are not the instance's own memory rounded (an A100 80GB's 7g has 80896 MiB,
    79 GiB): its share of the GPU's memory, rounded up to eighths, times the GPU's
    memory in whole GB rounded up."""
    share = math.ceil(int(attrs.memorySizeMB) / gpu_mib * 8) / 8
    gb = round(share * -(-gpu_mib // 1024))
    g, c = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
    return f"{g}g.{gb}gb" if c == g else f"{c}c.{g}g.{gb}gb"


def _instances(h: Any, parent: Gpu, minor: int) -> list[DeviceInfo]:
    """The MIG devices of a GPU in MIG mode."""
    out = []
    for i in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except pynvml.NVMLError_NotFound:
            continue
        profile = mig_profile(pynvml.nvmlDeviceGetAttributes(m), parent.memory)
        gi = int(pynvml.nvmlDeviceGetGpuInstanceId(m))
        ci = int(pynvml.nvmlDeviceGetComputeInstanceId(m))
        caps = tuple(c for c in (cap_minor(minor, f"gi{gi}/access"),
                                 cap_minor(minor, f"gi{gi}/ci{ci}/access")) if c is not None)
        gpu = Gpu(uuid=_text(pynvml.nvmlDeviceGetUUID(m)), index=parent.index,
                  model=_text(pynvml.nvmlDeviceGetName(m)),
                  memory=int(pynvml.nvmlDeviceGetMemoryInfo(m).total // MIB),
                  numa=parent.numa, profile=profile, parent=parent.uuid)
        out.append(DeviceInfo(gpu=gpu, minor=minor, caps=caps))
    return out


def _handles(*, warn: bool = False) -> list[tuple[Any, str]]:
    """(handle, uuid) of every GPU that answers: a lost one (Xid 79, not yet off the
    bus) is skipped, not fatal, and with ``warn`` said so."""
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append((h, _text(pynvml.nvmlDeviceGetUUID(h))))
        except pynvml.NVMLError as e:
            if warn:
                log.warning("gpu_unreadable", index=i, error=str(e))
    return out


def _discover() -> tuple[DeviceInfo, ...]:
    handles = _handles(warn=True)  # a lost GPU is not offered
    bus = {}
    for h, uuid in handles:
        bus[_text(pynvml.nvmlDeviceGetPciInfo(h).busId).upper()] = uuid
    out: list[DeviceInfo] = []
    for i, (h, uuid) in enumerate(handles):
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
        if mig:
            try:
                out += _instances(h, gpu, minor)
            except pynvml.NVMLError as e:
                log.warning("mig_devices_unreadable", uuid=uuid, error=str(e))
    return tuple(out)


def _memory_used() -> dict[str, int]:
    out = {}
    for h, uuid in _handles():
        try:
            out[uuid] = int(pynvml.nvmlDeviceGetMemoryInfo(h).used // MIB)
        except pynvml.NVMLError:
            continue
    return out


def _processes() -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for h, uuid in _handles():
        rows = []
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        except pynvml.NVMLError:
            continue
        for p in procs:
            used = p.usedGpuMemory
            if used is not None:  # None: NVML cannot tell (not permitted, WDDM)
                rows.append((int(p.pid), int(used)))
        out[uuid] = rows
    return out


def _utilisation(since: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Per GPU uuid, (host PID, SM %) of each process NVML sampled since the last call
    (``since``: per uuid, the newest sample's timestamp seen, updated here)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for h, uuid in _handles():
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, since.get(uuid, 0))
        except pynvml.NVMLError_NotFound:
            out[uuid] = []  # no process sampled since: all idle
            continue
        except pynvml.NVMLError:
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
        self._uuids: list[str] = []  # the physical GPUs of the last discovery
        self._util_since: dict[str, int] = {}
        self._initialised = False

    async def discover(self) -> tuple[DeviceInfo, ...]:
        try:
            if not self._initialised:
                await anyio.to_thread.run_sync(pynvml.nvmlInit)
                self._initialised = True
            found = await anyio.to_thread.run_sync(_discover)
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML discovery failed: {e}") from None
        self._uuids = [d.gpu.uuid for d in found if not d.gpu.parent]
        return found

    def _wait_loop(self, send: ObjectSendStream[HealthEvent], cancelled: list[bool]) -> None:
        events = pynvml.nvmlEventSetCreate()
        wanted = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
                  | pynvml.nvmlEventTypeGpuRecoveryAction)
        registered: dict[int | None, str] = {}  # handle address -> uuid: a lost GPU's
        # handle no longer answers nvmlDeviceGetUUID
        try:
            last_error: dict[str, float] = {}
            last_probe = time.monotonic()
            while not cancelled[0]:
                for uuid in set(self._uuids) - set(registered.values()):  # new GPUs too
                    try:
                        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                        registered[ctypes.cast(h, ctypes.c_void_p).value] = uuid
                        mask = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
                        pynvml.nvmlDeviceRegisterEvents(h, mask, events)
                    except pynvml.NVMLError as e:
                        log.warning("health_events_unsupported", uuid=uuid, error=str(e))
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, self.wait_ms)
                except pynvml.NVMLError_Timeout:
                    data = None
                if data is not None:
                    uuid = registered.get(ctypes.cast(data.device, ctypes.c_void_p).value, "")
                    if not uuid:
                        continue
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
                        if xid == FELL_OFF_THE_BUS:
                            why += " (fell off the bus)"
                    else:
                        why = "double-bit ECC error"
                    last_error[uuid] = time.monotonic()
                    anyio.from_thread.run(send.send, HealthEvent(
                        uuid, False, why, gone=xid == FELL_OFF_THE_BUS
                        and bool(kind & pynvml.nvmlEventTypeXidCriticalError)))
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
