"""What every long-running role does the same way: read its HOST:PORT flags, learn the
port it got, and stop cleanly on SIGTERM/SIGINT."""

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
