"""Serving the plugin socket and registering it with kubelet, again after kubelet restarts.

kubelet announces a restart by deleting the plugin sockets in its device-plugin
directory and creating ``kubelet.sock`` anew. :func:`serve_plugin` owns the whole
cycle: start the gRPC server on ``<dir>/<socket>``, wait for ``kubelet.sock``,
``Register``, then watch both sockets (by inode, polled) and start over when either
changes. Running containers are untouched by this: their files live in the
allocation directories, not in the plugin's memory.

Closing the server closes its connections too (:class:`_Server`), as the end of the
process would: kubelet must see its ``ListAndWatch`` stream end before the plugin
registers on the same socket again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol
from grpclib.server import Server

from vgpud.kube.backoff import Backoff
from vgpud.plugin._pb import v1beta1 as pb

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(RuntimeError):
    """kubelet refused the registration (a wrong version, or the resource is taken)."""


class _Server(Server):
    """grpclib's server, whose ``close()`` also closes the connections it accepted.

    ``Server.close()`` only cancels the request handlers and tells the client nothing:
    kubelet's ``ListAndWatch`` stream would stay open on a connection nobody serves any
    more. kubelet (1.37, ``devicemanager`` ``PluginConnected``) then still holds that
    endpoint and refuses a registration on the same socket ("device plugin already
    connected"), and after refusing it no longer watches the old connection, so it keeps
    refusing until kubelet itself restarts. A closed connection is what kubelet sees
    when a plugin process ends: the stream ends, the endpoint goes."""

    def __init__(self, handlers: Sequence[Any]) -> None:
        super().__init__(list(handlers))
        self._transports: list[asyncio.BaseTransport] = []

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made = protocol.connection_made

        def connection_made(transport: asyncio.BaseTransport) -> None:
            self._transports = [t for t in self._transports if not t.is_closing()]
            self._transports.append(transport)
            made(transport)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        return protocol

    def close(self) -> None:
        super().close()
        for t in self._transports:
            t.close()
        self._transports = []


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def register(kubelet_socket: Path, endpoint: str, resource: str,
                   options: pb.DevicePluginOptions, *, seconds: float = 10.0) -> None:
    channel = Channel(path=str(kubelet_socket))
    try:
        # anyio's deadline, not grpclib's (see vgpud.node.podresources.KUBELET_GONE)
        with anyio.fail_after(seconds):
            await pb.RegistrationStub(channel).register(
                pb.RegisterRequest(version=API_VERSION, endpoint=endpoint,
                                   resource_name=resource, options=options))
    except GRPCError as e:
        raise RegistrationError(f"kubelet refused {resource}: {e.message or e.status}") from None
    finally:
        channel.close()


async def serve_plugin(
    handlers: Sequence[Any],
    directory: str | Path,
    socket_name: str,
    resource: str,
    options: pb.DevicePluginOptions,
    *,
    poll: float = 1.0,
    task_status: TaskStatus[Path] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handlers`` on ``<directory>/<socket_name>`` and keep kubelet registered."""
    directory = Path(directory)
    sock = directory / socket_name
    kubelet = directory / KUBELET_SOCKET
    started = False
    registrations = 0
    while True:
        sock.unlink(missing_ok=True)
        server = _Server(handlers)
        await server.start(path=str(sock))
        mine = _inode(sock)
        try:
            backoff = Backoff(poll, max(poll, 10.0), jitter=0.0)  # poll, 2 poll … 10 s
            theirs = None
            # until registered; a new kubelet removes every plugin socket when it starts
            # (CleanupPluginDirectory), maybe ours after we served it anew: then it cannot
            # dial us, and we serve again
            while _inode(sock) == mine:
                theirs = _inode(kubelet)
                if theirs is not None:
                    try:
                        await register(kubelet, socket_name, resource, options)
                        break
                    # AttributeError: grpclib's lost-transport race (podresources.KUBELET_GONE);
                    # RegistrationError: kubelet refused (it could not dial us, say): its
                    # reason is logged at each try
                    except (OSError, StreamTerminatedError, TimeoutError, AttributeError,
                            RegistrationError) as e:
                        log.warning("register_retry", resource=resource,
                                    error=str(e) or type(e).__name__)
                await backoff.sleep()
            else:
                log.info("socket_removed", resource=resource, socket=str(sock))
                continue
            registrations += 1
            log.info("registered", resource=resource, socket=str(sock), times=registrations)
            if not started:
                task_status.started(sock)
                started = True
            # polled: the standard library has no inotify, and two stat()s a second are free
            while _inode(kubelet) == theirs and _inode(sock) == mine:  # noqa: ASYNC110
                await anyio.sleep(poll)
            log.info("kubelet_restarted", resource=resource)
        finally:
            server.close()
            with anyio.CancelScope(shield=True):
                await server.wait_closed()
