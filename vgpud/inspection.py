"""``vgpud inspect``: the cluster's GPUs as tables, like ``kubectl get``.

Two sources, one set of rows (:mod:`vgpud.core.report`):

* the API server (default; ``--kubeconfig``, in-cluster, or ``$KUBECONFIG``): every
  node and every pod is listed and laid into a ledger of their own with the
  scheduler's own projections and rebuild (:mod:`vgpud.scheduling`), so it holds what
  the scheduler would hold after a restart; a Pending pod's reasons are worked out
  with the scheduler's own filter;
* a running scheduler (``--scheduler URL``, its ops address): its JSON API
  (``/api/v1/gpus``, ``/api/v1/pods``, ``/api/v1/quotas``), which is its own ledger,
  assumed binds and the last filter reason included.

``vgpud inspect quotas`` shows each namespace's ResourceQuota limits on vGPU memory and
cores against what its pods take as vgpud counts it (:mod:`vgpud.core.quota`).

Output: ``text`` (default), ``wide``, ``json``, ``yaml``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml

from vgpud.config import Settings
from vgpud.core.allocate import Allocator
from vgpud.core.dra_report import DraRows, dra_rows
from vgpud.core.quota import quota_keys, quota_rows, read_quota
from vgpud.core.report import gpu_rows, pending_reasons, pod_row, pod_rows, to_json
from vgpud.core.requests import RequestError, parse_pod
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import Forbidden, NotFound
from vgpud.kube.resources import (
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCEQUOTAS,
    RESOURCESLICES,
    Resource,
    object_key,
)
from vgpud.scheduling.projections import pod_projection, project_node
from vgpud.scheduling.state import SchedulerState, rebuild

MIB = 1 << 20
PAGE = 500
MAX_WAIT = 120.0  # seconds of 429s waited out before giving up


def _retry_after(value: str | None) -> float:
    """A ``Retry-After`` in seconds (its delta form), 1 when absent or not a number."""
    try:
        seconds = float(value or 1)
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), 30.0) if math.isfinite(seconds) else 1.0


class Format(enum.Enum):
    text = "text"
    wide = "wide"
    json = "json"
    yaml = "yaml"


class InspectError(RuntimeError):
    """Something the user must fix (a missing pod, an unreachable scheduler)."""


@dataclass
class View:
    """What a source answers: GPU rows and pod rows as JSON-ready dicts, and for
    ``pod`` the pod's manifest (API source only) and why it is pending."""

    gpus: list[dict[str, Any]]
    pods: list[dict[str, Any]]


# -- sources -----------------------------------------------------------------------------------

async def _list(kube: KubeClient, path: str) -> list[Json]:
    items: list[Json] = []
    token = ""
    while True:
        query = {"limit": str(PAGE), **({"continue": token} if token else {})}
        doc = await kube.request("GET", path, query=query)
        items += doc.get("items") or []
        token = str((doc.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


class ApiSource:
    """The API server, laid into a ledger here as the scheduler lays out its own: the
    same projections, the same :class:`~vgpud.scheduling.state.SchedulerState`
    (:func:`~vgpud.scheduling.state.rebuild`). What it cannot use (a malformed
    inventory or assignment, an assignment this scheduler cannot have granted) is
    collected in :attr:`warnings`."""

    def __init__(self, kube: KubeClient, settings: Settings) -> None:
        self.kube = kube
        self.alloc = Allocator(settings.defaults())
        self.project_pod = pod_projection(settings.schedulerName, self.alloc.defaults)
        self.warnings: list[str] = []
        self.dra = DraRows()  # the DRA nodes' GPUs and pods, once loaded

    def _warn(self, event: str, /, **fields: Any) -> None:
        what = f"pod {fields['pod']}" if "pod" in fields else f"node {fields.get('node')}"
        detail = fields.get("error") or (
            f"bound to {fields.get('bound')} but assigned GPUs of {fields.get('assigned')}: "
            "it holds none")
        self.warnings.append(f"{what}: {detail}")

    async def load(self) -> None:
        nodes = await _list(self.kube, NODES.collection_path())
        pods = await _list(self.kube, PODS.collection_path())
        rebuild(SchedulerState(self.alloc, warn=self._warn),
                ((object_key(n), project_node(n)) for n in nodes),
                ((object_key(p), self.project_pod(p)) for p in pods))
        slices = await self._dra_list(RESOURCESLICES, "ResourceSlices")
        claims = await self._dra_list(RESOURCECLAIMS, "ResourceClaims") if slices else []
        self.dra = dra_rows(slices, claims)
        self.warnings += self.dra.warnings

    async def _dra_list(self, resource: Resource, what: str) -> list[Json]:
        """The DRA nodes' objects; none where the API serves no ``resource.k8s.io/v1``
        (a cluster without DRA) or the caller may not list them (said in warnings)."""
        try:
            return await _list(self.kube, resource.collection_path())
        except NotFound:
            return []
        except Forbidden as e:
            self.warnings.append(f"cannot list {what}, so no DRA node is shown: {e}")
            return []

    async def quotas(self) -> list[dict[str, Any]]:
        """The ResourceQuotas' vGPU limits against the ledger :meth:`load` laid out (read
        only here: the other commands need no access to ResourceQuotas)."""
        keys = quota_keys(self.alloc.defaults)
        try:
            items = await _list(self.kube, RESOURCEQUOTAS.collection_path())
        except Forbidden as e:
            raise InspectError(f"cannot list ResourceQuotas: {e}") from None
        quotas = [q for q in (read_quota(obj, keys) for obj in items) if q.limits or q.errors]
        return [r.to_json() for r in quota_rows(quotas, self.alloc.ledger.namespaces())]

    def view(self, node: str | None = None) -> View:
        c, ledger = self.alloc.cluster, self.alloc.ledger
        nodes = None if node is None else [node]
        dra = [g for g in self.dra.gpus if node is None or g.node == node]
        gpus = sorted(gpu_rows(c, ledger, nodes) + dra, key=lambda r: r.node)
        pods = sorted(pod_rows(ledger) + self.dra.pods, key=lambda r: (r.namespace, r.name))
        return View([to_json(r) for r in gpus], [to_json(r) for r in pods])

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            p = await self.kube.request("GET", PODS.object_path(name, namespace))
        except NotFound:
            raise InspectError(f"pod {namespace}/{name} not found") from None
        meta = p.get("metadata") or {}
        spec = p.get("spec") or {}
        out: dict[str, Any] = {"namespace": namespace, "name": name,
                               "node": spec.get("nodeName"),
                               "phase": (p.get("status") or {}).get("phase")}
        try:
            req = parse_pod(p, self.alloc.defaults)
        except RequestError as e:
            out["error"] = f"invalid GPU request: {e}"
            return out
        out["priority"] = req.priority
        out["computePolicy"] = req.compute_policy.value
        out["asks"] = [{"container": c.name, "number": c.number, "memory": c.memory,
                        "memoryPercent": c.memory_percent, "cores": c.cores}
                       for c in req.containers]
        entry = self.alloc.ledger.get(str(meta.get("uid") or ""))
        if entry is not None:
            out["assignment"] = to_json(pod_row(entry))
        elif not spec.get("nodeName") and req.wants_gpu:
            out["pending"] = [{"nodes": n, "reason": msg, "resolvable": res}
                              for n, msg, res in pending_reasons(self.alloc, req)]
        return out


class SchedulerSource:
    """A running scheduler's JSON API. Its ops port limits each client's rate: a ``429``
    is waited out (``Retry-After``, at most :data:`MAX_WAIT` seconds in all)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.s = session
        self.url = url.rstrip("/")
        self.clock = clock
        self.waited = 0.0

    async def _get(self, path: str, query: str) -> Any:
        while True:
            try:
                async with self.s.get(f"{self.url}{path}?{query}") as r:
                    if r.status == 429 and self.waited < MAX_WAIT:
                        wait = _retry_after(r.headers.get("Retry-After"))
                    elif r.status != 200:
                        raise InspectError(f"{self.url}{path}: HTTP {r.status}: "
                                           f"{(await r.text())[:300]}")
                    else:
                        return await r.json()
            except aiohttp.ClientError as e:
                raise InspectError(f"cannot reach the scheduler at {self.url}: {e}") from None
            self.waited += wait
            await self.clock.sleep(wait)

    async def _all(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            q = urlencode({**params, "offset": str(len(items)), "limit": str(PAGE)})
            doc = await self._get(path, q)
            page = doc.get("items") or []
            items += page
            if not page or len(items) >= int(doc.get("total") or 0):
                return items

    async def view(self, node: str | None = None) -> View:
        params = {"node": node} if node else {}
        return View(await self._all("/api/v1/gpus", params), await self._all("/api/v1/pods", {}))

    async def quotas(self) -> list[dict[str, Any]]:
        doc = await self._get("/api/v1/quotas", "")
        return list(doc.get("items") or [])

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        rows = [p for p in await self._all("/api/v1/pods", {"namespace": namespace, "q": name})
                if p.get("name") == name and p.get("namespace") == namespace]
        if not rows:
            raise InspectError(f"the scheduler holds nothing for pod {namespace}/{name} and "
                               "has not refused it (ask the API server: drop --scheduler)")
        row = rows[0]
        out: dict[str, Any] = {"namespace": namespace, "name": name, "node": row.get("node"),
                               "priority": row.get("priority")}
        if row.get("state") == "pending":
            out["pending"] = [{"nodes": None, "reason": row.get("reason"), "resolvable": None}]
        else:
            out["assignment"] = row
        return out


# -- rendering ---------------------------------------------------------------------------------

def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def _mib(b: int) -> str:
    return f"{b // MIB}"


def nodes_table(v: View, wide: bool) -> str:
    per: dict[str, list[dict[str, Any]]] = {}
    for g in v.gpus:
        per.setdefault(g["node"], []).append(g)
    pods: dict[str, int] = {}
    for p in v.pods:
        if p.get("node"):
            pods[p["node"]] = pods.get(p["node"], 0) + 1
    head = ["NODE", "GPUS", "HEALTHY", "MEMORY MiB", "CORES %", "VGPUS", "PODS"]
    rows = [head + (["MODELS"] if wide else [])]
    for node, gs in sorted(per.items()):
        row = [node, str(len(gs)), str(sum(g["healthy"] for g in gs)),
               f"{_mib(sum(g['memoryAllocated'] for g in gs))}/"
               f"{_mib(sum(g['memoryCapacity'] for g in gs))}",
               f"{sum(g['coresAllocated'] for g in gs)}/{sum(g['coresCapacity'] for g in gs)}",
               f"{sum(g['vgpusAllocated'] for g in gs)}/{sum(g['vgpusCapacity'] for g in gs)}",
               str(pods.get(node, 0))]
        if wide:
            row.append(", ".join(sorted({g["model"] for g in gs})))
        rows.append(row)
    return _table(rows) if len(rows) > 1 else "no nodes with vgpud GPUs"


def gpus_table(v: View, wide: bool) -> str:
    head = ["NODE", "GPU", "MODEL", "HEALTH", "MEMORY MiB", "CORES %", "VGPUS", "PODS"]
    rows = [head + (["UUID", "SLICES"] if wide else [])]
    for g in v.gpus:
        row = [g["node"], str(g["index"]), g["model"], "ok" if g["healthy"] else "UNHEALTHY",
               f"{_mib(g['memoryAllocated'])}/{_mib(g['memoryCapacity'])}",
               f"{g['coresAllocated']}/{g['coresCapacity']}",
               f"{g['vgpusAllocated']}/{g['vgpusCapacity']}",
               str(len({(s["namespace"], s["pod"]) for s in g["slices"]}))]
        if wide:
            row += [g["uuid"], " ".join(
                f"{s['namespace']}/{s['pod']}/{s['container']}:{_mib(s['memory'])}MiB,"
                f"{s['cores']}%,p{s['priority']}" for s in g["slices"]) or "-"]
        rows.append(row)
    return _table(rows) if len(rows) > 1 else "no GPUs"


def pod_text(p: Mapping[str, Any]) -> str:
    lines = [f"Pod:       {p['namespace']}/{p['name']}",
             f"Node:      {p.get('node') or '(not bound)'}"]
    if p.get("phase"):
        lines.append(f"Phase:     {p['phase']}")
    if p.get("error"):
        lines.append(f"Error:     {p['error']}")
        return "\n".join(lines)
    if p.get("priority") is not None:
        lines.append(f"Priority:  {p['priority']} (nvidia.com/vgpu-priority)")
    if p.get("computePolicy"):
        lines.append(f"Compute:   {p['computePolicy']}")
    for a in p.get("asks") or []:
        mem = (f"{a['memory']} MiB" if a.get("memory") is not None
               else f"{a.get('memoryPercent') or 100} % of memory")
        lines.append(f"Asks:      {a['container']}: {a['number']} vGPU(s), {mem}, "
                     f"{a['cores']} % cores each")
    a = p.get("assignment")
    if a:
        lines.append(f"Assigned:  {a.get('state')}{' at ' + a['since'] if a.get('since') else ''}")
        rows = [["CONTAINER", "GPU", "MEMORY MiB", "CORES %"]]
        rows += [[g["container"] + (" (init)" if g.get("init") else ""), g["uuid"],
                  _mib(g["memory"]), str(g["cores"])] for g in a.get("grants") or []]
        lines += ["  " + x for x in _table(rows).splitlines()]
        lines.append("Limits:    the shim enforces each grant: memory as a hard limit, cores "
                     "as the SM share")
    pending = p.get("pending")
    if pending is not None:
        if not pending:
            lines.append("Pending:   it fits a node now; the scheduler will place it on its "
                         "next try")
        else:
            lines.append("Pending:   no node fits:")
            for x in pending:
                count = f"{x['nodes']} node(s): " if x.get("nodes") else ""
                kind = {True: " (others' pods hold the room)",
                        False: " (never, as the node is)"}.get(x.get("resolvable"), "")
                lines.append(f"  {count}{x['reason']}{kind}")
    return "\n".join(lines)


def quotas_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Each limit against the namespace's use; a value vgpud could not read, as an error."""
    out = [["NAMESPACE", "QUOTA", "LIMIT", "USED", "HARD", "UNIT"]]
    for r in rows:
        if r.get("error"):
            out.append([r["namespace"], r["quota"], f"ERROR: {r['error']}", "-", "-", "-"])
        else:
            out.append([r["namespace"], r["quota"], r["key"], str(r["used"]), str(r["hard"]),
                        r["unit"]])
    return _table(out) if len(out) > 1 else "no ResourceQuota limits vGPU memory or cores"


def render(doc: Any, fmt: Format, text: str) -> str:
    if fmt is Format.json:
        return json.dumps(doc, indent=2)
    if fmt is Format.yaml:
        return yaml.safe_dump(doc, sort_keys=False).rstrip()
    return text
