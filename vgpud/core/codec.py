"""Encode and decode the two versioned JSON annotations of DESIGN.md.

``vgpud.io/node-devices`` (the plugin's inventory of a node) and
``vgpud.io/assignment`` (the scheduler's placement of a pod). Decoders accept
``str``/``bytes`` or an already-parsed object, ignore unknown fields, reject
unknown versions, and raise only :class:`CodecError` with a message that names the
field that was wrong.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

from vgpud.core.model import (
    MIG_PROFILE,
    ComputePolicy,
    ContainerGrant,
    DeviceGrant,
    Gpu,
    NodeInventory,
    Placement,
)

NODE_DEVICES = "vgpud.io/node-devices"
ASSIGNMENT = "vgpud.io/assignment"
VERSION = 1
MAX_TEXT = 1 << 20  # an annotation is bounded by the API server at 256 KiB anyway
# Kubernetes objects nest about 15 levels deep (a pod's managedFields, an affinity term, in
# an AdmissionReview); 100 is far above that and far below the interpreter's recursion limit,
# so nothing that walks a decoded document recursively (copy, json.dumps, logging) overflows.
MAX_DEPTH = 100


class CodecError(ValueError):
    """An annotation or a request body that cannot be decoded; the message says where and
    why."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_NESTED = (dict, list)


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests more than ``limit`` objects and arrays, walked one level at a
    time (no recursion); the scalars of a level are skipped at C speed."""
    level = [doc] if isinstance(doc, _NESTED) else []
    for _ in range(limit):
        below: list[Any] = []
        for v in level:
            items = v.values() if isinstance(v, dict) else v
            below.extend(compress(items, map(isinstance, items, repeat(_NESTED))))
        if not below:
            return False
        level = below
    return True


def load_json(raw: str | bytes, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """JSON from outside the process, decoded once at the edge: every annotation and
    every request body (the webhook's reviews, the extender's verbs) comes through here.

    Raises only :class:`CodecError`, whose message names ``what`` and says what was wrong:
    not UTF-8, not JSON (``NaN`` and ``Infinity`` are not JSON either), or nested deeper
    than ``max_depth`` (a body deep enough to exhaust the decoder's recursion included).
    """
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise CodecError(f"{what} nests objects or arrays deeper than {max_depth} levels "
                         "(no Kubernetes object does)") from None
    except UnicodeDecodeError as e:
        raise CodecError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except ValueError as e:  # json.JSONDecodeError, and integers too long to convert
        raise CodecError(f"{what} is not valid JSON: {e}") from None
    if _deeper_than(doc, max_depth):
        raise CodecError(f"{what} nests objects or arrays deeper than {max_depth} levels "
                         "(no Kubernetes object does)")
    return doc


def _load(raw: str | bytes | object, what: str) -> dict[str, Any]:
    if isinstance(raw, bytes | bytearray):
        try:
            raw = raw.decode()
        except UnicodeDecodeError as e:
            raise CodecError(f"{what}: not UTF-8 text") from e
    if isinstance(raw, str):
        if len(raw) > MAX_TEXT:
            raise CodecError(f"{what}: {len(raw)} characters is too long")
        raw = load_json(raw, what)
    if not isinstance(raw, dict):
        raise CodecError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    v = raw.get("v")
    if v is None:
        raise CodecError(f"{what}: missing version field 'v'")
    if type(v) is not int or v != VERSION:
        raise CodecError(f"{what}: unsupported version {v!r} (this vgpud reads v{VERSION})")
    return raw


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise CodecError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) and kind is not bool and bool not in (
        kind if isinstance(kind, tuple) else (kind,)
    ):
        raise CodecError(f"{where}.{key}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise CodecError(f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "a list", dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _opt(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any,
         where: str) -> Any:
    if key not in obj or obj[key] is None:
        return default
    return _field(obj, key, kind, where)


def _count(obj: dict[str, Any], key: str, where: str, *, low: int = 0, default: int | None = None,
           high: int = 1 << 40) -> int:
    value = _field(obj, key, int, where) if default is None else _opt(obj, key, int, default, where)
    if not low <= value <= high:
        raise CodecError(f"{where}.{key}: {value} is out of range [{low}, {high}]")
    return int(value)


def _scaling(obj: dict[str, Any], key: str, where: str) -> float:
    value = _opt(obj, key, (int, float), 1.0, where)
    if not (math.isfinite(value) and 0 < value <= 100):
        raise CodecError(f"{where}.{key}: {value} must be a finite number in (0, 100]")
    return float(value)


# -- node-devices ---------------------------------------------------------------------------------

def encode_node_devices(inv: NodeInventory) -> str:
    doc = {
        "v": VERSION,
        "memoryScaling": inv.memory_scaling,
        "coreScaling": inv.core_scaling,
        "devices": [
            {"uuid": g.uuid, "index": g.index, "model": g.model, "memory": g.memory,
             "split": g.split, "numa": g.numa, "links": list(g.links),
             "healthy": g.healthy, "mig": g.mig,
             **({"profile": g.profile} if g.profile else {}),
             **({"parent": g.parent} if g.parent else {}),
             **({"instance": g.instance} if g.instance else {})}
            for g in inv.devices
        ],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_gpu(d: object, where: str, *, split_default: int | None = None) -> Gpu:
    """One device entry (also the fake-devices file's entries, where split is optional)."""
    if not isinstance(d, dict):
        raise CodecError(f"{where}: expected an object, got {type(d).__name__}")
    links = _opt(d, "links", list, [], where)
    if not all(isinstance(x, str) for x in links):
        raise CodecError(f"{where}.links: expected a list of GPU uuids")
    uuid = _field(d, "uuid", str, where)
    if not uuid:
        raise CodecError(f"{where}.uuid: must not be empty")
    split = (_count(d, "split", where, low=1, high=1024) if split_default is None
             else _count(d, "split", where, low=1, high=1024, default=split_default))
    return Gpu(
        uuid=sys.intern(uuid),
        index=_count(d, "index", where, high=4096),
        model=sys.intern(_opt(d, "model", str, "", where)),
        memory=_count(d, "memory", where, low=1, high=1 << 24),
        split=split,
        numa=_count(d, "numa", where, low=-1, high=1024, default=0),
        links=tuple(links),
        healthy=_opt(d, "healthy", bool, True, where),
        mig=_opt(d, "mig", bool, False, where),
        profile=_profile(_opt(d, "profile", str, "", where), f"{where}.profile"),
        parent=sys.intern(_opt(d, "parent", str, "", where)),
        instance=_instance(_opt(d, "instance", str, "", where), f"{where}.instance"),
    )


_INSTANCE = re.compile(r"^(0|[1-9][0-9]{0,3})-(0|[1-9][0-9]{0,3})$")


def _instance(ids: str, where: str) -> str:
    """A MIG instance's ``<gpu instance id>-<compute instance id>`` (``3-0``)."""
    if ids and not _INSTANCE.match(ids):
        raise CodecError(f"{where}: {ids!r} is not a MIG instance's ids (like 3-0: its GPU "
                         "instance id, then its compute instance id)")
    return sys.intern(ids)


def _profile(name: str, where: str) -> str:
    """A MIG profile name as NVIDIA writes it (``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me``)."""
    if name and not MIG_PROFILE.match(name):
        raise CodecError(f"{where}: {name!r} is not a MIG profile name (like 1g.10gb)")
    return sys.intern(name)


def decode_node_devices(raw: str | bytes | object) -> NodeInventory:
    doc = _load(raw, NODE_DEVICES)
    devices = _field(doc, "devices", list, NODE_DEVICES)
    gpus = tuple(decode_gpu(d, f"{NODE_DEVICES}.devices[{i}]") for i, d in enumerate(devices))
    if len({g.uuid for g in gpus}) != len(gpus):
        raise CodecError(f"{NODE_DEVICES}.devices: duplicate uuid")
    return NodeInventory(
        devices=gpus,
        memory_scaling=_scaling(doc, "memoryScaling", NODE_DEVICES),
        core_scaling=_scaling(doc, "coreScaling", NODE_DEVICES),
    )


# -- assignment -----------------------------------------------------------------------------------

def encode_assignment(p: Placement) -> str:
    doc: dict[str, Any] = {
        "v": VERSION,
        "node": p.node,
        "time": p.time,
        "computePolicy": p.compute_policy.value,
        "priority": p.priority,
        "containers": [
            {"name": c.name, "init": c.init,
             **({"sidecar": True} if c.sidecar else {}),
             "devices": [{"uuid": d.uuid, "memory": d.memory, "cores": d.cores}
                         for d in c.devices]}
            for c in p.containers
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An assignment annotation that does not decode; ``why`` says where and why."""

    why: str


def assignment_of(annotations: Mapping[str, str]) -> Placement | Unreadable | None:
    """A pod's ``vgpud.io/assignment``, decoded (None: the pod has none): what a pod's
    projection keeps, so the annotation is decoded once per version of the pod."""
    raw = annotations.get(ASSIGNMENT)
    if raw is None:
        return None
    try:
        return decode_assignment(raw)
    except CodecError as e:
        return Unreadable(str(e))


def decode_assignment(raw: str | bytes | object) -> Placement:
    doc = _load(raw, ASSIGNMENT)
    node = _field(doc, "node", str, ASSIGNMENT)
    if not node:
        raise CodecError(f"{ASSIGNMENT}.node: must not be empty")
    policy_name = _opt(doc, "computePolicy", str, ComputePolicy.FIXED.value, ASSIGNMENT)
    try:
        policy = ComputePolicy(policy_name)
    except ValueError:
        raise CodecError(f"{ASSIGNMENT}.computePolicy: unknown policy {policy_name!r}") from None
    containers = []
    names: set[str] = set()
    for i, c in enumerate(_field(doc, "containers", list, ASSIGNMENT)):
        where = f"{ASSIGNMENT}.containers[{i}]"
        if not isinstance(c, dict):
            raise CodecError(f"{where}: expected an object")
        name = _field(c, "name", str, where)
        if name in names:
            raise CodecError(f"{where}.name: container {name!r} appears twice")
        names.add(name)
        devices = []
        for j, d in enumerate(_field(c, "devices", list, where)):
            dw = f"{where}.devices[{j}]"
            if not isinstance(d, dict):
                raise CodecError(f"{dw}: expected an object")
            uuid = _field(d, "uuid", str, dw)
            if not uuid:
                raise CodecError(f"{dw}.uuid: must not be empty")
            devices.append(DeviceGrant(uuid=sys.intern(uuid),
                                       memory=_count(d, "memory", dw, high=1 << 30),
                                       cores=_count(d, "cores", dw, high=100 * 100)))
        if len({d.uuid for d in devices}) != len(devices):
            raise CodecError(f"{where}.devices: a container's vGPUs must be distinct GPUs")
        containers.append(ContainerGrant(name=sys.intern(name),
                                         init=_opt(c, "init", bool, False, where),
                                         devices=tuple(devices),
                                         sidecar=_opt(c, "sidecar", bool, False, where)))
    return Placement(
        node=sys.intern(node),
        containers=tuple(containers),
        compute_policy=policy,
        priority=_opt(doc, "priority", int, 0, ASSIGNMENT),
        time=sys.intern(_opt(doc, "time", str, "", ASSIGNMENT)),  # pods bound together share it
    )
