"""What every long-running role does the same way: read its HOST:PORT flags, serve an
app there and learn the port it got, answer kubelet's probes, read a request's body
whatever the client sent, and stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import math
import signal
import ssl as _ssl
from collections.abc import Callable

import anyio
import structlog
from aiohttp import web
from anyio.abc import TaskStatus

log = structlog.get_logger(__name__)


def parse_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:80`` too; an empty host means every address)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{flag} must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _bound_port(site: web.TCPSite, asked: int) -> int:
    """The port a started site listens on (the one the OS chose for port 0)."""
    sockets = getattr(site._server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else asked


async def serve(app: web.Application, host: str, port: int,
                ssl: _ssl.SSLContext | None = None, *,
                task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` until cancelled (started: the port it got, the OS's
    choice for 0), then close its connections. Signals are the caller's (one task group
    per process), and no access log is written (the roles log what they decide)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl, reuse_address=True)
        await site.start()
        task_status.started(_bound_port(site, port))
        await anyio.sleep(math.inf)
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


def add_probes(app: web.Application, ready: Callable[[], bool] | None = None,
               not_ready: str = "not ready") -> None:
    """``GET /healthz`` (alive: the event loop answers) and, given ``ready``, ``/readyz``
    (503 with ``not_ready``, which says what is awaited, until ``ready()`` holds)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready is None or ready():
            return web.Response(text="ok")
        return web.Response(text=not_ready, status=503)

    app.router.add_get("/healthz", healthz)
    if ready is not None:
        app.router.add_get("/readyz", readyz)


async def cancel_on_signals(scope: anyio.CancelScope, event: str) -> None:
    """Cancel ``scope`` at the first SIGTERM or SIGINT, logging ``event``."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for sig in signals:
            log.info(event, signal=signal.Signals(sig).name)
            scope.cancel()
            return


class BadBody(Exception):
    """A request body that could not be read; ``status`` is the HTTP status to answer (413
    or 400) and ``str()`` says why, for a person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body of ``request`` (its app's ``client_max_size`` is ``limit``), or
    :class:`BadBody`: longer than ``limit`` (413), or not what its ``Content-Encoding``
    says, or cut short (400). aiohttp answers a body it cannot decompress with a 500."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, f"the body is larger than {limit} bytes") from None
    except web.RequestPayloadError as e:
        cause = e.__cause__ or e
        raise BadBody(400, "the body could not be read as its Content-Encoding "
                      f"({request.headers.get('Content-Encoding') or 'none'}) says: "
                      f"{str(cause).strip()}") from None
