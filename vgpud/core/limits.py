"""What one container is told: the shim's limits file (DESIGN.md, "Shim config file").

:class:`Limits` is the file as a value; :func:`render` writes it and :func:`parse` reads
it back, its exact inverse (``parse(render(x)) == x`` for every valid ``x``; tested as a
property). :func:`limits_for` derives it from the scheduler's
:class:`~vgpud.core.model.ContainerGrant` and the node's inventory. Pure: the plugin
writes the text (``vgpud.plugin``), the shim (``csrc/src/config.c``) reads it with the
same rules: one ``key=value`` a line, ``#`` starts a comment, unknown keys are ignored,
a ``version`` line is required.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpud.core.model import ComputePolicy, ContainerGrant, NodeInventory

MIB = 1 << 20
CONFIG_VERSION = 1
MAX_DEVICES = 16  # the shim's VG_MAX_DEVICES


class GrantError(ValueError):
    """The grant names a GPU this node does not have."""


class LimitsError(ValueError):
    """A limits file (or a value to write into one) is malformed; the message says where."""


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """One GPU of the container, in CUDA ordinal order inside the container."""

    uuid: str
    memory_limit: int  # bytes; 0 = no limit
    core_limit: int  # percent of the GPU's SMs, 0-100; 0 and 100 mean no SM limit
    core_policy: ComputePolicy = ComputePolicy.FIXED
    oversubscribe: bool = False  # may spill into host memory when the GPU is full
    spill_limit: int = 0  # bytes that may spill (part of memory_limit); 0 = none


@dataclass(frozen=True, slots=True)
class Limits:
    devices: tuple[DeviceLimits, ...]
    priority: int = 0
    state_dir: str = ""  # the writable per-container state directory, inside the container
    register: str = ""  # the plugin's registration socket, inside the container
    container: str = ""  # whose limits these are (for people reading the file)
    arbiter_dir: str = ""  # the node's per-GPU priority records, inside the container

    @property
    def visible_uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)


def spill_limit(memory_limit: int, memory_scaling: float) -> int:
    """Bytes of ``memory_limit`` that may spill into host memory on a GPU shared past
    its physical size (``deviceMemoryScaling`` > 1): the part of the grant the GPU
    cannot back, ``limit × (1 − 1/scaling)``. The rest must fit in device memory."""
    if memory_scaling <= 1.0 or memory_limit == 0:
        return 0
    return memory_limit - int(memory_limit / memory_scaling)


def limits_for(grant: ContainerGrant, inventory: NodeInventory, *,
               compute_policy: ComputePolicy, priority: int, state_dir: str,
               register: str = "", arbiter_dir: str = "") -> Limits:
    """The limits of one container.

    Devices are listed in the node's GPU index order, which is the order CUDA
    enumerates them in the container (the plugin sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``);
    the shim matches each entry by UUID, so a workload's own ``CUDA_VISIBLE_DEVICES``
    order does not matter. Memory may spill only when the node oversubscribes
    (:func:`spill_limit`).
    """
    by_uuid = {g.uuid: g for g in inventory.devices}
    missing = [d.uuid for d in grant.devices if d.uuid not in by_uuid]
    if missing:
        raise GrantError(f"container {grant.name!r} was assigned GPUs this node does not have: "
                         + ", ".join(missing))
    devices = sorted(grant.devices, key=lambda d: by_uuid[d.uuid].index)
    scaling = inventory.memory_scaling
    return Limits(
        devices=tuple(DeviceLimits(uuid=d.uuid, memory_limit=d.memory * MIB,
                                   core_limit=d.cores, core_policy=compute_policy,
                                   oversubscribe=scaling > 1.0,
                                   spill_limit=spill_limit(d.memory * MIB, scaling))
                      for d in devices),
        priority=priority, state_dir=state_dir, register=register, container=grant.name,
        arbiter_dir=arbiter_dir)


def _text(key: str, value: str, *, empty: bool = True) -> str:
    if not empty and not value:
        raise LimitsError(f"{key}: must not be empty")
    # the shim accepts printable ASCII (C isprint, byte by byte) and trims the ends
    if value != value.strip(" ") or "#" in value or not all(" " <= c <= "~" for c in value):
        raise LimitsError(f"{key}: {value!r} cannot be written (spaces at the ends, '#', "
                          "or a character that is not printable ASCII)")
    return value


def render(limits: Limits) -> str:
    """The file's text. Raises :class:`LimitsError` for a value the file cannot hold."""
    if len(limits.devices) > MAX_DEVICES:
        raise LimitsError(f"{len(limits.devices)} devices: the shim takes at most {MAX_DEVICES}")
    if not -1000 <= limits.priority <= 1000:
        raise LimitsError(f"priority: {limits.priority} is outside ±1000")
    lines = [f"version={CONFIG_VERSION}"]
    if limits.container:
        lines.append(f"container={_text('container', limits.container)}")
    for i, d in enumerate(limits.devices):
        if d.memory_limit < 0:
            raise LimitsError(f"device.{i}.memory_limit: {d.memory_limit} is negative")
        if not 0 <= d.core_limit <= 100:
            raise LimitsError(f"device.{i}.core_limit: {d.core_limit} is not 0-100")
        if not 0 <= d.spill_limit <= d.memory_limit:
            raise LimitsError(f"device.{i}.spill_limit: {d.spill_limit} is not within "
                              f"0..memory_limit")
        lines += [
            f"device.{i}.uuid={_text(f'device.{i}.uuid', d.uuid, empty=False)}",
            f"device.{i}.memory_limit={d.memory_limit}",
            f"device.{i}.core_limit={d.core_limit}",
            f"device.{i}.core_policy={d.core_policy.value}",
            f"device.{i}.oversubscribe={int(d.oversubscribe)}",
            f"device.{i}.spill_limit={d.spill_limit}",
        ]
    lines.append(f"priority={limits.priority}")
    if limits.state_dir:
        lines.append(f"state_dir={_text('state_dir', limits.state_dir)}")
    if limits.register:
        lines.append(f"register={_text('register', limits.register)}")
    if limits.arbiter_dir:
        lines.append(f"arbiter_dir={_text('arbiter_dir', limits.arbiter_dir)}")
    return "\n".join(lines) + "\n"


_DEVICE_FIELDS = ("uuid", "memory_limit", "core_limit", "core_policy", "oversubscribe",
                  "spill_limit")


def _int(where: str, value: str, lo: int, hi: int) -> int:
    text = value[1:] if value.startswith("-") else value
    if not text.isdigit():
        raise LimitsError(f"{where}: {value!r} is not a whole number")
    n = int(value)
    if not lo <= n <= hi:
        raise LimitsError(f"{where}: {n} is outside {lo}..{hi}")
    return n


def parse(text: str) -> Limits:
    """Read a limits file; :class:`LimitsError` names the line of anything malformed."""
    version: int | None = None
    top: dict[str, str] = {}
    devices: dict[int, dict[str, str]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise LimitsError(f"line {n}: expected key=value")
        where = f"line {n}: {key}"
        if key == "version":
            version = _int(where, value, 0, 1_000_000)
            if version != CONFIG_VERSION:
                raise LimitsError(f"{where}: version {version} is not supported")
        elif key.startswith("device."):
            index, dot, field = key[len("device."):].partition(".")
            if not dot or not index.isdigit():
                raise LimitsError(f"{where}: bad device index")
            i = int(index)
            if i >= MAX_DEVICES:
                raise LimitsError(f"{where}: device index out of range (< {MAX_DEVICES})")
            if field in _DEVICE_FIELDS:
                devices.setdefault(i, {})[field] = value
        elif key in ("priority", "state_dir", "register", "container", "arbiter_dir"):
            top[key] = value
    if version is None:
        raise LimitsError("no version line")
    if sorted(devices) != list(range(len(devices))):
        raise LimitsError(f"devices are not numbered 0..{len(devices) - 1}")
    out = []
    for i in range(len(devices)):
        f = devices[i]
        where = f"device.{i}"
        if "uuid" not in f or "memory_limit" not in f:
            raise LimitsError(f"{where}: uuid and memory_limit are required")
        try:
            policy = ComputePolicy(f.get("core_policy", ComputePolicy.FIXED.value))
        except ValueError:
            raise LimitsError(f"{where}.core_policy: {f['core_policy']!r} is not one of "
                              f"{', '.join(p.value for p in ComputePolicy)}") from None
        over = f.get("oversubscribe", "0")
        if over not in ("0", "1"):
            raise LimitsError(f"{where}.oversubscribe: {over!r} is not 0 or 1")
        out.append(DeviceLimits(
            uuid=f["uuid"], memory_limit=_int(f"{where}.memory_limit", f["memory_limit"], 0,
                                              (1 << 64) - 1),
            core_limit=_int(f"{where}.core_limit", f.get("core_limit", "0"), 0, 100),
            core_policy=policy, oversubscribe=over == "1",
            spill_limit=_int(f"{where}.spill_limit", f.get("spill_limit", "0"), 0,
                             (1 << 64) - 1)))
    return Limits(devices=tuple(out),
                  priority=_int("priority", top.get("priority", "0"), -1000, 1000),
                  state_dir=top.get("state_dir", ""), register=top.get("register", ""),
                  container=top.get("container", ""), arbiter_dir=top.get("arbiter_dir", ""))
