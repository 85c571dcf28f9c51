"""Serving the DRA plugin's two sockets where kubelet looks for them.

kubelet (its plugin manager) watches ``<root-dir>/plugins_registry`` and, for each socket
that appears there, calls ``GetInfo`` and then ``NotifyRegistrationStatus``; a DRA
plugin's ``GetInfo`` names the socket of its DRA service, by convention
``<root-dir>/plugins/<driver>/dra.sock``, which kubelet dials for every
``NodePrepareResources``. A restarted kubelet walks the registry directory again, so the
sockets simply stay; a socket that is removed (by a person, or a cleanup) is served anew
(both sockets, the DRA one first, so kubelet never learns of an endpoint that is not
there).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from grpclib.server import Server

log = structlog.get_logger(__name__)

PLUGIN_SOCKET = "dra.sock"


def registry_socket(registry_dir: Path, driver: str) -> Path:
    """The registration socket: ``<plugins_registry>/<driver>-reg.sock``."""
    return registry_dir / f"{driver}-reg.sock"


def plugin_socket(plugins_dir: Path, driver: str) -> Path:
    """The DRA service's socket: ``<plugins>/<driver>/dra.sock``."""
    return plugins_dir / driver / PLUGIN_SOCKET


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def serve_sockets(
    dra: Sequence[Any],
    registration: Sequence[Any],
    plugin: Path,
    registry: Path,
    *,
    poll: float = 1.0,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``dra`` handlers on ``plugin`` and ``registration`` on ``registry`` until
    cancelled, anew whenever either socket is removed or replaced."""
    started = False
    while True:
        servers = []
        try:
            for handlers, path in ((dra, plugin), (registration, registry)):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.unlink(missing_ok=True)
                server = Server(list(handlers))
                await server.start(path=str(path))
                servers.append(server)  # closed below only once started
            mine = (_inode(plugin), _inode(registry))
            log.info("dra_serving", plugin=str(plugin), registry=str(registry))
            if not started:
                task_status.started()
                started = True
            # polled, as the device plugin's sockets: two stat()s a second are free
            while (_inode(plugin), _inode(registry)) == mine:  # noqa: ASYNC110
                await anyio.sleep(poll)
            log.warning("dra_socket_removed", plugin=str(plugin), registry=str(registry))
        finally:
            for server in reversed(servers):
                server.close()
            with anyio.CancelScope(shield=True):
                for server in reversed(servers):
                    await server.wait_closed()
            # a socket left behind names a server that is gone: kubelet must not dial it
            registry.unlink(missing_ok=True)  # noqa: ASYNC240 (one unlink, as on start)
