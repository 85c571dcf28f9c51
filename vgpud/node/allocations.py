"""The plugin's on-disk state: one directory per allocation (a container's replica IDs
of one resource).

    <state-dir>/allocations/<key>/record.json   the resource and the IDs, and once
                                                configured the owner and the devices
                                                granted (uuid, MiB, cores)
    <state-dir>/allocations/<key>/etc/config    the shim's limits file (PreStartContainer)
    <state-dir>/allocations/<key>/state/        the container's writable state directory

``<key>`` is :func:`allocation_key` of the resource and the IDs,
so Allocate (which knows only the IDs of its resource) and PreStartContainer (which
learns the owner) name the same directory, and so does a restarted plugin. Two
resources advertise the same ID strings, so the key includes the resource's name, except
for ``nvidia.com/vgpu-number``'s, which keeps the key it had when it was the only
resource (records written then have no ``resource`` and are read as its).

``etc/`` is mounted read-only at ``/etc/vgpud`` and written only by atomic rename, so a
container never sees a partial file; a running container's files are never rewritten
unless kubelet asks again for the same IDs (a restart of that container), and then with
the same content.

The record keeps what was granted as values, so a restarted plugin knows every
container's limits without reading them back from the limits file. The store also
keeps the configured allocations in memory (:meth:`AllocationStore.configured`) for
the metrics.

Everything here is blocking file I/O: call it through ``anyio.to_thread``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vgpud.core.model import DeviceGrant
from vgpud.core.requests import PRESETS

RECORD_VERSION = 1
# The default preset's number resource: its keys are the IDs' alone (see allocation_key).
DEFAULT_RESOURCE = PRESETS["vgpu-manager"].number  # nvidia.com/vgpu-number


def allocation_key(ids: Iterable[str], resource: str = DEFAULT_RESOURCE) -> str:
    """A stable, file-name-safe name for a set of kubelet device IDs of ``resource``
    (order-insensitive).

    Two resources advertise the same ID strings, so the key of any resource but the
    default one includes the resource's name; the default resource's key is the IDs'
    alone, as it was when it was the only resource, so the allocation directories of
    running containers keep their names across the upgrade. The prefix cannot be an ID
    (it has no ``::``), so no set of the default resource hashes the same text.
    """
    canonical = "\n".join(sorted(set(ids)))
    if resource != DEFAULT_RESOURCE:
        canonical = f"resource={resource}\n{canonical}"
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class AllocationOwner:
    """The container that holds an allocation (from kubelet's PodResources)."""

    namespace: str
    pod: str
    container: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    key: str
    ids: tuple[str, ...]
    dir: Path
    owner: AllocationOwner | None
    configured: float  # time the limits file was last written, 0 if never
    devices: tuple[DeviceGrant, ...] = ()  # granted, in the limits file's (CUDA) order
    written: float = 0.0  # time the record was last written
    resource: str = DEFAULT_RESOURCE  # the kubelet resource the IDs are of
    priority: int = 0  # the container's nvidia.com/vgpu-priority (for the arbiter)
    policy: str = "fixed"  # how its SM limit is enforced: fixed, balance or none

    @property
    def etc(self) -> Path:
        return self.dir / "etc"

    @property
    def config(self) -> Path:
        return self.dir / "etc" / "config"

    @property
    def state(self) -> Path:
        return self.dir / "state"


def write_atomic(path: Path, text: str, mode: int = 0o644, *, durable: bool = True) -> None:
    """Write a file so readers see the old or the new content, never a mix; ``durable``:
    on the disk before it is renamed into place (an fsync: a fraction of a millisecond on
    an idle disk, tens under write load)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data):]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        Path(tmp).replace(path)
    except BaseException:
        try:
            Path(tmp).unlink()
        except FileNotFoundError:
            pass
        raise


class AllocationStore:
    """Allocation directories under ``<state_dir>/allocations``."""

    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir) / "allocations"
        # every record this store wrote or read, owned or not: configure finds the
        # directory Allocate prepared without reading its record back
        self._records: dict[str, Allocation] = {}

    def configured(self) -> list[Allocation]:
        """The allocations this store has configured or loaded with an owner."""
        return [a for a in self._records.values() if a.owner is not None]

    def path(self, ids: Iterable[str], resource: str = DEFAULT_RESOURCE) -> Path:
        return self.root / allocation_key(ids, resource)

    def prepare(self, ids: Iterable[str], resource: str = DEFAULT_RESOURCE) -> Allocation:
        """Create (or find) the directory of an ID set of ``resource``. Idempotent."""
        ids = tuple(sorted(set(ids)))
        d = self.path(ids, resource)
        (d / "etc").mkdir(parents=True, exist_ok=True, mode=0o755)
        state = d / "state"
        if not state.exists():
            state.mkdir(mode=0o777)
            state.chmod(0o777)  # the container's user is unknown; the dir is its own
        found = self.load(d)
        if found is not None:
            return found
        alloc = Allocation(key=d.name, ids=ids, dir=d, owner=None, configured=0.0,
                           resource=resource)
        return self._write_record(alloc)

    def owner_of(self, ids: Iterable[str], resource: str = DEFAULT_RESOURCE
                 ) -> AllocationOwner | None:
        """Who holds the ID set's directory now (None: nobody, or no directory yet): a
        different owner's configure first clears what the container before it left in its
        state directory, which a container can fill."""
        key = allocation_key(ids, resource)
        if key in self._records:  # what this store wrote or restored: no file read
            return self._records[key].owner
        found = self.load(self.root / key)
        return None if found is None else found.owner

    def configure(self, ids: Iterable[str], owner: AllocationOwner, config_text: str,
                  devices: tuple[DeviceGrant, ...], resource: str = DEFAULT_RESOURCE,
                  priority: int = 0, policy: str = "fixed") -> Allocation:
        """Write the limits file, the owner and what was granted. A new owner gets a
        fresh state directory."""
        alloc = self._records.get(allocation_key(ids, resource))
        if alloc is None:
            alloc = self.prepare(ids, resource)
        if alloc.owner is not None and alloc.owner != owner:
            # the IDs were freed and taken by another container: forget the old usage
            for child in alloc.state.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        # not durable: the file lives as long as the containers that read it, and a node
        # that loses its page cache (a crash) loses them too; kubelet allocates their
        # successors afresh. Renamed into place, a reader never sees half of it.
        write_atomic(alloc.config, config_text, durable=False)
        done = Allocation(key=alloc.key, ids=alloc.ids, dir=alloc.dir, owner=owner,
                          configured=time.time(), devices=devices, resource=resource,
                          priority=priority, policy=policy)
        return self._write_record(done)

    def _write_record(self, a: Allocation) -> Allocation:
        doc: dict[str, Any] = {"v": RECORD_VERSION, "resource": a.resource, "ids": list(a.ids),
                               "configured": a.configured, "owner": None,
                               "devices": [{"uuid": d.uuid, "memory": d.memory, "cores": d.cores}
                                           for d in a.devices], "priority": a.priority,
                               "policy": a.policy}
        if a.owner is not None:
            doc["owner"] = {"namespace": a.owner.namespace, "pod": a.owner.pod,
                            "container": a.owner.container, "uid": a.owner.uid}
        path = a.dir / "record.json"
        write_atomic(path, json.dumps(doc, sort_keys=True), durable=False)  # as the limits
        a = replace(a, written=path.stat().st_mtime)
        self._index(a)
        return a

    def _index(self, a: Allocation) -> None:
        self._records[a.key] = a

    def load(self, d: Path) -> Allocation | None:
        """One allocation directory's record; None if missing or unreadable."""
        try:
            path = d / "record.json"
            doc = json.loads(path.read_text())
            if doc.get("v") != RECORD_VERSION:
                return None
            ids = tuple(str(x) for x in doc["ids"])
            o = doc.get("owner")
            owner = None if not o else AllocationOwner(str(o["namespace"]), str(o["pod"]),
                                              str(o["container"]), str(o.get("uid", "")))
            devices = tuple(DeviceGrant(uuid=str(x["uuid"]), memory=int(x["memory"]),
                                        cores=int(x["cores"])) for x in doc.get("devices", []))
            resource = str(doc.get("resource", DEFAULT_RESOURCE))
            if allocation_key(ids, resource) != d.name:
                return None
            a = Allocation(key=d.name, ids=ids, dir=d, owner=owner,
                           configured=float(doc.get("configured", 0.0)), devices=devices,
                           written=path.stat().st_mtime, resource=resource,
                           priority=int(doc.get("priority", 0)),
                           policy=str(doc.get("policy", "fixed")))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._index(a)
        return a

    def all(self) -> list[Allocation]:
        """Every readable allocation on disk (the state a restarted plugin starts from)."""
        if not self.root.exists():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.is_dir():
                a = self.load(d)
                if a is not None:
                    out.append(a)
        return out

    def remove(self, key: str) -> None:
        d = self.root / key
        self._records.pop(key, None)
        if d.parent == self.root and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
