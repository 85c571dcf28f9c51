"""A small HTTPS proxy in front of the real kube-apiserver, for the informer tests.

It passes every request through (the client's bearer token included) and streams the
answer back as it comes, watches included. Two switches make the server look like another
one, as a proxy or an older release would:

- ``strip_watch_list``: watch requests lose ``sendInitialEvents`` and
  ``resourceVersionMatch`` on the way (what a proxy that does not know them, or a server
  that ignores them, does);
- ``version``: ``/version`` answers that gitVersion (``v1.26.15``) instead of the server's.

Every request is recorded as the client sent it (``seen``), with the status the server
answered and, for a failure, the start of its body. It runs on its own thread and event
loop, so the test's blocking calls do not hold it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.realkube.controlplane import free_port
from tests.realkube.pki import Pair

WATCH_LIST_PARAMETERS = ("sendInitialEvents", "resourceVersionMatch")
FORWARDED = ("Authorization", "Accept", "Content-Type", "User-Agent")


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    user_agent: str
    status: int = 0
    error: str = ""  # the start of a failure's body

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")

    @property
    def streaming_list(self) -> bool:
        return self.watch and self.query.get("sendInitialEvents") == "true"


@dataclass
class ApiProxy:
    upstream: str
    ca: Path
    serving: Pair
    strip_watch_list: bool = False
    version: str | None = None
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def requests(self, user_agent: str = "") -> list[Seen]:
        """What was seen so far (from clients whose User-Agent starts so)."""
        return [s for s in list(self.seen) if s.user_agent.startswith(user_agent)]

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ApiProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="api-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self._loop.close()
        self._loop = None

    async def _start(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.ca))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_tls),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=True)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(str(self.serving.cert), str(self.serving.key))
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=tls,
                          shutdown_timeout=1.0).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # the handlers still streaming a watch: end them before the loop goes
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # -- requests ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        query = dict(request.query)
        seen = Seen(request.method, request.path, query, request.headers.get("User-Agent", ""))
        self.seen.append(seen)
        if request.path == "/version" and self.version is not None:
            major, _, rest = self.version.lstrip("v").partition(".")
            seen.status = 200
            return web.json_response({"major": major, "minor": rest.split(".", 1)[0],
                                      "gitVersion": self.version, "platform": "linux/amd64"})
        sent: list[tuple[str, str]] = list(request.query.items())
        if self.strip_watch_list and seen.watch:
            sent = [(k, v) for k, v in sent if k not in WATCH_LIST_PARAMETERS]
        headers = {k: request.headers[k] for k in FORWARDED if k in request.headers}
        body = await request.read()
        async with self._session.request(request.method, self.upstream + request.path,
                                         params=sent, headers=headers,
                                         data=body or None) as up:
            seen.status = up.status
            kept = {k: up.headers[k] for k in ("Content-Type",) if k in up.headers}
            if up.status >= 300:
                data = await up.read()
                seen.error = data[:2000].decode(errors="replace")
                return web.Response(status=up.status, body=data, headers=kept)
            response = web.StreamResponse(status=up.status, headers=kept)
            try:
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError, RuntimeError):
                pass  # the client went away, or the server did: the stream ends either way
            return response
