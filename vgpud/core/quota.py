"""Namespace quota on what GPU pods really take.

A pod declares vGPU memory and cores *per vGPU*: ``vgpu-number: 2, vgpu-memory: 3000``
takes 6,000 MiB, while Kubernetes' ResourceQuota (which sums declared requests) counts
3,000; a memory share (``vgpu-memory-percentage``) or the default memory (a whole GPU)
counts 0 there. vgpud reads the same ResourceQuota objects and counts the true totals.

**Which keys.** For every enabled preset (the configured one and the compatible ones),
its memory and cores resource names, bare or with ``requests.``, in a ResourceQuota's
``spec.hard``::

    requests.nvidia.com/vgpu-memory: 9000   # MiB in all, the namespace's pods together
    nvidia.com/vgpu-memory: 9000            # the same for vgpud; kube-apiserver ignores it
    requests.nvidia.com/vgpu-cores: 200     # percent of one GPU in all (200 = two GPUs)

Each value is in the resource's own unit (MiB, or TKE's 256 MiB units for
``tencent.com/vcuda-memory``) and means the namespace's total. Every key found is a
limit of its own; several ResourceQuotas in a namespace all apply. A ResourceQuota with
``scopes`` or a ``scopeSelector`` is not read (it bounds only some pods; Kubernetes
still enforces its own part of it).

**What counts.** Every entry of the ledger whose pod is in the namespace, confirmed or
assumed: its grants' memory and cores (a share already resolved on the GPU it got),
summed over the containers that run together and the largest of its phases taken, as
Kubernetes takes a pod's effective request (:func:`placement_use`).

**The decision.** :func:`exceeds` says why adding a pod's use would break a limit, or
None. The extender asks at filter (each node: a share resolves on that node's GPUs)
and again at bind, in the same step as the ledger's assume, so two pods filtered before
either bound cannot both take the last of the quota.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpud.core.model import Defaults, Placement, PodRequest, Reason, phases
from vgpud.core.requests import (
    TKE_MEMORY_UNIT,
    RequestError,
    enabled_presets,
    parse_quantity,
)

MEMORY = "memory"
CORES = "cores"
REQUESTS = "requests."
QUOTA_CODE = "namespace-quota"


@dataclass(frozen=True, slots=True)
class Use:
    """vGPU memory (MiB) and cores (percent of one GPU) a pod or a namespace takes."""

    memory: int = 0
    cores: int = 0

    def __add__(self, other: Use) -> Use:
        return Use(self.memory + other.memory, self.cores + other.cores)

    def __sub__(self, other: Use) -> Use:
        return Use(self.memory - other.memory, self.cores - other.cores)

    def of(self, what: str) -> int:
        return self.memory if what == MEMORY else self.cores


NONE = Use()


@dataclass(frozen=True, slots=True)
class QuotaKey:
    """A ``spec.hard`` key vgpud reads: which amount it bounds, and its unit."""

    what: str  # MEMORY or CORES
    unit: int = 1  # MiB (or percent) per unit of the quantity


def quota_keys(defaults: Defaults) -> dict[str, QuotaKey]:
    """The keys vgpud reads, for the enabled presets (see the module's docstring)."""
    out: dict[str, QuotaKey] = {}
    for p in enabled_presets(defaults):
        names: list[tuple[str | None, QuotaKey]] = [
            (p.memory, QuotaKey(MEMORY, TKE_MEMORY_UNIT if p.tke else 1)),
            (p.cores, QuotaKey(CORES))]
        for name, key in names:
            if name is not None:
                out.setdefault(name, key)
                out.setdefault(REQUESTS + name, key)
    return out


@dataclass(frozen=True, slots=True)
class Limit:
    key: str  # as written in spec.hard
    what: str  # MEMORY or CORES
    hard: int  # MiB or percent, in all


@dataclass(frozen=True, slots=True)
class Quota:
    """One ResourceQuota as vgpud reads it: its limits on true use, or why it cannot
    be read (a value that is not a quantity: that key bounds nothing, and the status
    page and ``vgpud inspect quotas`` say so)."""

    namespace: str
    name: str
    limits: tuple[Limit, ...] = ()
    errors: tuple[str, ...] = ()
    scoped: bool = False  # scopes or a scopeSelector: not read

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def read_quota(obj: Mapping[str, Any], keys: Mapping[str, QuotaKey]) -> Quota:
    """A v1 ResourceQuota as vgpud reads it (never raises: bad values become errors)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    if not isinstance(spec, Mapping):
        return Quota(ns, name, errors=("spec is not an object",))
    if spec.get("scopes") or spec.get("scopeSelector"):
        return Quota(ns, name, scoped=True)
    hard = spec.get("hard") or {}
    if not isinstance(hard, Mapping):
        return Quota(ns, name, errors=("spec.hard is not an object",))
    limits, errors = [], []
    for k in sorted(str(k) for k in hard):
        qk = keys.get(k)
        if qk is None:
            continue
        try:
            n = parse_quantity(hard[k], f"ResourceQuota {ns}/{name}: spec.hard[{k}]")
        except RequestError as e:
            errors.append(f"{e} (this limit is not enforced)")
            continue
        limits.append(Limit(k, qk.what, n * qk.unit))
    return Quota(ns, name, tuple(limits), tuple(errors))


def _phase_max(totals: Iterable[Use]) -> Use:
    best = NONE
    for u in totals:
        best = Use(max(best.memory, u.memory), max(best.cores, u.cores))
    return best


def placement_totals(p: Placement) -> tuple[int, int]:
    """What a placed pod takes, (MiB, percent): its grants summed per phase, the largest
    phase. The ledger asks at every add and drop: one loop when there is one phase."""
    if not any(c.init for c in p.containers):
        memory = cores = 0
        for c in p.containers:
            for d in c.devices:
                memory += d.memory
                cores += d.cores
        return memory, cores
    u = _phase_max(
        Use(sum(d.memory for c in ph for d in c.devices),
            sum(d.cores for c in ph for d in c.devices)) for ph in phases(p.containers))
    return u.memory, u.cores


def placement_use(p: Placement) -> Use:
    """What a placed pod takes (:func:`placement_totals`)."""
    return Use(*placement_totals(p))


def request_use(req: PodRequest) -> Use | None:
    """What a pod will take wherever it goes, or None when its memory depends on the
    GPUs chosen (a memory share, a whole GPU's memory, a MIG instance): then only a
    placement (:func:`placement_use`) says."""
    if any(c.memory is None or c.profile for c in req.containers):
        return None
    return _phase_max(
        Use(sum(c.number * (c.memory or 0) for c in ph), sum(c.number * c.cores for c in ph))
        for ph in phases(req.containers))


def exceeds(quotas: Sequence[Quota], used: Use, adding: Use, namespace: str) -> Reason | None:
    """Why ``adding`` to a namespace that already takes ``used`` breaks one of its
    quotas' limits, or None. Unresolvable: no pod leaving *this node* makes room (the
    pod is tried again when the namespace's pods change)."""
    for q in quotas:
        for lim in q.limits:
            want = adding.of(lim.what)
            if want and used.of(lim.what) + want > lim.hard:
                unit = "MiB" if lim.what == MEMORY else "% of a GPU"
                return Reason(QUOTA_CODE, (
                    f"namespace {namespace} quota {q.name}: {lim.key} is {lim.hard} {unit} "
                    f"of vGPU {lim.what} in all; its pods take {used.of(lim.what)} and this "
                    f"pod would take {want} more (counted per vGPU, as vgpud grants it)"),
                    False)
    return None


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One limit against the namespace's use, for the status page and ``inspect``."""

    namespace: str
    quota: str
    key: str
    what: str
    hard: int
    used: int
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """camelCase, like the other rows; ``hard`` and ``used`` in ``unit``."""
        out: dict[str, Any] = {"namespace": self.namespace, "quota": self.quota}
        if self.error:
            return {**out, "error": self.error}
        return {**out, "key": self.key, "resource": self.what,
                "unit": "MiB" if self.what == MEMORY else "percent", "hard": self.hard,
                "used": self.used}


def quota_rows(quotas: Iterable[Quota], use_of: Mapping[str, Use]) -> list[QuotaRow]:
    """Every limit vgpud enforces (and every value it could not read), by namespace."""
    rows = []
    for q in sorted(quotas, key=lambda q: (q.namespace, q.name)):
        used = use_of.get(q.namespace, NONE)
        rows += [QuotaRow(q.namespace, q.name, lim.key, lim.what, lim.hard,
                          used.of(lim.what)) for lim in q.limits]
        rows += [QuotaRow(q.namespace, q.name, "", "", 0, 0, error=e) for e in q.errors]
    return rows
