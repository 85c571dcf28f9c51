"""Which rows a status query asks for: filter first, then build rows for one page only.

The status page, its JSON API (``/api/v1/gpus``, ``/api/v1/pods``) and whoever reads
them take one query: ``node`` (a node's exact name), ``namespace`` (exact), ``q`` (a
case-insensitive substring of a node name, GPU uuid, GPU model or ``namespace/pod``),
``health`` (GPUs: ``healthy`` / ``unhealthy``), ``state`` (pods: ``pending`` /
``assumed`` / ``confirmed``), ``offset`` and ``limit``. :func:`parse_query` reads it
from URL parameters and says plainly what is wrong with a bad one.

At 5,000 nodes x 8 GPUs and 50,000 pods a full scan is tens of milliseconds of
Python; the caller is an event loop that also answers kube-scheduler. So
:func:`select_gpus` and :func:`select_pods` are generators that ``yield`` after every
``step`` nodes or pods and *return* the page: the shell awaits between steps, a plain
caller runs them to the end with :func:`complete`. Between steps the cluster may
change; each row is built in one step, so a row is always consistent, and the total
is what was counted (a status page's answer, not a transaction).

The nodes vgpud's DRA driver serves are not in the cluster: their rows come ready made
(:func:`vgpud.core.dra_report.dra_rows`, from the API's ResourceSlices and ResourceClaims)
and are passed as ``dra``. They match the same query, and are listed after the
device-plugin nodes' GPUs (and counted in the same totals).

Pure: values in, rows out.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vgpud.core.cluster import Cluster
from vgpud.core.ledger import Entry, Ledger, State
from vgpud.core.report import MIB, GpuRow, PodRow, gpu_rows, pod_row

DEFAULT_LIMIT = 200
MAX_LIMIT = 5000
MAX_TEXT = 256  # longer than any node, namespace or pod name (253)
STEP = 250  # nodes (x4: ledger entries) between two yields

GPU_PARAMS = frozenset({"node", "namespace", "q", "health", "offset", "limit"})
POD_PARAMS = frozenset({"node", "namespace", "q", "state", "offset", "limit"})
HEALTH = ("healthy", "unhealthy")
STATES = ("pending", "assumed", "confirmed")

T = TypeVar("T")
Steps = Generator[None, None, T]


class QueryError(ValueError):
    """A query parameter that cannot be used; ``str()`` says which and why."""


@dataclass(frozen=True, slots=True)
class Query:
    node: str = ""
    namespace: str = ""
    q: str = ""
    health: str = ""
    state: str = ""
    offset: int = 0
    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True, slots=True)
class Page:
    """One page of rows, and how many rows match the query in all."""

    items: list[Any] = field(default_factory=list)
    total: int = 0
    offset: int = 0
    limit: int = DEFAULT_LIMIT


def _int(params: Mapping[str, str], name: str, default: int, top: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise QueryError(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not 0 <= v <= top:
        raise QueryError(f"{name} must be between 0 and {top}, got {v}")
    return v


def parse_query(params: Mapping[str, str], allowed: frozenset[str] = GPU_PARAMS) -> Query:
    """A :class:`Query` from URL parameters; :class:`QueryError` names the bad one."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise QueryError(f"unknown parameter {unknown[0][:40]!r}; this endpoint takes "
                         + ", ".join(sorted(allowed)))
    text = {}
    for name in ("node", "namespace", "q", "health", "state"):
        v = params.get(name, "").strip()
        if len(v) > MAX_TEXT:
            raise QueryError(f"{name} is longer than {MAX_TEXT} characters")
        text[name] = v
    if text["health"] not in ("", *HEALTH):
        raise QueryError(f"health must be one of {', '.join(HEALTH)}, "
                         f"got {text['health'][:40]!r}")
    if text["state"] not in ("", *STATES):
        raise QueryError(f"state must be one of {', '.join(STATES)}, "
                         f"got {text['state'][:40]!r}")
    limit = _int(params, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    if limit == 0:
        raise QueryError(f"limit must be between 1 and {MAX_LIMIT}, got 0")
    return Query(node=text["node"], namespace=text["namespace"], q=text["q"],
                 health=text["health"], state=text["state"],
                 offset=_int(params, "offset", 0, 10**9), limit=limit)


def complete(steps: Steps[T]) -> T:
    """Run a stepped selection to its end (no event loop to yield to)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _chunks(items: Sequence[T], step: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), step):
        yield items[i:i + step]


def _namespace(key: str) -> str:
    return key.partition("/")[0]


def _entry_gpus(e: Entry) -> Iterable[str]:
    for c in e.placement.containers:
        for d in c.devices:
            yield d.uuid


def _gpu_row_matches(r: GpuRow, query: Query) -> bool:
    """A ready-made row (a DRA node's GPU) against ``query``, as :func:`select_gpus`
    matches the cluster's."""
    if query.node and r.node != query.node:
        return False
    if query.health and r.healthy != (query.health == "healthy"):
        return False
    if query.namespace and not any(s.namespace == query.namespace for s in r.slices):
        return False
    q = query.q.lower()
    return not q or any(q in text.lower() for text in (
        r.node, r.uuid, r.model, *(f"{s.namespace}/{s.pod}" for s in r.slices)))


def select_gpus(cluster: Cluster, ledger: Ledger, query: Query, *,
                dra: Sequence[GpuRow] = (), step: int = STEP) -> Steps[Page]:
    """The GPUs ``query`` matches, in node then index order (the DRA nodes' rows
    ``dra`` after the cluster's): the page asked for, and how many match in all. Rows
    are built only for the page's nodes."""
    q = query.q.lower()
    if query.node:
        names = [query.node] if cluster.has_node(query.node) else []
    else:
        names = sorted(cluster.node_index)
    # One pass over the ledger: per node, the GPUs holding a slice of the namespace,
    # and those holding a slice of a pod whose name matches q.
    in_ns: dict[str, set[str]] = {}
    by_q: dict[str, set[str]] = {}
    if query.namespace or query.q:
        entries = ledger.on_node(query.node) if query.node else ledger.entries()
        for batch in _chunks(entries, step * 4):
            for e in batch:
                if query.namespace and _namespace(e.key) == query.namespace:
                    in_ns.setdefault(e.placement.node, set()).update(_entry_gpus(e))
                if q and q in e.key.lower():
                    by_q.setdefault(e.placement.node, set()).update(_entry_gpus(e))
            yield
    matched: list[tuple[str, str]] = []  # (node, uuid), in order (filtered queries)
    counts: list[tuple[str, int]] = []  # (node, GPUs) (unfiltered queries)
    plain = not (query.namespace or query.q or query.health)
    empty: set[str] = set()
    for chunk in _chunks(names, step):
        for name in chunk:
            idx = cluster.node_index.get(name)
            node = cluster.nodes[idx] if idx is not None else None
            if node is None:
                continue
            devices = node.inventory.devices
            if plain:
                counts.append((name, len(devices)))
                continue
            q_node = bool(q) and q in name.lower()
            ns_here, q_here = in_ns.get(name, empty), by_q.get(name, empty)
            for g in devices:
                if query.health and g.healthy != (query.health == "healthy"):
                    continue
                if query.namespace and g.uuid not in ns_here:
                    continue
                if q and not (q_node or g.uuid in q_here or q in g.uuid.lower()
                              or q in g.model.lower()):
                    continue
                matched.append((name, g.uuid))
        yield
    end = query.offset + query.limit
    want: dict[str, tuple[int, int] | set[str]] = {}  # node -> GPU positions, or uuids
    if plain:
        total = sum(n for _, n in counts)
        pos = 0
        for name, n in counts:
            lo, hi = max(query.offset, pos), min(end, pos + n)
            if lo < hi:
                want[name] = (lo - pos, hi - pos)
            pos += n
            if pos >= end:
                break
    else:
        total = len(matched)
        for name, uuid in matched[query.offset:end]:
            got = want.setdefault(name, set())
            assert isinstance(got, set)
            got.add(uuid)
    rows: list[GpuRow] = []
    for names_here in _chunks(list(want), max(1, step // 8)):
        for name in names_here:
            these = gpu_rows(cluster, ledger, [name])
            pick = want[name]
            if isinstance(pick, tuple):
                rows += these[pick[0]:pick[1]]
            else:
                rows += [r for r in these if r.uuid in pick]
        yield
    more: list[GpuRow] = []
    for ready_made in _chunks(dra, step * 4):
        more += [r for r in ready_made if _gpu_row_matches(r, query)]
        yield
    skip = max(0, query.offset - total)
    rows += more[skip:skip + query.limit - len(rows)]
    return Page(rows, total + len(more), query.offset, query.limit)


def _pod_matches(row_key: str, node: str | None, uuids: Iterable[str], query: Query) -> bool:
    if query.namespace and _namespace(row_key) != query.namespace:
        return False
    if query.node and node != query.node:
        return False
    if query.q:
        q = query.q.lower()
        return (q in row_key.lower() or (node is not None and q in node.lower())
                or any(q in u.lower() for u in uuids))
    return True


def _order(x: Entry | PodRow) -> tuple[str, str]:
    if isinstance(x, PodRow):
        return x.namespace, x.name
    ns, _, name = x.key.partition("/")
    return ns, name


def select_pods(ledger: Ledger, pending: Sequence[PodRow], query: Query, *,
                dra: Sequence[PodRow] = (), step: int = STEP) -> Steps[Page]:
    """The pods ``query`` matches, by namespace then name: pods holding GPUs (assumed
    or confirmed, from the ledger; ``dra``: those whose claims hold a DRA node's GPUs)
    and ``pending`` ones (filter found no node for them, with the reason)."""
    # References only (no per-pod keys kept): 50,000 tuples would cost ~10 ms just to free.
    found: list[Entry | PodRow] = []
    if query.state in ("", "assumed", "confirmed"):
        want = {"assumed": State.ASSUMED, "confirmed": State.CONFIRMED}.get(query.state)
        entries = ledger.on_node(query.node) if query.node else ledger.entries()
        for chunk in _chunks(entries, step * 4):
            for e in chunk:
                if want is not None and e.state is not want:
                    continue
                if _pod_matches(e.key, e.placement.node, _entry_gpus(e), query):
                    found.append(e)
            yield
    if query.state in ("", "confirmed"):
        for held in _chunks(dra, step * 4):
            for p in held:
                if _pod_matches(f"{p.namespace}/{p.name}", p.node,
                                (g.uuid for g in p.grants), query):
                    found.append(p)
            yield
    if query.state in ("", "pending") and not query.node:
        for waiting in _chunks(pending, step * 4):
            for p in waiting:
                if _pod_matches(f"{p.namespace}/{p.name}", p.node, (), query):
                    found.append(p)
            yield
    # Sorted in runs between yields, then merged only as far as the page's end.
    runs = []
    for run in _chunks(found, step * 4):
        runs.append(sorted(run, key=_order))
        yield
    rows = []
    for i, x in enumerate(heapq.merge(*runs, key=_order)):
        if i >= query.offset + query.limit:
            break
        if i >= query.offset:
            rows.append(x if isinstance(x, PodRow) else pod_row(x))
        if i % (step * 8) == step * 8 - 1:
            yield
    return Page(rows, len(found), query.offset, query.limit)


def summary(cluster: Cluster, ledger: Ledger, pending: int, *,
            dra_gpus: Sequence[GpuRow] = (), dra_pods: int = 0) -> dict[str, int]:
    """Cluster totals for the page's header (memory in bytes, cores in percent), the
    DRA nodes' GPUs and the pods their claims are reserved for included."""
    n = cluster.slots
    live = cluster.alive[:n]
    assumed = ledger.counts()[State.ASSUMED]
    return {
        "nodes": cluster.n_nodes() + len({r.node for r in dra_gpus}),
        "gpus": int(live.sum()) + len(dra_gpus),
        "unhealthyGpus": (int((live & ~cluster.healthy[:n]).sum())
                          + sum(not r.healthy for r in dra_gpus)),
        "memoryCapacity": (int(cluster.cap_mem[:n][live].sum()) * MIB
                           + sum(r.memory_capacity for r in dra_gpus)),
        "memoryAllocated": (int(cluster.used_mem[:n][live].sum()) * MIB
                            + sum(r.memory_allocated for r in dra_gpus)),
        "coresCapacity": (int(cluster.cap_cores[:n][live].sum())
                          + sum(r.cores_capacity for r in dra_gpus)),
        "coresAllocated": (int(cluster.used_cores[:n][live].sum())
                           + sum(r.cores_allocated for r in dra_gpus)),
        "vgpusCapacity": (int(cluster.cap_split[:n][live].sum())
                          + sum(r.vgpus_capacity for r in dra_gpus)),
        "vgpusAllocated": (int(cluster.used_split[:n][live].sum())
                           + sum(r.vgpus_allocated for r in dra_gpus)),
        "pods": len(ledger) + dra_pods,
        "assumedPods": assumed,
        "pendingPods": pending,
    }
