"""GPUs from NVML (nvidia-ml-py). The only module that imports ``pynvml``.

Every NVML call runs in a worker thread (``anyio.to_thread``); the health watcher
blocks in ``nvmlEventSetWait_v2`` in its own thread with a short timeout so it can
be cancelled.

NVML fixes its device list at ``nvmlInit``: a GPU that joins the bus later is not
enumerated until the last ``nvmlShutdown`` (init and shutdown are reference counted)
and a new ``nvmlInit``. So each discovery after the first starts a new NVML session
(:class:`NvmlSession`): it waits for the NVML calls under way to end, stops new ones,
releases what the old session owns (the health watcher's event set), shuts NVML down,
initialises it again and lets the callers in. No handle outlives its session: every
reader looks its handles up inside its hold, and the health watcher registers its
events again in a new session.

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

import contextlib
import ctypes
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

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
T = TypeVar("T")


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
                  numa=parent.numa, profile=profile, parent=parent.uuid,
                  instance=f"{gi}-{ci}")
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


# Every list a process holding device memory can be in: compute (CUDA), graphics (Vulkan,
# OpenGL: memory no CUDA hook sees, external memory's usual source) and MPS clients. A
# process in two lists ("C+G") shows all of its memory in each: it counts once, its largest.
_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses",
                  "nvmlDeviceGetGraphicsRunningProcesses",
                  "nvmlDeviceGetMPSComputeRunningProcesses")


def _processes() -> dict[str, list[tuple[int, int]]]:
    """Per GPU uuid, (host PID, bytes) of each process NVML lists with memory there, from
    all its process lists; a GPU whose compute list cannot be read is left out."""
    out: dict[str, list[tuple[int, int]]] = {}
    for h, uuid in _handles():
        used_by: dict[int, int] = {}
        for i, name in enumerate(_PROCESS_LISTS):
            try:
                procs = getattr(pynvml, name)(h)
            except pynvml.NVMLError:
                if i == 0:
                    break  # the GPU cannot be read now
                continue  # a list this GPU or driver does not keep
            for p in procs:
                used = p.usedGpuMemory
                if used is not None:  # None: NVML cannot tell (not permitted, WDDM)
                    used_by[int(p.pid)] = max(used_by.get(int(p.pid), 0), int(used))
        else:
            out[uuid] = list(used_by.items())
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


class NvmlSession:
    """The process's one NVML initialisation, shared by every NVML caller of the node.

    NVML calls run inside :meth:`shared` (many at once, from worker threads); :meth:`renew`
    runs alone: it waits for the holds under way to end and keeps new ones out meanwhile
    (a waiting renewal goes first), releases what the session owns (:meth:`own`), calls
    ``nvmlShutdown`` and ``nvmlInit`` and bumps :attr:`generation`. A caller that keeps
    anything of NVML's (a handle, an event set) between two holds compares the generation
    and looks it up again when it changed. This process must hold no other NVML
    reference: ``nvmlShutdown`` ends the session only when the reference count reaches
    zero, and only then does the next ``nvmlInit`` read the bus again."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0
        self._owned: dict[int, Callable[[], Any]] = {}
        self._keys = 0
        self._serial = 0
        self.generation = 0  # 0: no session (before the first renew, after close)

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        """Hold the session for some NVML calls; yields its generation. No session (a
        failed re-initialisation, or closed): ``NVMLError_Uninitialized``."""
        with self._cond:
            while self._writing or self._waiting:
                self._cond.wait()
            if not self.generation:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            self._readers += 1
            generation = self.generation
        try:
            yield generation
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def own(self, release: Callable[[], Any]) -> int:
        """Call ``release`` (an NVML call) before the session ends; a key for
        :meth:`disown`. Inside a hold."""
        with self._cond:
            self._keys += 1
            self._owned[self._keys] = release
            return self._keys

    def disown(self, key: int) -> Callable[[], Any] | None:
        """Take back what :meth:`own` registered; None when its session already ended
        (and released it)."""
        with self._cond:
            return self._owned.pop(key, None)

    def _end(self) -> None:
        for release in self._owned.values():
            with contextlib.suppress(pynvml.NVMLError):
                release()
        self._owned.clear()
        self.generation = 0
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:  # nothing to end: the next nvmlInit starts afresh
            log.warning("nvml_shutdown_failed", error=str(e))

    def renew(self, then: Callable[[], T]) -> T:
        """End the running session, if any, start a new one (NVML enumerates the bus as
        it is now) and return what ``then`` returns, run in the new session before any
        other caller gets into it."""
        with self._alone():
            if self.generation:
                self._end()
            pynvml.nvmlInit()
            self._serial += 1
            self.generation = self._serial
            return then()

    def close(self) -> None:
        with self._alone():
            if self.generation:
                self._end()


class NvmlGpus:
    """A :class:`~vgpud.node.devices.GpuSource` backed by NVML."""

    def __init__(self, *, wait_ms: int = 1000, quiet: float = 120.0, recheck: float = 30.0) -> None:
        self.wait_ms = wait_ms
        self.quiet = quiet
        self.recheck = recheck
        self._uuids: list[str] = []  # the physical GPUs of the last discovery
        self._util_since: dict[str, int] = {}
        self.session = NvmlSession()

    def _discover(self) -> tuple[DeviceInfo, ...]:
        found = _discover()
        # before any other caller sees the session: the health watcher registers these
        self._uuids = [d.gpu.uuid for d in found if not d.gpu.parent]
        return found

    async def discover(self) -> tuple[DeviceInfo, ...]:
        """The first: ``nvmlInit``; later: a new NVML session, so GPUs that came since are
        found."""
        try:
            return await anyio.to_thread.run_sync(self.session.renew, self._discover)
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML discovery failed: {e}") from None

    def _held(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.session.shared():
            return fn(*args)

    def _wait_loop(self, send: ObjectSendStream[HealthEvent], cancelled: list[bool]) -> None:
        watch = _Watch(self)
        try:
            while not cancelled[0]:
                try:
                    with self.session.shared() as generation:
                        found = watch.round(generation)
                except pynvml.NVMLError as e:  # no session (NVML failed to start again)
                    if cancelled[0]:  # the watch ended first, and the session with it
                        return
                    log.warning("health_events_unavailable", error=str(e))
                    time.sleep(self.wait_ms / 1000)
                    continue
                for event in found:
                    anyio.from_thread.run(send.send, event)
        finally:
            watch.close()

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
            return await anyio.to_thread.run_sync(self._held, _memory_used)
        except pynvml.NVMLError as e:
            log.warning("memory_used_failed", error=str(e))
            return {}

    async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
        try:
            return await anyio.to_thread.run_sync(self._held, _processes)
        except pynvml.NVMLError as e:
            log.warning("processes_failed", error=str(e))
            return {}

    async def utilisation(self) -> Mapping[str, list[tuple[int, int]]]:
        try:
            return await anyio.to_thread.run_sync(self._held, _utilisation, self._util_since)
        except pynvml.NVMLError as e:
            log.warning("utilisation_failed", error=str(e))
            return {}

    async def aclose(self) -> None:
        try:
            await anyio.to_thread.run_sync(self.session.close)
        except pynvml.NVMLError:
            pass


WANTED = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
          | pynvml.nvmlEventTypeGpuRecoveryAction)


class _Watch:
    """The health watcher's state: its event set and registrations, which belong to one
    NVML session, and the GPUs in error, which do not."""

    def __init__(self, gpus: NvmlGpus) -> None:
        self.gpus = gpus
        self.generation = 0  # the session of events and registered
        self.events: Any = None
        self.key = 0
        self.registered: dict[int | None, str] = {}  # handle address -> uuid: a lost GPU's
        # handle no longer answers nvmlDeviceGetUUID
        self.last_error: dict[str, float] = {}
        self.last_probe = time.monotonic()

    def round(self, generation: int) -> list[HealthEvent]:
        """One wait for an event, and the probes that are due; inside a hold."""
        gpus = self.gpus
        if generation != self.generation:  # a new session: the old set ended with the old
            self.events = pynvml.nvmlEventSetCreate()
            self.key = gpus.session.own(partial(pynvml.nvmlEventSetFree, self.events))
            self.generation, self.registered = generation, {}
        for uuid in set(gpus._uuids) - set(self.registered.values()):  # new GPUs too
            try:
                h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                self.registered[ctypes.cast(h, ctypes.c_void_p).value] = uuid
                mask = WANTED & int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
                pynvml.nvmlDeviceRegisterEvents(h, mask, self.events)
            except pynvml.NVMLError as e:
                log.warning("health_events_unsupported", uuid=uuid, error=str(e))
        out = []
        try:
            data = pynvml.nvmlEventSetWait_v2(self.events, gpus.wait_ms)
        except pynvml.NVMLError_Timeout:
            data = None
        if data is not None:
            event = self._event(data)
            if event is not None:
                out.append(event)
        now = time.monotonic()
        if self.last_error and now - self.last_probe >= gpus.recheck:
            self.last_probe = now
            for uuid, t in list(self.last_error.items()):
                if now - t >= gpus.quiet and _probe(uuid):
                    del self.last_error[uuid]
                    out.append(HealthEvent(uuid, True,
                                           f"no error for {gpus.quiet:g} s and probe passed"))
        return out

    def _event(self, data: Any) -> HealthEvent | None:
        uuid = self.registered.get(ctypes.cast(data.device, ctypes.c_void_p).value, "")
        if not uuid:
            return None
        kind, xid = int(data.eventType), int(data.eventData)
        if kind & pynvml.nvmlEventTypeGpuRecoveryAction:
            if xid == pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
                if uuid in self.last_error and _probe(uuid):
                    del self.last_error[uuid]
                    return HealthEvent(uuid, True, "the driver reports no recovery action needed")
                return None
            why = f"the driver asks for recovery action {xid}"
        elif kind & pynvml.nvmlEventTypeXidCriticalError:
            if xid in APPLICATION_XIDS:
                return None
            why = f"Xid {xid}"
            if xid == FELL_OFF_THE_BUS:
                why += " (fell off the bus)"
        else:
            why = "double-bit ECC error"
        self.last_error[uuid] = time.monotonic()
        return HealthEvent(uuid, False, why, gone=xid == FELL_OFF_THE_BUS
                           and bool(kind & pynvml.nvmlEventTypeXidCriticalError))

    def close(self) -> None:
        """Free the event set unless its session already ended (and freed it)."""
        if not self.key:
            return
        with contextlib.suppress(pynvml.NVMLError), self.gpus.session.shared():
            release = self.gpus.session.disown(self.key)  # None: freed with its session
            if release is not None:
                release()
