"""The status page and its JSON API, on the scheduler's ops port.

Routes (added to the *ops* app by :func:`vgpud.extender.server.make_app`, so they are
served wherever ``/metrics`` is: on ``--metrics-listen`` when it is given, never on a
verbs-only port):

* ``GET /`` — the page: the cluster's totals, pending GPU pods with the scheduler's last
  reason, and one page of GPUs (node, model, health, memory / cores / vGPUs allocated
  against capacity as bars, and each GPU's slices). Rendered here, so the first paint
  needs no script; ``/static/status.js`` then refreshes it every few seconds from the
  JSON API and does search, filters and paging without reloading.
* ``GET /api/v1/gpus`` — ``{"items": [GPU rows], "total", "offset", "limit"}``;
  parameters ``node``, ``namespace``, ``q``, ``health``, ``offset``, ``limit``.
* ``GET /api/v1/pods`` — the same for pods (holding GPUs, or pending); ``node``,
  ``namespace``, ``q``, ``state``, ``offset``, ``limit``.
* ``GET /api/v1/summary`` — cluster totals.
* ``GET /api/v1/quotas`` — ``{"items": [...]}``: each namespace's ResourceQuota limits on
  vGPU memory and cores against what its pods take as vgpud counts it
  (:mod:`vgpud.core.quota`), and the values vgpud could not read. The page shows them
  too, as of its rendering.
* ``GET /static/…`` — the page's CSS, script and icon (package data: ``static/``; the
  page's markup is ``templates/status.html``; nothing is loaded from anywhere else).

Rows come from :class:`vgpud.scheduling.views.StateViews` (the data: :mod:`vgpud.core.report`'s
rows, selected by :mod:`vgpud.core.query`, filter first, rows for the page only); this
module renders and serves them, yielding to the event loop between steps. Memory is in
bytes, cores in percent of one GPU. A bad parameter is answered ``400`` with
``{"error": "..."}``; before the caches have synced the API answers ``503`` (the ledger
is not rebuilt yet, so every GPU would look empty) and the page says so.

Who may ask, and how often, is the ops port's guard's business (:mod:`vgpud.ops`: a
bearer token with ``ops.tokenFile``, a rate per client, a cap on renders at once; the
chart adds NetworkPolicies; ``kubectl port-forward`` to look). Every value on the page is
escaped (pod names are user input) and a ``Content-Security-Policy`` of
``default-src 'self'`` forbids inline scripts and styles: the bars are CSS classes.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html import escape
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import anyio
import anyio.lowlevel
from aiohttp import web

from vgpud.core.query import GPU_PARAMS, POD_PARAMS, Page, Query, QueryError, Steps, parse_query
from vgpud.core.quota import MEMORY, QuotaRow
from vgpud.core.report import GpuRow, PodRow, Slice, to_json
from vgpud.extender.routes import Extender
from vgpud.scheduling.views import StateViews

NOT_READY = "vgpud scheduler is still syncing its caches (the ledger is not rebuilt yet)"
PENDING_ON_PAGE = 100
PAGE_SIZES = (50, 100, 200, 500)
REFRESH_SECONDS = 5  # the page's default; ``/?refresh=N`` (1–3600) changes it
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; base-uri 'none'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


# -- static files ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    version: str  # a hash of the body: the page links ``?v=…`` so caches never go stale


def _load_assets() -> dict[str, Asset]:
    types = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
    out = {}
    for f in (resources.files("vgpud.extender") / "static").iterdir():
        suffix = "." + f.name.rsplit(".", 1)[-1]
        if f.is_file() and suffix in types:
            body = f.read_bytes()
            out[f.name] = Asset(body, types[suffix], hashlib.sha256(body).hexdigest()[:12])
    return out


ASSETS = _load_assets()


def asset_url(name: str) -> str:
    return f"static/{name}?v={ASSETS[name].version}"


# -- formatting (mirrored by static/status.js) --------------------------------------------


def fmt_bytes(n: int) -> str:
    gib = n / (1 << 30)
    if gib >= 1:
        return f"{gib:.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def percent(used: int, cap: int) -> int:
    """For a bar's width class: 0–100, at least 1 when anything is used."""
    if cap <= 0:
        return 100 if used > 0 else 0
    p = int(100 * used / cap + 0.5)  # half up, as the script's Math.round
    return max(1 if used > 0 else 0, min(100, p))


def level(used: int, cap: int) -> str:
    if cap > 0 and used >= cap:
        return "full"
    if cap > 0 and used / cap >= 0.7:
        return "high"
    return "ok"


def _bar(used: int, cap: int, text: str) -> str:
    return (f'<div class="meter"><div class="bar"><span class="fill w{percent(used, cap)} '
            f'{level(used, cap)}"></span></div><span class="num">{escape(text)}</span></div>')


# -- HTML --------------------------------------------------------------------------------------


def _slice_html(s: Slice) -> str:
    state = ' <span class="tag">assumed</span>' if s.state == "assumed" else ""
    return (f'<li><span class="pod">{escape(s.namespace)}/{escape(s.pod)}</span>'
            f'<span class="ctr">{escape(s.container)}</span>'
            f'<span class="grant">{escape(fmt_bytes(s.memory))} · {s.cores} % · '
            f'prio {s.priority}</span>{state}</li>')


def gpu_row_html(r: GpuRow) -> str:
    health = ('<span class="badge ok">healthy</span>' if r.healthy
              else '<span class="badge bad">unhealthy</span>')
    if r.mig:
        health += ' <span class="badge">MIG mode</span>'
    elif r.parent:
        health += (f' <span class="badge" title="on {escape(r.parent)}">MIG '
                   f'{escape(r.profile or "shared")}</span>')
    if r.dra:
        health += ' <span class="badge" title="allocated by DRA ResourceClaims">DRA</span>'
    slices = ("<ul class=\"slices\">" + "".join(_slice_html(s) for s in r.slices) + "</ul>"
              if r.slices else '<span class="muted">free</span>')
    cls = "gpu" if r.healthy else "gpu sick"
    return (
        f'<tr class="{cls}">'
        f'<td data-label="Node" class="node">{escape(r.node)}</td>'
        f'<td data-label="GPU"><span class="idx">#{r.index}</span> '
        f'<span class="uuid" title="{escape(r.uuid)}">{escape(r.uuid)}</span></td>'
        f'<td data-label="Model">{escape(r.model)}</td>'
        f'<td data-label="Health">{health}</td>'
        f'<td data-label="Memory">{_bar(r.memory_allocated, r.memory_capacity, f"{fmt_bytes(r.memory_allocated)} / {fmt_bytes(r.memory_capacity)}")}</td>'  # noqa: E501
        f'<td data-label="Cores">{_bar(r.cores_allocated, r.cores_capacity, f"{r.cores_allocated} / {r.cores_capacity} %")}</td>'  # noqa: E501
        f'<td data-label="vGPUs">{_bar(r.vgpus_allocated, r.vgpus_capacity, f"{r.vgpus_allocated} / {r.vgpus_capacity}")}</td>'  # noqa: E501
        f'<td data-label="Slices">{slices}</td>'
        "</tr>")


def pending_row_html(p: PodRow) -> str:
    return (f'<tr><td data-label="Pod" class="pod">{escape(p.namespace)}/{escape(p.name)}</td>'
            f'<td data-label="Priority">{p.priority}</td>'
            f'<td data-label="Since">{escape(p.since or "")}</td>'
            f'<td data-label="Reason" class="reason">{escape(p.reason or "")}</td></tr>')


def quota_row_html(r: QuotaRow) -> str:
    ns = f'<td data-label="Namespace">{escape(r.namespace)}</td>'
    name = f'<td data-label="Quota">{escape(r.quota)}</td>'
    if r.error:
        return (f'<tr class="alert">{ns}{name}<td data-label="Limit" colspan="2" '
                f'class="reason">{escape(r.error)}</td></tr>')
    unit = "MiB" if r.what == MEMORY else "%"
    return (f'<tr>{ns}{name}<td data-label="Limit">{escape(r.key)}</td>'
            f'<td data-label="Used">{_bar(r.used, r.hard, f"{r.used:,} / {r.hard:,} {unit}")}'
            "</td></tr>")


def share(used: int, cap: int) -> str:
    """``used`` as a percentage of ``cap``, for people ("<1 %" rather than "0 %")."""
    if cap <= 0:
        return "–"
    p = 100 * used / cap
    return "<1 %" if 0 < p < 1 else f"{int(p + 0.5)} %"


def _tile(label: str, value: str, bar: tuple[int, int] | None = None, detail: str = "",
          cls: str = "") -> str:
    inner = f'<span class="label">{escape(label)}</span><span class="value">{escape(value)}</span>'
    if bar is not None:
        inner += (f'<div class="bar"><span class="fill w{percent(*bar)} {level(*bar)}">'
                  "</span></div>")
    if detail:
        inner += f'<span class="detail">{escape(detail)}</span>'
    return f'<div class="tile {cls}">{inner}</div>' if cls else f'<div class="tile">{inner}</div>'


def summary_html(s: dict[str, int]) -> str:
    mem = (s["memoryAllocated"], s["memoryCapacity"])
    cores = (s["coresAllocated"], s["coresCapacity"])
    vgpus = (s["vgpusAllocated"], s["vgpusCapacity"])
    return "".join((
        _tile("Nodes", f"{s['nodes']:,}"),
        _tile("GPUs", f"{s['gpus']:,}"),
        _tile("Unhealthy GPUs", f"{s['unhealthyGpus']:,}",
              cls="alert" if s["unhealthyGpus"] else ""),
        _tile("Memory allocated", share(*mem), mem,
              f"{fmt_bytes(mem[0])} of {fmt_bytes(mem[1])}"),
        _tile("Cores allocated", share(*cores), cores, f"{cores[0]:,} of {cores[1]:,} %"),
        _tile("vGPUs in use", share(*vgpus), vgpus, f"{vgpus[0]:,} of {vgpus[1]:,}"),
        _tile("Pods holding GPUs", f"{s['pods']:,}"),
        _tile("Pending GPU pods", f"{s['pendingPods']:,}",
              cls="alert" if s["pendingPods"] else ""),
    ))


def _range(page: Page, n: int) -> str:
    if page.total == 0:
        return "none"
    return f"{page.offset + 1:,}–{page.offset + n:,} of {page.total:,}"


def _page_link(query: Query, offset: int, refresh: int) -> str:
    params = {k: v for k, v in (("q", query.q), ("node", query.node),
                                ("namespace", query.namespace), ("health", query.health))
              if v}
    params["offset"] = str(offset)
    params["limit"] = str(query.limit)
    if refresh != REFRESH_SECONDS:
        params["refresh"] = str(refresh)
    return "?" + urlencode(params)


def _select(name: str, label: str, current: str, options: Iterable[tuple[str, str]]) -> str:
    opts = "".join(f'<option value="{escape(v)}"{" selected" if v == current else ""}>'
                   f"{escape(t)}</option>" for v, t in options)
    return f'<label>{escape(label)} <select name="{name}" id="{name}">{opts}</select></label>'


TEMPLATE = string.Template(
    (resources.files("vgpud.extender") / "templates" / "status.html").read_text("utf-8"))


def _pager_link(rel: str, text: str, href: str | None) -> str:
    if href is None:
        return f'<a id="{rel}" rel="{rel}" class="off">{text}</a>'
    return f'<a id="{rel}" rel="{rel}" href="{escape(href)}">{text}</a>'


def render_page(*, ready: bool, query: Query, gpus: Page | None, pending: Page | None,
                totals: dict[str, int] | None, now: str, error: str | None = None,
                refresh: int = REFRESH_SECONDS, quotas: list[QuotaRow] | None = None) -> str:
    """The whole page, complete without script. Every value is escaped here; the
    template holds only markup."""
    if not ready:
        banner = f'<p class="banner" id="banner">{escape(NOT_READY)}</p>'
    elif error:
        banner = f'<p class="banner" id="banner">{escape(error)}</p>'
    else:
        banner = '<p class="banner" id="banner" hidden></p>'
    pend_rows = "".join(pending_row_html(p) for p in pending.items) if pending else ""
    rows = "".join(gpu_row_html(r) for r in gpus.items) if gpus else ""
    prev_href = next_href = None
    if gpus is not None and gpus.offset > 0:
        prev_href = _page_link(query, max(0, gpus.offset - gpus.limit), refresh)
    if gpus is not None and gpus.offset + len(gpus.items) < gpus.total:
        next_href = _page_link(query, gpus.offset + gpus.limit, refresh)
    more_pending = ""
    if pending and pending.total > len(pending.items):
        more_pending = (f"showing {len(pending.items):,} of {pending.total:,}; "
                        "search to narrow")
    sizes = sorted({*PAGE_SIZES, query.limit})
    return TEMPLATE.substitute(
        icon=asset_url("favicon.svg"), css=asset_url("status.css"), js=asset_url("status.js"),
        refresh=refresh, offset=query.offset, now=escape(now), banner=banner,
        summary=summary_html(totals) if totals else "",
        q=escape(query.q), node=escape(query.node), namespace=escape(query.namespace),
        health=_select("health", "Health", query.health,
                       (("", "any"), ("healthy", "healthy"), ("unhealthy", "unhealthy"))),
        limit=_select("limit", "Per page", str(query.limit), ((str(n), str(n)) for n in sizes)),
        pending_total=f"{pending.total if pending else 0:,}",
        pending_empty_hidden=" hidden" if pend_rows else "",
        pending_table_hidden="" if pend_rows else " hidden",
        pending_rows=pend_rows, pending_more=escape(more_pending),
        prev=_pager_link("prev", "← previous", prev_href),
        next=_pager_link("next", "next →", next_href),
        range=_range(gpus, len(gpus.items)) if gpus else "none",
        gpus_empty="" if rows else '<p class="empty" id="gpus-empty">No GPUs match.</p>',
        gpu_rows=rows, quotas_hidden="" if quotas else " hidden",
        quota_rows="".join(quota_row_html(r) for r in quotas or ()))


# -- handlers ----------------------------------------------------------------------------------


async def drive(steps: Steps[Page]) -> Page:
    """Run a stepped selection, letting the event loop serve others between steps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await anyio.lowlevel.checkpoint()


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc, separators=(",", ":")), status=status,
                        content_type="application/json", headers=SECURITY_HEADERS)


def _page_json(page: Page) -> str:
    return json.dumps({"items": [to_json(r) for r in page.items], "total": page.total,
                       "offset": page.offset, "limit": page.limit}, separators=(",", ":"))


class StatusViews:
    """The page's and the API's handlers over one extender's state (its rows:
    :class:`~vgpud.scheduling.views.StateViews`)."""

    def __init__(self, ext: Extender, ready: Callable[[], bool]) -> None:
        self.ext = ext
        self.data = StateViews(ext.state)
        self.ready = ready

    async def quotas_api(self, request: web.Request) -> web.Response:
        if request.query:
            return _json({"error": "this endpoint takes no parameters"}, 400)
        if not self.ready():
            return _json({"error": NOT_READY}, 503)
        return _json({"items": [r.to_json() for r in self.data.quotas()]})

    async def api(self, request: web.Request, allowed: frozenset[str],
                  select: Callable[[Query], Steps[Page]]) -> web.Response:
        try:
            query = parse_query(request.query, allowed)
        except QueryError as e:
            return _json({"error": str(e)}, 400)
        if not self.ready():
            return _json({"error": NOT_READY}, 503)
        page = await drive(select(query))
        # the rows are immutable values: they turn into JSON off the event loop
        body = await anyio.to_thread.run_sync(_page_json, page)
        return web.Response(text=body, content_type="application/json",
                            headers=SECURITY_HEADERS)

    async def gpus(self, request: web.Request) -> web.Response:
        return await self.api(request, GPU_PARAMS, self.data.gpus)

    async def pods(self, request: web.Request) -> web.Response:
        return await self.api(request, POD_PARAMS, self.data.pods)

    async def summary_api(self, request: web.Request) -> web.Response:
        if request.query:
            return _json({"error": "this endpoint takes no parameters"}, 400)
        if not self.ready():
            return _json({"error": NOT_READY}, 503)
        return _json(self.data.summary())

    async def page(self, request: web.Request) -> web.Response:
        status, error, refresh = 200, None, REFRESH_SECONDS
        params = dict(request.query)
        try:
            if "refresh" in params:
                raw = params.pop("refresh")
                if not raw.isdigit() or not 1 <= int(raw) <= 3600:
                    raise QueryError(f"refresh must be 1 to 3600 seconds, got {raw[:40]!r}")
                refresh = int(raw)
            query = parse_query(params, GPU_PARAMS)
        except QueryError as e:
            status, error, query = 400, f"bad query: {e}", Query()
        gpus = pending = totals = quotas = None
        ready = self.ready()
        if ready and error is None:
            gpus = await drive(self.data.gpus(query))
            pending = await drive(self.data.pods(Query(
                namespace=query.namespace, q=query.q, state="pending",
                limit=PENDING_ON_PAGE)))
            totals = self.data.summary()
            quotas = self.data.quotas()
        html = await anyio.to_thread.run_sync(lambda: render_page(
            ready=ready, query=query, gpus=gpus, pending=pending, totals=totals,
            now=self.ext.stamp(), error=error, refresh=refresh, quotas=quotas))
        return web.Response(text=html, status=status if ready else 503,
                            content_type="text/html", charset="utf-8",
                            headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})

    async def static(self, request: web.Request) -> web.Response:
        asset = ASSETS.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound(text="no such file")
        cache = ("public, max-age=31536000, immutable"
                 if request.query.get("v") == asset.version else "no-cache")
        return web.Response(body=asset.body, content_type=asset.content_type,
                            headers={**SECURITY_HEADERS, "Cache-Control": cache})

    async def favicon(self, _: web.Request) -> web.Response:
        asset = ASSETS["favicon.svg"]
        return web.Response(body=asset.body, content_type=asset.content_type,
                            headers={"Cache-Control": "public, max-age=86400"})


def add_status_routes(app: web.Application, ext: Extender, ready: Callable[[], bool]) -> None:
    views = StatusViews(ext, ready)
    app.router.add_get("/", views.page)
    app.router.add_get("/api/v1/gpus", views.gpus)
    app.router.add_get("/api/v1/pods", views.pods)
    app.router.add_get("/api/v1/summary", views.summary_api)
    app.router.add_get("/api/v1/quotas", views.quotas_api)
    app.router.add_get("/static/{name}", views.static)
    app.router.add_get("/favicon.ico", views.favicon)
