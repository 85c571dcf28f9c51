"""The serving certificate, reloaded when its files change.

cert-manager (or the bootstrap, :mod:`.bootstrap`) rewrites ``tls.crt``/``tls.key``
in place — in a mounted Secret, by swapping the ``..data`` symlink. :class:`TlsFiles`
polls what the paths resolve to (inode, size, mtime) and, when that changes, loads
the pair into a scratch context first (a half-written or mismatched pair is logged
and the old one kept), then into the live context: OpenSSL applies a context's
certificate to every handshake after the call, so new connections get the new
certificate and open ones keep theirs.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import anyio
import structlog

log = structlog.get_logger(__name__)


class TlsError(ValueError):
    """The certificate or key cannot be loaded; ``str()`` says which file and why."""


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()  # follows symlinks: the ..data swap changes the inode
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class TlsFiles:
    def __init__(self, cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> None:
        self.cert, self.key = Path(cert), Path(key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loads = 0
        self._seen: tuple[object, object] = (None, None)
        self._load(self.context)
        self.loads = 1

    def _load(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except FileNotFoundError as e:
            raise TlsError(f"{e.filename}: no such file") from None
        except (ssl.SSLError, OSError) as e:
            raise TlsError(f"cannot load {self.cert} with {self.key}: {e}") from None
        self._seen = (_stamp(self.cert), _stamp(self.key))

    def changed(self) -> bool:
        """Did the files change into a loadable pair since the last load? (Checked in a
        scratch context, so it may run in a worker thread.)"""
        now = (_stamp(self.cert), _stamp(self.key))
        if now == self._seen or None in now:
            return False
        try:
            self._load(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
        except TlsError as e:
            log.warning("tls_reload_failed", error=str(e), keeping="the previous certificate")
            self._seen = now  # try again when they change again
            return False
        return True

    def _commit(self) -> None:
        try:
            self._load(self.context)
        except TlsError as e:  # changed again since the check: the next poll sees it
            log.warning("tls_reload_failed", error=str(e))
            self._seen = (None, None)
            return
        self.loads += 1
        log.info("tls_reloaded", cert=str(self.cert), loads=self.loads)

    async def watch(self, every: float = 5.0) -> None:
        while True:
            await anyio.sleep(every)
            if await anyio.to_thread.run_sync(self.changed):
                self._commit()
