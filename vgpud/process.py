"""What every long-running role does the same way: read its HOST:PORT flags, learn the
port it got, read a request's body whatever the client sent, and stop cleanly on
SIGTERM/SIGINT."""

from __future__ import annotations

import signal

import anyio
import structlog
from aiohttp import web

log = structlog.get_logger(__name__)


def parse_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:80`` too; an empty host means every address)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{flag} must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def bound_port(site: web.TCPSite, asked: int) -> int:
    """The port a started site listens on (the one the OS chose for port 0)."""
    sockets = getattr(site._server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else asked


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
