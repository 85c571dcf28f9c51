"""Admission: what the webhook changes in a new pod, and whether it lets the pod in.

Pure functions over a Pod manifest (a dict, as the API server sends it in an
``AdmissionReview``), for GPU pods only — a pod one of whose containers or init
containers names a vGPU resource of an enabled preset (:func:`is_gpu_pod`):

* :func:`mutate` returns RFC 6902 JSON-patch operations, each of which applies to
  the original pod (missing parent maps are created by the operation before):
  ``schedulerName`` set when it is empty or ``default-scheduler`` (never taken from
  another custom scheduler); the number resource added to the limits of a container
  that gives only memory/cores; GPU requests copied to limits (kubelet calls a device
  plugin only for resources in limits); ``spec.nodeName`` replaced by a required
  node affinity on that node, so the scheduler still assigns the GPUs.
* :func:`admit` is the mutating webhook's answer: :func:`mutate`'s patch, or a denial
  for a pod it cannot read (:func:`unreadable`) or whose GPU request the parser refuses.
* :func:`validate` returns a :class:`Verdict`: a pod it cannot read (spec, containers
  or resources of the wrong JSON type: whether it asks for a GPU is undecidable, so it
  is denied with the reason, never admitted as a pod without one), the request
  parser's own error (:func:`vgpud.core.requests.parse_pod` — the one definition of a
  valid request), requests and limits that differ, a privileged GPU container, and a
  request that no GPU node of the cluster could ever hold, judged by the scheduler's ``too-small``
  rule (:data:`vgpud.core.fit.PREDICATES`) over a :class:`Catalogue` of the nodes'
  GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpud.core.fit import PREDICATES, GpuState, demand, gpu_reason
from vgpud.core.model import (
    ZERO,
    ContainerRequest,
    Defaults,
    GpuUsage,
    NodeInventory,
    Preset,
)
from vgpud.core.patch import PatchOp, pointer
from vgpud.core.requests import (
    RequestError,
    enabled_presets,
    parse_pod,
    parse_quantity,
    preset_of,
)
from vgpud.core.translate import Classes, Mode, Shape, headed_to_dra, translate

DEFAULT_SCHEDULER = "default-scheduler"
NODE_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
# The rule a GPU fails whatever else runs on it, for its size alone.
SIZE = tuple(p for p in PREDICATES if p.code == "too-small")


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """The settings admission reads (``vgpud.config.Settings`` keys)."""

    defaults: Defaults = field(default_factory=Defaults)
    scheduler_name: str = "vgpu-scheduler"
    allow_privileged: bool = False
    dra_mode: Mode = "off"  # which pods become DRA claims
    dra_classes: Classes = field(default_factory=Classes)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``message`` says why a pod is denied; ``warnings`` are shown to the user either way."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The GPU nodes a cluster has, as the distinct *profiles* of their GPUs (each
    profile: the capacities of one node's GPUs, largest first) with how many nodes
    have it. Clusters have a handful of node shapes, so checking a pod against every
    profile is cheap at any node count."""

    profiles: Mapping[tuple[GpuUsage, ...], int]

    @classmethod
    def of(cls, inventories: Iterable[NodeInventory]) -> Catalogue:
        return cls(Counter(profile(inv) for inv in inventories))

    @property
    def known(self) -> bool:
        return any(self.profiles)

    def largest(self) -> tuple[int, int]:
        """(the most MiB one GPU offers, the most GPUs one node has)."""
        mem = max((g.memory for p in self.profiles for g in p), default=0)
        return mem, max((len(p) for p in self.profiles), default=0)


EMPTY = Catalogue({})


def profile(inv: NodeInventory) -> tuple[GpuUsage, ...]:
    """A node's GPUs as their capacities (MIG-mode GPUs are never placed on)."""
    caps = (inv.capacity(g) for g in inv.devices if g.offers(""))
    return tuple(sorted(caps, key=lambda c: (c.memory, c.cores, c.vgpus), reverse=True))


# -- reading a pod without trusting it ----------------------------------------------------------

def _map(value: object) -> Mapping[str, Any] | None:
    """A mapping, or an absent (null) one as empty; None for anything else."""
    if value is None:
        return {}
    return value if isinstance(value, Mapping) else None


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers"):
        items = spec.get(kind)
        if isinstance(items, list):
            for i, c in enumerate(items):
                if isinstance(c, Mapping):
                    yield kind, i, c


def _parts(c: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    res = _map(c.get("resources"))
    if res is None:
        return None
    requests, limits = _map(res.get("requests")), _map(res.get("limits"))
    if requests is None or limits is None:
        return None
    return requests, limits


def _names(preset: Preset) -> list[str]:
    return list(preset.names)


def unreadable(pod: object) -> str | None:
    """Why admission cannot tell whether ``pod`` asks for a vGPU, or None: a part on the
    way to a container's resources (spec, the container lists, a container, its
    ``resources``, their ``requests`` and ``limits``) that is not the object or list the
    Pod schema says (null counts as absent). Such a pod is denied with this reason, never
    admitted as a pod without a GPU."""
    if not isinstance(pod, Mapping):
        return "the pod is not an object"
    spec = _map(pod.get("spec"))
    if spec is None:
        return "spec must be an object"
    for kind in ("initContainers", "containers"):
        items = spec.get(kind)
        if items is None:
            continue
        if not isinstance(items, list):
            return f"spec.{kind} must be a list"
        for i, c in enumerate(items):
            where = f"spec.{kind}[{i}]"
            if not isinstance(c, Mapping):
                return f"{where} must be an object (a container)"
            name = c.get("name")
            if isinstance(name, str) and name:
                where += f" (container {name!r})"
            res = _map(c.get("resources"))
            if res is None:
                return f"{where}: resources must be an object"
            for part in ("requests", "limits"):
                if _map(res.get(part)) is None:
                    return f"{where}: resources.{part} must be an object"
    return None


def is_gpu_pod(pod: object, defaults: Defaults) -> bool:
    """Does a container or init container name a vGPU resource of an enabled preset?"""
    spec = _map(pod.get("spec")) if isinstance(pod, Mapping) else None
    if not spec:
        return False
    presets = enabled_presets(defaults)
    for _, _, c in _containers(spec):
        res = _map(c.get("resources"))
        for part in ("requests", "limits"):
            values = _map(res.get(part)) if res else None
            if values and preset_of(values, presets) is not None:
                return True
    return False


# -- mutate ---------------------------------------------------------------------------------------

def _limits_ops(kind: str, i: int, c: Mapping[str, Any], presets: Sequence[Preset],
                defaults: Defaults) -> tuple[list[PatchOp], bool]:
    """The container's patch, and whether it is a GPU container."""
    parts = _parts(c)
    if parts is None:
        return [], False  # malformed: validate says so
    requests, limits = parts
    preset = preset_of([*requests, *limits], presets)
    if preset is None:
        return [], False
    add = {n: requests[n] for n in _names(preset) if n in requests and n not in limits}
    if not preset.tke and preset.number not in requests and preset.number not in limits:
        add[preset.number] = str(defaults.default_gpu_num)
    if not add:
        return [], True
    base = ("spec", kind, i, "resources")
    if "resources" not in c or c.get("resources") is None:
        return [{"op": "add", "path": pointer(*base), "value": {"limits": add}}], True
    if c["resources"].get("limits") is None:
        return [{"op": "add", "path": pointer(*base, "limits"), "value": add}], True
    return [{"op": "add", "path": pointer(*base, "limits", n), "value": v}
            for n, v in add.items()], True


def _pin_ops(spec: Mapping[str, Any], node: str) -> list[PatchOp]:
    """Replace ``spec.nodeName`` by a required node affinity on ``node``, ANDed into
    each of the pod's own node selector terms (terms are ORed; an empty term matches
    nothing and is left so)."""
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    ops: list[PatchOp] = [{"op": "remove", "path": "/spec/nodeName"}]
    term = {"matchFields": [field]}
    path: list[object] = ["spec", "affinity"]
    cur: Any = spec
    for key, fresh in (("affinity", {"nodeAffinity": {NODE_AFFINITY: {
                           "nodeSelectorTerms": [term]}}}),
                       ("nodeAffinity", {NODE_AFFINITY: {"nodeSelectorTerms": [term]}}),
                       (NODE_AFFINITY, {"nodeSelectorTerms": [term]})):
        nxt = cur.get(key) if isinstance(cur, Mapping) else None
        if key != "affinity":
            path.append(key)
        if not isinstance(nxt, Mapping):
            return [*ops, {"op": "add", "path": pointer(*path), "value": fresh}]
        cur = nxt
    terms = cur.get("nodeSelectorTerms")
    path.append("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return [*ops, {"op": "add", "path": pointer(*path), "value": [term]}]
    for j, t in enumerate(terms):
        if not isinstance(t, Mapping) or not (t.get("matchExpressions") or t.get("matchFields")):
            continue
        fields = t.get("matchFields")
        if isinstance(fields, list):
            ops.append({"op": "add", "path": pointer(*path, j, "matchFields", "-"),
                        "value": field})
        else:
            ops.append({"op": "add", "path": pointer(*path, j, "matchFields"), "value": [field]})
    return ops


def admit(pod: object, policy: AdmissionPolicy) -> tuple[Verdict, list[PatchOp]]:
    """The mutating webhook's answer: denied, with the reason, when the pod is
    :func:`unreadable` or is a GPU pod whose request :func:`parse_pod` refuses (a patch
    computed over it would only carry the fault on); else allowed, with :func:`mutate`'s
    patch (empty for a pod that asks for no vGPU)."""
    problem = unreadable(pod)
    if problem:
        return Verdict(False, problem), []
    if is_gpu_pod(pod, policy.defaults):
        assert isinstance(pod, Mapping)
        try:
            parse_pod(pod, policy.defaults)
        except RequestError as e:
            return Verdict(False, str(e)), []
    return Verdict(True), mutate(pod, policy)


def admit_for_dra(pod: object, policy: AdmissionPolicy,
                  ) -> tuple[Verdict, list[PatchOp], tuple[Shape, ...]] | None:
    """The mutating webhook's answer for a GPU pod headed to DRA nodes
    (``policy.dra_mode``, :func:`vgpud.core.translate.headed_to_dra`): its asks as
    claims, with the ResourceClaimTemplates to make first, or a denial saying why an ask
    has no claim to become. None for any other pod (:func:`admit` answers it)."""
    if (policy.dra_mode == "off" or unreadable(pod) or not isinstance(pod, Mapping)
            or not is_gpu_pod(pod, policy.defaults) or not headed_to_dra(pod, policy.dra_mode)):
        return None
    try:
        t = translate(pod, policy.defaults, policy.dra_classes)
    except RequestError as e:
        return Verdict(False, f"vgpud: this pod is headed to DRA nodes: {e}"), [], ()
    return Verdict(True), list(t.ops), t.shapes


def mutate(pod: object, policy: AdmissionPolicy) -> list[PatchOp]:
    """The JSON patch for a new pod; empty for a pod that asks for no vGPU."""
    spec = _map(pod.get("spec")) if isinstance(pod, Mapping) else None
    if not spec:
        return []
    presets = enabled_presets(policy.defaults)
    ops: list[PatchOp] = []
    gpu = False
    for kind, i, c in _containers(spec):
        more, is_gpu = _limits_ops(kind, i, c, presets, policy.defaults)
        ops += more
        gpu |= is_gpu
    if not gpu:
        return []
    scheduler = spec.get("schedulerName")
    if scheduler in (None, "", DEFAULT_SCHEDULER):
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": policy.scheduler_name})
        scheduler = policy.scheduler_name
    node = spec.get("nodeName")
    if scheduler == policy.scheduler_name and isinstance(node, str) and node:
        ops += _pin_ops(spec, node)
    return ops


# -- validate -------------------------------------------------------------------------------------

def _share(c: ContainerRequest) -> str:
    mem = f"{c.memory} MiB" if c.memory is not None else f"{c.memory_percent}% of the memory"
    return f"{c.number} vGPU(s) of {mem} and {c.cores}% cores"


def fits_somewhere(c: ContainerRequest, catalogue: Catalogue) -> bool:
    """Could some node of the catalogue, empty, hold container ``c``?"""
    for prof in catalogue.profiles:
        big = sum(1 for cap in prof
                  if gpu_reason(GpuState.of("", cap, ZERO), demand(c, cap.memory), SIZE) is None)
        if big >= c.number:
            return True
    return False


def _equal_parts(requests: Mapping[str, Any], limits: Mapping[str, Any], cname: str,
                 preset: Preset) -> str | None:
    for n in _names(preset):
        if n in requests and n in limits:
            r = parse_quantity(requests[n], f"container {cname!r}: resources.requests[{n}]")
            lim = parse_quantity(limits[n], f"container {cname!r}: resources.limits[{n}]")
            if r != lim:
                return (f"container {cname!r}: {n}: requests ({requests[n]}) and limits "
                        f"({limits[n]}) differ; Kubernetes needs them equal for a device "
                        "resource (give limits only)")
    return None


SYS_ADMIN = frozenset({"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"})


def container_risk(spec: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """Why a container asking for a vGPU could lift its own limits, or None.

    Privileged, it sees every GPU of its node. With ``CAP_SYS_ADMIN`` it can mount over
    ``/etc/ld.so.preload`` and run without the shim. With seccomp ``Unconfined`` (its own,
    or the pod's when it sets none) it can create a user namespace and do the same mount
    there. Checked by the webhook and again by the scheduler (a pod the webhook did not
    see, or a webhook that was down under ``failurePolicy: Ignore``)."""
    cname = str(container.get("name"))
    why = "so its limits cannot hold (the cluster's allowPrivilegedGPUPods setting is off)"
    sc = _map(container.get("securityContext")) or {}
    if sc.get("privileged") is True:
        return (f"container {cname!r}: securityContext.privileged is true and it asks for a "
                f"vGPU: a privileged container sees every GPU of its node, {why}")
    caps = _map(sc.get("capabilities")) or {}
    added = caps.get("add")
    granted = sorted({str(a) for a in added} & SYS_ADMIN) if isinstance(added, list) else []
    if granted:
        return (f"container {cname!r}: securityContext.capabilities.add has {granted[0]} and "
                f"it asks for a vGPU: with it a process can mount over /etc/ld.so.preload and "
                f"run without vgpud's shim, {why}")
    own = sc.get("seccompProfile") is not None
    pod_sc = _map(spec.get("securityContext")) or {}
    profile = _map(sc.get("seccompProfile") if own else pod_sc.get("seccompProfile")) or {}
    if profile.get("type") == "Unconfined":
        where = "securityContext" if own else "the pod's securityContext"
        return (f"container {cname!r}: {where}.seccompProfile is Unconfined and it asks for a "
                f"vGPU: unconfined, a process can create a user namespace, mount over "
                f"/etc/ld.so.preload there and run without vgpud's shim (use RuntimeDefault "
                f"or a Localhost profile), {why}")
    return None


def pod_risk(pod: Mapping[str, Any], gpu_containers: Iterable[str]) -> str | None:
    """:func:`container_risk` of the first of ``gpu_containers`` (names) that has one."""
    spec = _map(pod.get("spec")) or {}
    wanted = set(gpu_containers)
    for _, _, c in _containers(spec):
        if str(c.get("name")) in wanted:
            risk = container_risk(spec, c)
            if risk:
                return risk
    return None


def validate(pod: object, policy: AdmissionPolicy, catalogue: Catalogue = EMPTY) -> Verdict:
    """Whether a new pod may be created, and if not, why, naming the container and field
    (a pod whose GPU-ness cannot be decided, :func:`unreadable`, is denied too)."""
    problem = unreadable(pod)
    if problem:
        return Verdict(False, problem)
    if not is_gpu_pod(pod, policy.defaults):
        return Verdict(True)
    assert isinstance(pod, Mapping)
    defaults = policy.defaults
    try:
        request = parse_pod(pod, defaults)
        spec = pod["spec"]
        presets = enabled_presets(defaults)
        for _, _, c in _containers(spec):
            cname = str(c.get("name"))
            parts = _parts(c)
            if parts is None:  # parse_pod has refused it already
                continue
            preset = preset_of([*parts[0], *parts[1]], presets)
            if preset is None:
                continue
            problem = _equal_parts(*parts, cname, preset)
            if problem:
                return Verdict(False, problem)
            if not policy.allow_privileged:
                risk = container_risk(spec, c)
                if risk:
                    return Verdict(False, risk)
    except RequestError as e:
        return Verdict(False, str(e))
    if catalogue.known:
        for want in request.containers:
            if not fits_somewhere(want, catalogue):
                mem, most = catalogue.largest()
                return Verdict(False, (
                    f"container {want.name!r} asks for {_share(want)}; no GPU node in this cluster "
                    f"could ever hold that (the largest GPU offers {mem} MiB, the most GPUs on "
                    f"one node is {most})"))
    warnings = []
    scheduler = spec.get("schedulerName")
    if scheduler not in (None, "", DEFAULT_SCHEDULER, policy.scheduler_name):
        warnings.append(f"spec.schedulerName is {scheduler!r}, not {policy.scheduler_name!r}: "
                        "vgpud will not assign this pod's GPUs, and its containers will fail "
                        "to start on a vgpud node")
    if spec.get("nodeName"):
        warnings.append("spec.nodeName bypasses the scheduler, so no GPUs are assigned to "
                        "this pod: its GPU containers will fail to start (the vgpud mutating "
                        "webhook turns nodeName into a node affinity)")
    return Verdict(True, warnings=tuple(warnings))
