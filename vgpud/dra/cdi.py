"""The CDI spec of one prepared claim: the node's container edits in CDI's words.

kubelet hands the container runtime the CDI device IDs the plugin's
``NodePrepareResources`` answered; the runtime (containerd, CRI-O) finds them in the CDI
specs on the node (``/var/run/cdi``, ``/etc/cdi``) and applies their ``containerEdits``.
Each prepared claim has its own spec file (a *transient* spec, named after the claim's
uid) of kind :data:`KIND`, with one CDI device per GPU of the claim,
``gpu.vgpud.io/claim=<claim uid>-gpu-<index>``. Each carries what the device plugin puts
into its ``ContainerAllocateResponse`` (:mod:`vgpud.node.edits`): that GPU's device
node and the control devices, ``CUDA_DEVICE_ORDER``, the shim and ``/etc/ld.so.preload``,
the read-only limits directory (with the registration socket), the writable state
directory and the read-only priority records. A container given several devices of a
claim gets the claim-wide mounts once per device: CDI applies an edit of an existing
container path or device path by replacing it, so they do not pile up.

:func:`spec` is pure; :func:`write` and :func:`remove` do the file I/O (call them through
``anyio.to_thread``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vgpud.core.dra import DRIVER
from vgpud.node.allocations import write_atomic
from vgpud.node.edits import ContainerEdits

CDI_VERSION = "0.6.0"  # env, deviceNodes, mounts: every runtime with CDI reads it
VENDOR = DRIVER  # the CDI vendor is the driver's name
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"


def device_id(name: str) -> str:
    """The fully qualified CDI device ID of device ``name`` of :data:`KIND`."""
    return f"{KIND}={name}"


def spec_path(directory: Path, claim_uid: str) -> Path:
    """The claim's transient spec file: ``<vendor>-<class>_<uid>.json`` (the name the CDI
    library's ``GenerateTransientSpecName`` gives)."""
    return directory / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def container_edits(e: ContainerEdits) -> dict[str, Any]:
    """One device's ``containerEdits``."""
    out: dict[str, Any] = {}
    if e.env:
        out["env"] = [f"{k}={v}" for k, v in e.env]
    if e.devices:
        out["deviceNodes"] = [{"path": d.container_path, "hostPath": d.host_path,
                               "permissions": d.permissions} for d in e.devices]
    if e.mounts:
        out["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                          "options": ["ro" if m.read_only else "rw", "nosuid", "nodev",
                                      "rbind"]} for m in e.mounts]
    return out


def spec(devices: Mapping[str, ContainerEdits]) -> dict[str, Any]:
    """The spec of one claim: a CDI device per entry of ``devices`` (by name)."""
    return {"cdiVersion": CDI_VERSION, "kind": KIND,
            "devices": [{"name": name, "containerEdits": container_edits(e)}
                        for name, e in devices.items()]}


def write(directory: Path, claim_uid: str, devices: Mapping[str, ContainerEdits]) -> Path:
    """Write (or rewrite, with the same content) the claim's spec, atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    path = spec_path(directory, claim_uid)
    write_atomic(path, json.dumps(spec(devices), indent=1, sort_keys=True) + "\n")
    return path


def remove(directory: Path, claim_uid: str) -> None:
    spec_path(directory, claim_uid).unlink(missing_ok=True)
