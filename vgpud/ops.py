"""What every role's ops port does the same way: who may read it, and how fast.

The ops ports serve people and Prometheus (the scheduler's status page, its JSON API and
``/metrics``; the plugin's and the webhook's ``/metrics``) on the event loop that also
serves what must not wait: filter and bind, kubelet's Allocate, admission reviews. A
:class:`Guard` is an aiohttp middleware in front of them, settings ``ops`` (vgpud/config.py):

1. ``/healthz``, ``/readyz`` and the paths given as *exempt* (the extender's verbs, when they
   share the app) pass untouched: kubelet's probes and kube-scheduler send no token.
2. A token bucket per client address (``clientQPS``, ``clientBurst``): past it, ``429`` with
   ``Retry-After``, before anything else is looked at.
3. With ``tokenFile`` set, ``Authorization: Bearer <token>`` or ``401`` saying so; a client
   on loopback needs none while ``trustLoopback`` is on (``kubectl port-forward``).
4. At most ``maxConcurrentRenders`` answers that render something (all but the static files)
   in progress. Each render yields between chunks, so a verb waits at most a chunk per
   render in progress: the cap bounds that. Up to :data:`QUEUE_PER_SLOT` times as many
   more wait for a slot, each at most :data:`QUEUE_WAIT` seconds (a page asks for three
   things at once); past that, ``429`` with ``Retry-After: 1``.

Time comes from an injected :class:`~vgpud.kube.clock.Clock`; the buckets are the API
client's (:class:`~vgpud.kube.budget.RequestBudget`).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import structlog
from aiohttp import web

from vgpud.config import ConfigError, OpsSettings
from vgpud.files import read_bounded
from vgpud.kube.budget import RequestBudget
from vgpud.kube.clock import SYSTEM_CLOCK, Clock

log = structlog.get_logger(__name__)

PROBES = frozenset({"/healthz", "/readyz"})
CHEAP_PREFIXES = ("/static/", "/favicon.ico")  # constant bytes: the bucket only
MAX_CLIENTS = 1024  # buckets kept; idle (full) ones are dropped first
MAX_TOKEN_BYTES = 4096
RELOAD_EVERY = 10.0  # seconds between looks at the token file (a rotated Secret)
QUEUE_PER_SLOT = 4  # requests that may wait for a render slot, per slot
QUEUE_WAIT = 5.0  # seconds one of them waits at most

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_token(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); :class:`ConfigError` if the
    file cannot be read, is empty or is too large to be a token."""
    raw = read_bounded(path, f"ops.tokenFile {path}", limit=MAX_TOKEN_BYTES, error=ConfigError)
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"ops.tokenFile {path}: not ASCII text") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"ops.tokenFile {path}: empty, or holds whitespace inside the token")
    return token


class TokenFile:
    """The bearer token, read at start and again (at most every :data:`RELOAD_EVERY`
    seconds) when the file's modification time or size changes. A file that turns
    unreadable keeps the last good token, with a warning."""

    def __init__(self, path: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self._clock = clock
        self._token = read_token(path)
        self._stamp = self._stat()
        self._checked = clock.now()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = Path(self.path).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def current(self) -> str:
        now = self._clock.now()
        if now - self._checked >= RELOAD_EVERY:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                try:
                    self._token = read_token(self.path)
                    self._stamp = stamp
                    log.info("ops_token_reloaded", path=self.path)
                except ConfigError as e:
                    log.warning("ops_token_unreadable", path=self.path, error=str(e),
                                keeping="the last token read")
        return self._token


def is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _refusal(request: web.Request, status: int, message: str,
             headers: dict[str, str]) -> web.Response:
    """JSON ``{"error": ...}`` on the JSON API (the page's script shows it), text elsewhere."""
    if request.path.startswith("/api/"):
        return web.Response(text=json.dumps({"error": message}), status=status,
                            content_type="application/json", headers=headers)
    return web.Response(text=message + "\n", status=status, headers=headers)


class Guard:
    """The ops port's middleware (see the module docstring). ``exempt`` paths pass as the
    probes do."""

    def __init__(self, settings: OpsSettings, *, token: TokenFile | None = None,
                 clock: Clock = SYSTEM_CLOCK, exempt: Iterable[str] = (),
                 queue_wait: float = QUEUE_WAIT) -> None:
        self.settings = settings
        self.token = token
        self.clock = clock
        self.exempt = PROBES | frozenset(exempt)
        self.queue_wait = queue_wait
        self.rendering = 0  # renders in progress
        self.waiting = 0  # requests waiting for a slot
        self._slots = anyio.Semaphore(settings.maxConcurrentRenders)
        self.refused: Counter[str] = Counter()  # answered here: rate, busy, unauthorized
        self._buckets: dict[str, RequestBudget] = {}

    @classmethod
    def from_settings(cls, settings: OpsSettings, *, clock: Clock = SYSTEM_CLOCK) -> Guard:
        """The guard the settings describe; :class:`ConfigError` if the token file is bad."""
        token = TokenFile(settings.tokenFile, clock) if settings.tokenFile else None
        return cls(settings, token=token, clock=clock)

    def install(self, app: web.Application, *, exempt: Iterable[str] = ()) -> web.Application:
        """Put the guard in front of ``app`` (one app per guard), letting ``exempt`` paths
        pass as the probes do."""
        self.exempt |= frozenset(exempt)
        app.middlewares.append(self.middleware)
        return app

    # -- the steps ---------------------------------------------------------------------------

    def _bucket(self, client: str) -> RequestBudget:
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_CLIENTS:
                self._evict()
            bucket = RequestBudget(self.settings.clientQPS, self.settings.clientBurst,
                                   clock=self.clock)
            self._buckets[client] = bucket
        return bucket

    def _evict(self) -> None:
        full = [k for k, b in self._buckets.items() if b.available >= b.burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= MAX_CLIENTS:  # all busy: drop the oldest half
            for k in list(self._buckets)[:MAX_CLIENTS // 2]:
                del self._buckets[k]

    def _authorized(self, request: web.Request) -> str | None:
        """None when the request may go on, else why not."""
        if self.token is None:
            return None
        if self.settings.trustLoopback and is_loopback(request.remote):
            return None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            how = ", or reach it through kubectl port-forward" if (
                self.settings.trustLoopback) else ""
            return ("this endpoint needs a bearer token: send 'Authorization: Bearer <token>' "
                    "with the token of the ops.tokenFile setting (the chart: the Secret "
                    f"named by opsAuth.existingSecret){how}")
        if not hmac.compare_digest(given.strip().encode(), self.token.current().encode()):
            return "the bearer token is not the one this endpoint accepts"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in self.exempt:
            return await handler(request)
        client = request.remote or "unknown"
        bucket = self._bucket(client)
        if not bucket.try_acquire():
            self.refused["rate"] += 1
            wait = max(1, math.ceil((1.0 - bucket.available) / bucket.qps))
            return _refusal(request, 429, (
                f"too many requests from {client}: at most {self.settings.clientQPS:g} a "
                f"second (bursts of {self.settings.clientBurst}); retry in {wait} s"),
                {"Retry-After": str(wait)})
        why = self._authorized(request)
        if why is not None:
            self.refused["unauthorized"] += 1
            error = ', error="invalid_token"' if "Authorization" in request.headers else ""
            return _refusal(request, 401, f"vgpud: {why}",
                            {"WWW-Authenticate": f'Bearer realm="vgpud"{error}'})
        if request.path.startswith(CHEAP_PREFIXES):
            return await handler(request)
        cap = self.settings.maxConcurrentRenders
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            if self.waiting >= cap * QUEUE_PER_SLOT:
                return self._busy(request, cap)
            self.waiting += 1
            try:
                with anyio.move_on_after(self.queue_wait) as waited:
                    await self._slots.acquire()
            finally:
                self.waiting -= 1
            if waited.cancelled_caught:
                return self._busy(request, cap)
        self.rendering += 1
        try:
            return await handler(request)
        finally:
            self.rendering -= 1
            self._slots.release()

    def _busy(self, request: web.Request, cap: int) -> web.Response:
        self.refused["busy"] += 1
        return _refusal(request, 429, (
            f"busy: {cap} status pages or scrapes are being rendered and more are waiting; "
            "retry in 1 s"), {"Retry-After": "1"})
