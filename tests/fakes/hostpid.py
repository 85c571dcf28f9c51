"""The host-PID oracle of the fake driver (``FAKECUDA_HOST_PID_SOCK``).

A process of the fake driver that runs in its own PID namespace (a real container) cannot
know its host PID; the real kernel driver knows it.  The fake asks this server once, when
the process registers: it connects to a unix stream socket and reads one line, the ASCII
decimal PID of the peer as the kernel reports it to the server (``SO_PEERCRED``, translated
into the server's PID namespace).  A peer the server's namespace cannot see gets ``0``,
which the fake treats as a failure (it warns and falls back to getpid() + offset).

    with HostPidOracle(tmp_path / "hostpid.sock") as oracle:
        env["FAKECUDA_HOST_PID_SOCK"] = str(oracle.path)
        ...

The socket is made world-connectable (containers may run as other users) and removed on
exit.  Serving happens on a daemon thread, one short connection at a time.
"""

from __future__ import annotations

import os
import pathlib
import socket
import struct
import threading
from types import TracebackType

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class HostPidOracle:
    """Answers each connection with the peer's PID (SO_PEERCRED) and a newline."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self.served = 0  # connections answered
        self.answers: list[int] = []
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> HostPidOracle:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if len(os.fsencode(self.path)) >= 108:  # sizeof(sockaddr_un.sun_path)
            raise ValueError(f"unix socket path too long: {self.path}")
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        self.path.chmod(0o777)
        sock.listen(64)
        sock.settimeout(0.1)  # wakes the loop up to notice stop()
        self._sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="hostpid-oracle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                    pid = _UCRED.unpack(creds)[0]
                    conn.sendall(f"{pid}\n".encode())
                except OSError:
                    continue
                self.answers.append(pid)
                self.served += 1
