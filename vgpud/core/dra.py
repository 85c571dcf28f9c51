"""Names vgpud's DRA driver shares between its two halves (the ResourceSlices it publishes
and the claims it prepares): the driver, the devices' capacities, the device names.

Pure values only. :func:`device_names` is the one map between a node's inventory and the
names its slices give devices; :func:`device_of` is its inverse, used by the claims a
kubelet asks to prepare (:mod:`vgpud.core.claims`). Both sides read the same function, so a
name the slices publish always resolves to the inventory entry it was published for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from vgpud.core.model import Gpu

DRIVER = "gpu.vgpud.io"  # a DNS subdomain, as resource.k8s.io requires of a driver name
CAPACITY_MEMORY = "memory"  # bytes of device memory a claim consumes
CAPACITY_CORES = "cores"  # percent of the GPU's SMs a claim consumes (0-100)
NODE_MODE_LABEL = "vgpud.io/node-mode"  # "device-plugin" (default) or "dra"
MODE_DRA = "dra"
MODE_DEVICE_PLUGIN = "device-plugin"

_NAME = re.compile(r"^gpu-(0|[1-9][0-9]*)(?:-mig-((?:0|[1-9][0-9]*)(?:-(?:0|[1-9][0-9]*))?))?$")


class DeviceNameError(ValueError):
    """A device name that names no device of the node; ``str()`` says why, worded to
    follow "node <name> " (``has no such GPU (it has gpu-0, gpu-1)``)."""


def device_name(index: int) -> str:
    """The ResourceSlice device name of the node's GPU ``index`` (``gpu-0``, ``gpu-1``)."""
    return f"gpu-{index}"


def mig_device_name(index: int, k: int | str) -> str:
    """The device name of a MIG instance of GPU ``index``: ``gpu-0-mig-3-0`` for the one
    whose GPU and compute instance ids are ``3-0``; ``gpu-0-mig-1`` for the second in uuid
    order where the ids are not known. An instance shares its GPU's index, and a DNS label
    has no room for a profile's dots."""
    return f"{device_name(index)}-mig-{k}"


def device_names(gpus: Iterable[Gpu]) -> dict[str, str]:
    """The device name of every inventory entry, by uuid: ``gpu-N`` for a GPU (one in MIG
    mode too, though only its instances are offered); ``gpu-N-mig-G-C`` for an instance of
    GPU N with GPU instance id G and compute instance id C (NVML's, which stay while the
    instance does: another instance destroyed renames none); for instances whose ids the
    source does not know, ``gpu-N-mig-K``, the K-th of them in uuid order, whatever order
    ``gpus`` come in."""
    gpus = tuple(gpus)
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for g in sorted((g for g in gpus if g.parent), key=lambda g: (g.parent, g.uuid)):
        if g.instance:
            out[g.uuid] = mig_device_name(g.index, g.instance)
            continue
        k = seen.get(g.parent, 0)
        seen[g.parent] = k + 1
        out[g.uuid] = mig_device_name(g.index, k)
    return {g.uuid: out.get(g.uuid) or device_name(g.index) for g in gpus}


def offered_names(gpus: Iterable[Gpu]) -> list[str]:
    """The names of the devices the slices offer (every entry but a GPU in MIG mode), in
    the inventory's order."""
    gpus = tuple(gpus)
    names = device_names(gpus)
    return [names[g.uuid] for g in gpus if not g.mig]


def device_of(gpus: Sequence[Gpu], name: str) -> Gpu:
    """The inventory entry (a GPU or a MIG instance) that :func:`device_names` calls
    ``name``: the inverse of the slices' naming. A GPU in MIG mode is never one (its
    instances are). Raises :class:`DeviceNameError` saying why a name names nothing here."""
    names = device_names(gpus)
    by_name = {names[g.uuid]: g for g in gpus}
    g = by_name.get(name)
    if g is not None and not g.mig:
        return g
    m = _NAME.match(name)
    if m is None:
        raise DeviceNameError(
            f"has no device {name!r}: the devices of {DRIVER} are named gpu-<index>, and "
            "gpu-<index>-mig-<gi>-<ci> for the MIG instances of a GPU in MIG mode")
    index = int(m[1])
    parent = next((p for p in gpus if not p.parent and p.index == index), None)
    prefix = f"{device_name(index)}-mig-"
    instances = sorted((n for n in names.values() if n.startswith(prefix)),
                       key=lambda n: [int(x) for x in n[len(prefix):].split("-")])
    if parent is None:
        known = ", ".join(offered_names(gpus)) or "none"
        what = "GPU" if m[2] is None else f"MIG instance: no GPU {index}"
        raise DeviceNameError(f"has no such {what} (it has {known})")
    if m[2] is None:  # gpu-N of a GPU in MIG mode
        raise DeviceNameError(
            f"has GPU {index} in MIG mode: a claim is given one of its MIG instances "
            f"({', '.join(instances) or 'none now'}), never the whole GPU")
    if not parent.mig and not instances:
        raise DeviceNameError(f"has no MIG instance {name}: GPU {index} is not in MIG mode "
                              f"(its device is {device_name(index)})")
    raise DeviceNameError(
        f"has no MIG instance {name}: GPU {index}'s instances are "
        f"{', '.join(instances) or 'none'}; the instance was removed, or the GPU's MIG "
        "layout changed, since the claim was allocated")
