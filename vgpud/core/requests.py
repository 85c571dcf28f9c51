"""From a Pod manifest (a dict as the API returns it) to a :class:`PodRequest`.

Per container, limits are read before requests. Resource names come from the
configured preset and, when compatibility is on, from other systems' presets
(HAMi, Volcano, TKE). The user-facing pod annotations of DESIGN.md are read with
HAMi's aliases. Anything malformed raises :class:`RequestError` naming the
container, the resource and what was wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

from vgpud.core.model import (
    MIG_PROFILE,
    ComputePolicy,
    ContainerRequest,
    Defaults,
    PodRequest,
    Policy,
    Preset,
    TopologyMode,
)

MAX_MEMORY_MIB = 1 << 24  # 16 TiB: more than any GPU will have for a long time
MAX_VGPUS = 64


# the pod's compute policy (fixed, balance, none); a node's annotation of the same name is
# the default for the pods on it that name none (the device plugin applies it)
COMPUTE_POLICY = "nvidia.com/vgpu-compute-policy"


class RequestError(ValueError):
    """A pod's GPU request is invalid; ``str()`` says which container and why."""


PRESETS: dict[str, Preset] = {
    "vgpu-manager": Preset("vgpu-manager", "nvidia.com/vgpu-number", "nvidia.com/vgpu-memory",
                           "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory-percentage",
                           mig="nvidia.com/mig-"),
    "hami": Preset("hami", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                   "nvidia.com/gpumem-percentage", priority="nvidia.com/priority",
                   mig="nvidia.com/mig-"),
    "volcano": Preset("volcano", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory",
                      "volcano.sh/vgpu-cores", "volcano.sh/vgpu-memory-percentage"),
    "tke": Preset("tke", "tencent.com/vcuda-core", "tencent.com/vcuda-memory", None, tke=True),
}
TKE_MEMORY_UNIT = 256  # MiB

# -- renamed presets ------------------------------------------------------------------------
# Each peer lets its names be changed: HAMi's chart keys (resourceName, resourceMem,
# resourceMemPercentage, resourceCores, resourcePriority), Volcano's and VGPU-Manager's
# domain, TKE's vendor domain (seed 004's inspur.com/vcuda-*). The settings say which
# (vgpud/config.py ``resourceNames``); :func:`renamed` makes the preset, checked here.

# Preset fields a setting may rename; the optional ones may be dropped ("").
RENAMEABLE = ("number", "memory", "cores", "memory_percent", "priority")
OPTIONAL = ("memory_percent", "priority")

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_SHORT = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class PresetError(ValueError):
    """Renamed resources that Kubernetes or the other presets do not allow; ``str()``
    says which name and why."""


def domain_problem(domain: str) -> str | None:
    """Why ``domain`` cannot be the domain of an extended resource, or None."""
    if not _DOMAIN.match(domain) or len(domain) > 253 - len("requests."):
        return (f"{domain!r} is not a DNS subdomain (lower-case letters, digits, '-' and "
                "'.', like example.com)")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"{domain!r}: the kubernetes.io domains are Kubernetes' own"
    return None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an extended resource (Kubernetes' rule: ``<domain>/<name>``
    outside the kubernetes.io domains, and ``requests.<name>`` a qualified name for
    ResourceQuota), or None."""
    domain, slash, short = name.partition("/")
    if not slash:
        return f"{name!r} has no domain: write <domain>/<name>, like example.com/vgpu"
    if (why := domain_problem(domain)) is not None:
        return f"{name!r}: {why}"
    if len(short) > 63 or not _SHORT.match(short):
        return (f"{name!r}: {short!r} is not a resource name (at most 63 letters, digits, "
                "'-', '_' or '.', beginning and ending with a letter or digit)")
    return None


def renamed(base: Preset, *, domain: str | None = None,
            names: Mapping[str, str] | None = None,
            labels: Mapping[str, str] | None = None) -> Preset:
    """``base`` under other names: ``domain`` replaces the domain of each of its resource
    names (not the MIG prefix: those resources are NVIDIA's), then ``names`` (field →
    name, fields of :data:`RENAMEABLE`) replace single names; "" drops an optional one.
    Raises :class:`PresetError` for a name Kubernetes refuses or two fields of one name;
    ``labels`` (field → the setting's key) name the fields in its message."""
    names = dict(names or {})
    label = dict(labels or {})
    unknown = sorted(set(names) - set(RENAMEABLE))
    if unknown:
        raise PresetError(f"{base.name}: no such names to rename: {', '.join(unknown)}")
    fields: dict[str, str | None] = {f: getattr(base, f) for f in RENAMEABLE}
    if domain is not None:
        if (why := domain_problem(domain)) is not None:
            raise PresetError(f"{base.name}: domain {why}")
        fields = {f: None if n is None else f"{domain}/{n.partition('/')[2]}"
                  for f, n in fields.items()}
    for f, n in names.items():
        if base.tke and f not in ("number", "memory"):
            raise PresetError(f"{base.name}: TKE's names are vcuda-core (the GPUs and their "
                              f"share) and vcuda-memory; there is no {label.get(f, f)} to "
                              "rename")
        if n == "" and f in OPTIONAL:
            fields[f] = None
            continue
        if (why := resource_name_problem(n)) is not None:
            raise PresetError(f"{base.name}.{label.get(f, f)}: {why}")
        fields[f] = n
    given = [n for n in fields.values() if n is not None]
    twice = sorted({n for n in given if given.count(n) > 1})
    if twice:
        raise PresetError(f"{base.name}: {twice[0]} names two of its resources")
    return replace(base, number=fields["number"] or base.number, memory=fields["memory"],
                   cores=fields["cores"], memory_percent=fields["memory_percent"],
                   priority=fields["priority"])


def check_presets(presets: Sequence[Preset]) -> None:
    """The enabled presets must not share a resource name (a pod naming it would be read
    by the first one only), nor use a name under a MIG prefix (it would be read as a MIG
    profile). Raises :class:`PresetError` naming the two."""
    seen: dict[str, str] = {}
    for p in presets:
        for n in p.names:
            if n in seen and seen[n] != p.name:
                raise PresetError(f"{n} is a name of both {seen[n]} and {p.name}; an enabled "
                                  "preset's names must be its own")
            seen.setdefault(n, p.name)
    for p in presets:
        if p.mig is None:
            continue
        for n, owner in seen.items():
            if n.startswith(p.mig):
                raise PresetError(f"{owner}: {n} begins with {p.mig}, {p.name}'s MIG "
                                  "profile prefix: it would be read as a MIG instance")

# (canonical annotation, aliases)
ANNOTATIONS: dict[str, tuple[str, ...]] = {
    "nvidia.com/node-scheduler-policy": ("hami.io/node-scheduler-policy",),
    "nvidia.com/device-scheduler-policy": ("hami.io/gpu-scheduler-policy",),
    "nvidia.com/include-gpu-type": ("nvidia.com/use-gputype",),
    "nvidia.com/exclude-gpu-type": ("nvidia.com/nouse-gputype",),
    "nvidia.com/include-gpu-uuid": ("nvidia.com/use-gpuuuid",),
    "nvidia.com/exclude-gpu-uuid": ("nvidia.com/nouse-gpuuuid",),
    "nvidia.com/vgpu-compute-policy": (),
    "nvidia.com/device-topology-mode": (),
    "nvidia.com/vgpu-priority": (),
}

_QUANTITY = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")
_SUFFIX = {"": Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
           "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15),
           "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
           "Ei": Fraction(2**60)}


def parse_quantity(value: object, what: str) -> int:
    """A Kubernetes quantity that must be a non-negative whole number."""
    if isinstance(value, bool):
        raise RequestError(f"{what}: expected a whole number, got {value!r}")
    if isinstance(value, int):
        n = Fraction(value)
    elif isinstance(value, str):
        m = _QUANTITY.match(value.strip())
        if not m or len(value) > 64:
            raise RequestError(f"{what}: {value!r} is not a quantity")
        sign, digits, exp, suffix = m.groups()
        n = Fraction(digits) * (Fraction(10) ** int(exp[1:]) if exp else _SUFFIX[suffix or ""])
        if sign == "-":
            n = -n
    else:
        raise RequestError(f"{what}: expected a whole number, got {type(value).__name__}")
    if n < 0:
        raise RequestError(f"{what}: {value!r} is negative")
    if n.denominator != 1:
        raise RequestError(f"{what}: {value!r} is not a whole number")
    return int(n)


def _resources(container: Mapping[str, Any], cname: str) -> dict[str, object]:
    res = container.get("resources")
    res = {} if res is None else res
    if not isinstance(res, Mapping):
        raise RequestError(f"container {cname!r}: resources must be an object")
    merged: dict[str, object] = {}
    for part in ("requests", "limits"):  # limits win: read last
        values = res.get(part)
        values = {} if values is None else values
        if not isinstance(values, Mapping):
            raise RequestError(f"container {cname!r}: resources.{part} must be an object")
        merged.update(values)
    return merged


def preset_table(defaults: Defaults) -> dict[str, Preset]:
    """:data:`PRESETS` with the presets the settings renamed (``defaults.presets``)."""
    return {**PRESETS, **{p.name: p for p in defaults.presets}}


def enabled_presets(defaults: Defaults) -> list[Preset]:
    """The configured preset first, then the compatible ones, each once, under the names
    the settings give them."""
    table = preset_table(defaults)
    names = [defaults.preset, *[p for p in defaults.compat_presets if p != defaults.preset]]
    return [table[n] for n in dict.fromkeys(names)]


def preset_of(names: Iterable[str], presets: Sequence[Preset]) -> Preset | None:
    """The first preset one of whose GPU resources (number, memory, cores, memory share)
    a container names: the system the container speaks. None: not a GPU container."""
    held = set(names)
    return next((p for p in presets if any(
        n is not None and n in held for n in (p.number, p.memory, p.cores, p.memory_percent))
        or any(p.mig_profile(n) is not None for n in held)), None)


def _container(
    container: Mapping[str, Any], presets: list[Preset], defaults: Defaults, *,
    init: bool, sidecar: bool,
) -> ContainerRequest | None:
    cname = container.get("name")
    if not isinstance(cname, str) or not cname:
        raise RequestError("a container has no name")
    res = _resources(container, cname)
    preset = preset_of(res, presets)
    if preset is None:
        return None

    def get(name: str | None) -> int | None:
        if name is None or name not in res:
            return None
        return parse_quantity(res[name], f"container {cname!r}: {name}")

    if preset.tke:
        return _tke_container(cname, preset, get(preset.number), get(preset.memory), init,
                              sidecar)
    profiles = {p: n for n in res if (p := preset.mig_profile(n)) is not None}
    if profiles:
        return _mig_container(cname, preset, profiles, res, init, sidecar)
    number = get(preset.number)
    memory = get(preset.memory) or None
    percent = get(preset.memory_percent)
    cores = get(preset.cores)
    asked_share = memory is not None or percent is not None or cores is not None
    if number is None:
        number = defaults.default_gpu_num
    if number == 0:
        if asked_share:
            raise RequestError(f"container {cname!r}: asks for GPU memory or cores "
                               f"but 0 vGPUs ({preset.number}: 0)")
        return None
    if number > MAX_VGPUS:
        raise RequestError(f"container {cname!r}: {preset.number}: {number} vGPUs is more than "
                           f"{MAX_VGPUS}")
    if memory is not None and percent is not None:
        raise RequestError(f"container {cname!r}: give either {preset.memory} or "
                           f"{preset.memory_percent}, not both")
    if memory is not None and memory > MAX_MEMORY_MIB:
        hint = ""
        given = res.get(preset.memory) if preset.memory else None
        if isinstance(given, str) and given.strip()[-2:] in ("Ki", "Mi", "Gi", "Ti"):
            hint = f"; the unit is MiB already: write {memory >> 20} for {given.strip()}"
        raise RequestError(f"container {cname!r}: {preset.memory}: {memory} MiB is absurd "
                           f"(more than {MAX_MEMORY_MIB} MiB){hint}")
    if percent is not None and not 1 <= percent <= 100:
        raise RequestError(f"container {cname!r}: {preset.memory_percent}: {percent} must be "
                           "between 1 and 100")
    if cores is not None and cores > 100:
        raise RequestError(f"container {cname!r}: {preset.cores}: {cores} is more than 100 "
                           "(cores are a percentage of one GPU)")
    if memory is None and percent is None:
        if defaults.default_mem > 0:
            memory = defaults.default_mem
        else:
            percent = 100
    return ContainerRequest(
        name=cname, number=number, memory=memory, memory_percent=percent,
        cores=defaults.default_cores if cores is None else cores, init=init, sidecar=sidecar)


def _mig_container(cname: str, preset: Preset, profiles: Mapping[str, str],
                   res: Mapping[str, object], init: bool, sidecar: bool,
                   ) -> ContainerRequest | None:
    """A container asking for whole MIG instances (``nvidia.com/mig-1g.10gb: 2``)."""
    counts = {p: parse_quantity(res[n], f"container {cname!r}: {n}") for p, n in profiles.items()}
    counts = {p: k for p, k in counts.items() if k}
    if not counts:
        return None
    if len(counts) > 1:
        raise RequestError(f"container {cname!r}: asks for MIG instances of several profiles "
                           f"({', '.join(sorted(counts))}); one profile per container")
    (profile, number), = counts.items()
    if not MIG_PROFILE.match(profile):
        raise RequestError(f"container {cname!r}: {profiles[profile]}: {profile!r} is not a "
                           "MIG profile name (like 1g.10gb)")
    mixed = [n for n in (preset.number, preset.memory, preset.cores, preset.memory_percent)
             if n is not None and res.get(n) not in (None, 0, "0")]
    if mixed:
        raise RequestError(f"container {cname!r}: asks for MIG instances "
                           f"({profiles[profile]}) and vGPUs ({', '.join(mixed)}) at once; a "
                           "MIG instance is given whole, ask for one or the other")
    if number > MAX_VGPUS:
        raise RequestError(f"container {cname!r}: {profiles[profile]}: {number} instances is "
                           f"more than {MAX_VGPUS}")
    return ContainerRequest(name=cname, number=number, memory_percent=100, cores=100,
                            init=init, sidecar=sidecar, profile=profile)


def _tke_container(cname: str, preset: Preset, core: int | None, mem: int | None, init: bool,
                   sidecar: bool) -> ContainerRequest | None:
    core_name, mem_name = preset.number, preset.memory  # tencent.com/vcuda-core, -memory
    if not core:
        if mem:
            raise RequestError(f"container {cname!r}: {mem_name} needs {core_name}")
        return None
    if core > 100 and core % 100:
        raise RequestError(f"container {cname!r}: {core_name}: {core} must be below "
                           "100 (a share of one GPU) or a multiple of 100 (whole GPUs)")
    number, cores = (1, core) if core < 100 else (core // 100, 100)
    if number > MAX_VGPUS:
        raise RequestError(f"container {cname!r}: {core_name}: {number} GPUs is more "
                           f"than {MAX_VGPUS}")
    if mem is None:
        return ContainerRequest(name=cname, number=number, memory_percent=100, cores=cores,
                                init=init, sidecar=sidecar)
    total = mem * TKE_MEMORY_UNIT
    if total > MAX_MEMORY_MIB * number:
        raise RequestError(f"container {cname!r}: {mem_name}: {mem} is absurd")
    return ContainerRequest(name=cname, number=number, memory=-(-total // number), cores=cores,
                            init=init, sidecar=sidecar)


def _annotation(annotations: Mapping[str, Any], key: str) -> str | None:
    found = [(k, annotations[k]) for k in (key, *ANNOTATIONS[key]) if k in annotations]
    values = {str(v).strip() for _, v in found}
    if len(values) > 1:
        raise RequestError(f"annotations {', '.join(k for k, _ in found)} disagree")
    for k, v in found:
        if not isinstance(v, str):
            raise RequestError(f"annotation {k}: must be a string")
        return v.strip()
    return None


def _enum(annotations: Mapping[str, Any], key: str, kind: type[Any], default: Any) -> Any:
    value = _annotation(annotations, key)
    if value is None or value == "":
        return default
    try:
        return kind(value.lower())
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise RequestError(f"annotation {key}: unknown value {value!r}; choose one of "
                           f"{choices}") from None


def _list(annotations: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = _annotation(annotations, key)
    if not value:
        return ()
    items = tuple(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    if len(items) > 256:
        raise RequestError(f"annotation {key}: more than 256 entries")
    return items


def parse_pod(pod: Mapping[str, Any], defaults: Defaults) -> PodRequest:
    """Parse a pod manifest; a pod that asks for no GPU yields no containers."""
    if not isinstance(pod, Mapping):
        raise RequestError("the pod is not an object")
    meta = pod.get("metadata")
    meta = {} if meta is None else meta
    spec = pod.get("spec")
    spec = {} if spec is None else spec
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise RequestError("the pod's metadata and spec must be objects")
    annotations = meta.get("annotations")
    annotations = {} if annotations is None else annotations
    if not isinstance(annotations, Mapping):
        raise RequestError("metadata.annotations must be an object")
    presets = enabled_presets(defaults)
    containers: list[ContainerRequest] = []
    for kind, init in (("initContainers", True), ("containers", False)):
        items = spec.get(kind)
        items = [] if items is None else items
        if not isinstance(items, list):
            raise RequestError(f"spec.{kind} must be a list")
        for c in items:
            if not isinstance(c, Mapping):
                raise RequestError(f"spec.{kind} holds something that is not a container")
            sidecar = init and c.get("restartPolicy") == "Always"
            req = _container(c, presets, defaults, init=init, sidecar=sidecar)
            if req is not None:
                containers.append(req)
    names = [c.name for c in containers]
    if len(set(names)) != len(names):
        raise RequestError("two containers share a name")
    include_types = _list(annotations, "nvidia.com/include-gpu-type")
    exclude_types = _list(annotations, "nvidia.com/exclude-gpu-type")
    include_uuids = _list(annotations, "nvidia.com/include-gpu-uuid")
    exclude_uuids = _list(annotations, "nvidia.com/exclude-gpu-uuid")
    for inc, exc, what in ((include_types, exclude_types, "type"),
                           (include_uuids, exclude_uuids, "uuid")):
        both = sorted({x.lower() for x in inc} & {x.lower() for x in exc})
        if both:
            raise RequestError(f"GPU {what} {both[0]!r} is both included and excluded")
    priority = 0
    prio_text = _annotation(annotations, "nvidia.com/vgpu-priority")
    if prio_text:
        try:
            priority = int(prio_text)
        except ValueError:
            raise RequestError(f"annotation nvidia.com/vgpu-priority: {prio_text!r} is not an "
                               "integer") from None
        if not -1000 <= priority <= 1000:
            raise RequestError("annotation nvidia.com/vgpu-priority: must be within ±1000")
    else:
        for preset in presets:
            if preset.priority is None:
                continue
            for kind in ("initContainers", "containers"):
                for c in spec.get(kind) or []:
                    res = _resources(c, str(c.get("name")))
                    if preset.priority in res:
                        # HAMi: 0 is high, 1 is low; ours: higher wins.
                        p = parse_quantity(res[preset.priority], preset.priority)
                        priority = max(priority, 1 if p == 0 else 0)
    return PodRequest(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or ""),
        uid=str(meta.get("uid") or ""),
        containers=tuple(containers),
        node_policy=_enum(annotations, "nvidia.com/node-scheduler-policy", Policy,
                          defaults.node_policy),
        device_policy=_enum(annotations, "nvidia.com/device-scheduler-policy", Policy,
                            defaults.device_policy),
        include_types=include_types,
        exclude_types=exclude_types,
        include_uuids=include_uuids,
        exclude_uuids=exclude_uuids,
        topology=_enum(annotations, "nvidia.com/device-topology-mode", TopologyMode,
                       TopologyMode.NONE),
        compute_policy=_enum(annotations, COMPUTE_POLICY, ComputePolicy,
                             defaults.compute_policy),
        priority=priority,
    )
