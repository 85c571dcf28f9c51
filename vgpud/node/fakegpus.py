"""GPUs from a file (``--fake-devices FILE``), for tests and demos.

The file is YAML or JSON ``{"devices": [...]}``; each entry has the fields of a
``vgpud.io/node-devices`` device except ``split`` (uuid, index, model, memory, numa,
links, healthy, mig) and may add ``minor`` (the /dev/nvidiaN number; default the
index) and ``used`` (MiB in use, for metrics). A MIG instance is an entry with
``profile`` and ``parent`` (a GPU of the file with ``mig: true``). The file is polled:
when a device's ``healthy`` changes, a health transition is sent, so tests can flip
health by rewriting the file; discovery reads it again, so devices added to or removed
from the file come and go as GPUs do. Reads happen in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog
import yaml
from anyio.abc import ObjectSendStream

from vgpud.core.codec import CodecError, decode_gpu
from vgpud.files import read_bounded
from vgpud.node.devices import DeviceInfo, DiscoveryError, HealthEvent

log = structlog.get_logger(__name__)
MAX_FILE = 1 << 20


class FakeDevicesError(DiscoveryError):
    """The fake-devices file is unreadable or malformed; the message says where."""


def parse_fake_devices(text: str, where: str) -> tuple[tuple[DeviceInfo, ...], dict[str, int]]:
    """The devices of a fake-devices document, and the ``used`` MiB per uuid."""
    try:
        doc: Any = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise FakeDevicesError(f"{where}: not valid YAML or JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise FakeDevicesError(f'{where}: expected {{"devices": [...]}}')
    found: list[DeviceInfo] = []
    used: dict[str, int] = {}
    for i, d in enumerate(doc["devices"]):
        at = f"{where}: devices[{i}]"
        try:
            gpu = decode_gpu(d, at, split_default=1)
        except CodecError as e:
            raise FakeDevicesError(str(e)) from None
        minor = d.get("minor", gpu.index)
        if type(minor) is not int or minor < 0:
            raise FakeDevicesError(f"{at}.minor: expected a non-negative integer")
        u = d.get("used", 0)
        if type(u) is not int or u < 0:
            raise FakeDevicesError(f"{at}.used: expected a non-negative integer (MiB)")
        found.append(DeviceInfo(gpu=gpu, minor=minor))
        used[gpu.uuid] = u
    uuids = [f.gpu.uuid for f in found]
    if len(set(uuids)) != len(uuids):
        raise FakeDevicesError(f"{where}: a uuid appears twice")
    indexes = [f.gpu.index for f in found if not f.gpu.parent]
    if len(set(indexes)) != len(indexes):
        raise FakeDevicesError(f"{where}: an index appears twice")
    parents = {f.gpu.uuid: f.gpu for f in found if not f.gpu.parent}
    for f in found:
        p = parents.get(f.gpu.parent) if f.gpu.parent else None
        if f.gpu.parent and (p is None or not p.mig or not f.gpu.profile):
            raise FakeDevicesError(f"{where}: MIG instance {f.gpu.uuid} needs a profile and a "
                                   "parent that is a GPU of this file in MIG mode")
    return tuple(found), used


def _read(path: Path) -> str:
    data = read_bounded(path, f"fake devices file {path}", limit=MAX_FILE,
                        error=FakeDevicesError)
    return data.decode("utf-8", errors="replace")


class FakeGpus:
    """A :class:`~vgpud.node.devices.GpuSource` backed by a file."""

    def __init__(self, path: str | Path, *, poll_interval: float = 0.5) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._used: dict[str, int] = {}
        self._health: dict[str, bool] = {}

    async def _load(self) -> tuple[DeviceInfo, ...]:
        text = await anyio.to_thread.run_sync(_read, self.path)
        found, used = parse_fake_devices(text, str(self.path))
        self._used = used
        return found

    async def discover(self) -> tuple[DeviceInfo, ...]:
        found = await self._load()
        self._health = {d.gpu.uuid: d.gpu.healthy for d in found}
        return found

    async def watch_health(self, send: ObjectSendStream[HealthEvent]) -> None:
        async with send:
            while True:
                await anyio.sleep(self.poll_interval)
                try:
                    found = await self._load()
                except FakeDevicesError as e:
                    log.warning("fake_devices_unreadable", error=str(e))
                    continue
                for d in found:
                    old = self._health.get(d.gpu.uuid)
                    if old is not None and old != d.gpu.healthy:
                        self._health[d.gpu.uuid] = d.gpu.healthy
                        await send.send(HealthEvent(d.gpu.uuid, d.gpu.healthy,
                                                    "set in the fake devices file"))

    async def memory_used(self) -> Mapping[str, int]:
        return dict(self._used)

    async def processes(self) -> Mapping[str, list[tuple[int, int]]]:
        return {}  # a file knows no processes: the watchdog has nothing to compare

    async def utilisation(self) -> Mapping[str, list[tuple[int, int]]]:
        return {}  # nor their use: the arbiter sees every container idle

    async def aclose(self) -> None:
        return None
