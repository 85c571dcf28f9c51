"""Real OCI containers with runc, set up the way kubelet + containerd would set them up.

A :class:`Node` owns a temporary directory, a private runc state root (``runc --root``)
and a unique cgroup prefix; :meth:`Node.container` writes an OCI bundle for one
Kubernetes container and returns a :class:`Container` that runs it (``runc run`` in the
foreground: the args are PID 1), execs into it (``runc exec``), kills, restarts and
deletes it. :meth:`Node.close` deletes every container, removes the cgroup directories
runc left under the prefix (runc removes the container's leaf; kubelet's QoS and pod
levels are ours) and fails loudly if anything is left.

The container (:func:`build_spec`):

- rootfs: a small directory per container: ``/bin``, ``/lib``... as symlinks into
  ``usr/`` where the host is merged-usr (read-only binds of the host's otherwise), each
  of the host's ``/usr/*`` directories bind-mounted read-only except ``/usr/local``, which
  is the bundle's own (so a plugin mount such as ``/usr/local/vgpud/lib/libvgpu.so.1``
  gets its mount point in the bundle, never on the host: a mount point inside a
  read-only bind cannot be created and runc fails with EROFS), a minimal ``/etc``
  (passwd, group, a copy of ld.so.cache), ``/var/run`` → ``/run`` as in Debian images;
  ``root.readonly`` is true (like ``readOnlyRootFilesystem: true``) and ``/tmp`` is a
  tmpfs;
- namespaces pid, mount, ipc, uts and network (a fresh, empty network namespace), no
  cgroup namespace (containerd on cgroup v1 uses none): ``/proc/self/cgroup`` shows the
  full path;
- ``linux.cgroupsPath`` = ``/<prefix>/kubepods/<qos>/pod<uid>/<container id>``, kubelet's
  cgroupfs layout under the node's prefix (guaranteed pods sit directly under
  ``kubepods``); the container id is 64 hex digits like containerd's;
- no cgroup limits except the device cgroup (deny all, runc's defaults, and the
  plugin's devices), no ``/sys/fs/cgroup`` mount, containerd's default capabilities,
  no seccomp, ``noNewPrivileges`` false (kubelet's defaults);
- the plugin's env, mounts and devices per :mod:`tests.oci.kubelet`, the pod's env
  after them, and the "harness extras" standing in for the NVIDIA container runtime and
  the pod's hostPath volumes: a driver directory read-only at :data:`DRIVER_DIR` with
  ``LD_LIBRARY_PATH`` pointing there, ``extra_mounts`` (e.g. :meth:`Bind.same` for the
  fake driver's shared state file or a socket directory) and ``image_env``, which acts
  as the image's env (the plugin's and the pod's env override it).

Not emulated: the pod sandbox (containers of one pod share no namespaces here), the
files kubelet/containerd mount (``/etc/hosts``, ``/etc/hostname``, ``/etc/resolv.conf``,
``/dev/termination-log``), service-link env vars, resource limits, CDI.

Note for PID 1: the kernel drops signals a PID 1 has no handler for (other than SIGKILL
sent from outside), so ``kill(SIGTERM)`` does not stop ``sh`` as PID 1.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tests.debian import NotInstallable, apt_install
from tests.oci.kubelet import (
    Bind,
    DeviceNode,
    DeviceRunOptions,
    HarnessError,
    layered_env,
    ordered_mounts,
    resolve_device,
)

if TYPE_CHECKING:
    from vgpud.plugin._pb import v1beta1 as pb

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DRIVER_DIR = "/opt/fakecuda"
PREFIX = "vgpud-oci"
QoS = Literal["besteffort", "burstable", "guaranteed"]

# containerd's default capability set (oci.defaultUnixCaps)
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class RuncUnavailable(HarnessError):
    """runc cannot be had, or cannot run a container here; ``str()`` says why."""


# -- runc itself ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Runc:
    """A runc binary known to run containers here."""

    path: str
    version: str
    no_pivot: bool = False

    def argv(self, state_root: Path, *args: str) -> list[str]:
        return [self.path, "--root", str(state_root), *args]


def find_runc() -> str | None:
    found = shutil.which("runc")
    if found:
        return found
    for d in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/sbin"):
        p = Path(d, "runc")
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def install_runc(timeout: float = 600) -> str:
    """``apt-get install runc`` (:func:`tests.debian.apt_install`)."""
    try:
        apt_install(["runc"], lambda: find_runc() is not None, timeout=timeout)
    except NotInstallable as e:
        raise RuncUnavailable(str(e)) from None
    found = find_runc()
    assert found is not None
    return found


def obtain_runc(*, install: bool = True) -> Runc:
    """Find (or install) runc and prove it can run a trivial container here."""
    if not Path("/proc/self/ns/pid").exists():
        raise RuncUnavailable("not a Linux host with namespaces")
    path = find_runc()
    if path is None:
        if not install:
            raise RuncUnavailable("runc is not installed")
        path = install_runc()
    if os.geteuid() != 0:
        raise RuncUnavailable(f"runc ({path}) needs root here: the harness does not do "
                              f"rootless containers")
    r = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuncUnavailable(f"{path} --version failed: {r.stderr.strip()}")
    version = r.stdout.splitlines()[0] if r.stdout else "unknown"
    remove_stale_cgroups()
    failures = []
    for no_pivot in (False, True):
        runc = Runc(path, version, no_pivot)
        try:
            with Node(runc) as node:
                done = node.run(["/bin/sh", "-c", "exit 0"], timeout=30)
        except HarnessError as e:
            failures.append(f"{'--no-pivot' if no_pivot else 'pivot_root'}: {e}")
            continue
        if done.returncode == 0:
            return runc
        failures.append(f"{'--no-pivot' if no_pivot else 'pivot_root'}: exit "
                        f"{done.returncode}: {done.stderr.strip()}")
    raise RuncUnavailable(f"{version} cannot run a trivial container here:\n"
                          + "\n".join(failures))


# -- cgroups --------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Mount points of the cgroup hierarchies (v1 controllers and cgroup2)."""
    seen: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split(" ", 1)[0]
            if fstype in ("cgroup", "cgroup2"):
                mp = Path(left.split(" ")[4].replace("\\040", " "))
                seen.setdefault(os.path.realpath(mp), mp)
    return list(seen.values())


def _rmdir_tree(top: Path, *, kill: bool) -> list[str]:
    """rmdir a cgroup subtree bottom-up; SIGKILL what is still in it when ``kill``."""
    problems = []
    dirs = [Path(d) for d, _, _ in os.walk(top)]
    for d in reversed(dirs):
        for attempt in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or not kill:
                    problems.append(f"{d}: {e.strerror}")
                    break
                with contextlib.suppress(OSError):
                    for pid in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.02 * (attempt + 1) if attempt < 10 else 0.2)
        else:
            problems.append(f"{d}: still busy")
    return problems


def remove_stale_cgroups() -> None:
    """Remove empty cgroup trees of earlier harness runs whose test process is gone."""
    pattern = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+$")
    for mp in cgroup_mounts():
        with contextlib.suppress(OSError):
            for d in mp.iterdir():
                m = pattern.match(d.name)
                if m and d.is_dir() and not Path(f"/proc/{m.group(1)}").exists():
                    _rmdir_tree(d, kill=False)


# -- processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    """A finished process: exit status (128 + N when killed by signal N), its output."""

    returncode: int
    stdout: str
    stderr: str

    def check(self) -> Completed:
        if self.returncode != 0:
            raise HarnessError(f"exit status {self.returncode}\nstdout:\n{self.stdout}"
                               f"\nstderr:\n{self.stderr}")
        return self


_EOF = object()


class Process:
    """A ``runc run``/``runc exec`` client process whose stdio is the container
    process's own (runc passes it through when there is no terminal).

    stdout is read line by line in the background: :meth:`readline` takes the next
    line, :attr:`stdout` is everything so far. With ``interactive`` stdin stays open for
    :meth:`send`/:meth:`ask`; otherwise it is ``stdin`` (then closed) or /dev/null.
    """

    def __init__(self, argv: Sequence[str], *, label: str, stdin: str | bytes | None = None,
                 interactive: bool = False, pid_file: Path | None = None) -> None:
        self.argv = list(argv)
        self.label = label
        self.pid_file = pid_file
        self._lines: queue.Queue[object] = queue.Queue()
        self._out: list[str] = []
        self._err: list[bytes] = []
        piped = interactive or stdin is not None
        self.popen = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else stdin
            if interactive:
                self._write(data)
            else:
                t = threading.Thread(target=self._feed, args=(data,), daemon=True)
                t.start()
                self._threads.append(t)

    # background readers/writers (never raise: pytest turns thread errors into failures)
    def _read_out(self) -> None:
        assert self.popen.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            for raw in iter(self.popen.stdout.readline, b""):
                text = raw.decode(errors="replace")
                self._out.append(text)
                self._lines.put(text.rstrip("\n"))
        self._lines.put(_EOF)

    def _read_err(self) -> None:
        assert self.popen.stderr is not None
        with contextlib.suppress(OSError, ValueError):
            fd = self.popen.stderr.fileno()
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self._err.append(chunk)

    def _feed(self, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._write(data)
        self.close_stdin()

    def _write(self, data: bytes) -> None:
        if self.popen.stdin is None:
            raise HarnessError("stdin is not a pipe: start with interactive=True")
        self.popen.stdin.write(data)
        self.popen.stdin.flush()

    # -- interaction ---------------------------------------------------------------------

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def send(self, line: str) -> None:
        """Write one line (a newline is added) to the process's stdin."""
        try:
            self._write((line + "\n").encode())
        except (BrokenPipeError, ValueError):
            raise HarnessError(f"cannot write {line!r} to {self.label}: its stdin is closed "
                               f"(exit status {self.popen.poll()}, stderr: "
                               f"{self.stderr.strip()!r})") from None

    def close_stdin(self) -> None:
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.popen.stdin.close()

    def readline(self, timeout: float = 10.0) -> str:
        """The next stdout line, without its newline."""
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no line from {self.label} within {timeout}s; stderr: "
                               f"{self.stderr.strip()!r}") from None
        if item is _EOF:
            self._lines.put(_EOF)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
            raise EOFError(f"{self.label} closed its stdout (exit status "
                           f"{self.popen.poll()}); stderr: {self.stderr.strip()!r}")
        assert isinstance(item, str)
        return item

    def ask(self, line: str, timeout: float = 10.0) -> str:
        """Send one line and return the next line of output."""
        self.send(line)
        return self.readline(timeout)

    def ask_json(self, line: str, timeout: float = 10.0) -> Any:
        reply = self.ask(line, timeout)
        try:
            return json.loads(reply)
        except json.JSONDecodeError:
            raise HarnessError(f"{self.label} answered {line!r} with non-JSON {reply!r}") from None

    def host_pid(self, timeout: float = 10.0) -> int:
        """The host PID of the container process (from runc's ``--pid-file``)."""
        if self.pid_file is None:
            raise HarnessError(f"{self.label} has no pid file")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return int(self.pid_file.read_text())
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"runc wrote no pid file for {self.label} (exit status "
                                   f"{self.popen.poll()}; stderr: {self.stderr.strip()!r})")
            time.sleep(0.005)

    def wait(self, timeout: float = 30.0) -> Completed:
        """Wait for the exit (closing stdin first) and return status and output."""
        self.close_stdin()
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.label} still running after {timeout}s; stdout: "
                               f"{self.stdout!r}; stderr: {self.stderr!r}") from None
        for t in self._threads:
            t.join(timeout=5)
        return Completed(rc, self.stdout, self.stderr)

    def stop(self, timeout: float = 10.0) -> None:
        """Reap the client; SIGKILL it (our own child) if it does not exit in time."""
        self.close_stdin()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=5)
        for s in (self.popen.stdout, self.popen.stderr):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()


# -- the spec -------------------------------------------------------------------------------


def _bind(src: Path | str, dst: str, read_only: bool) -> dict[str, Any]:
    return {"destination": dst, "type": "bind", "source": str(src),
            "options": ["rbind", "rprivate", "ro" if read_only else "rw"]}


def _runtime_mounts() -> list[dict[str, Any]]:
    """The runtime's default mounts plus the "image" (host /usr) and /tmp."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620",
                     "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    mounts += [_bind(d, str(d), True) for d in _usr_dirs()]
    for name in TOP_DIRS:
        host = Path("/", name)
        if host.is_dir() and not host.is_symlink():  # not merged-usr: the image has it
            mounts.append(_bind(host, f"/{name}", True))
    mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777"]})
    return mounts


def _usr_dirs() -> list[Path]:
    """The host's /usr/* directories the "image" shares (not /usr/local: the image's own
    /usr/local is empty, so mounts below it get their mount points in the bundle)."""
    return sorted(d for d in Path("/usr").iterdir()
                  if d.is_dir() and not d.is_symlink() and d.name != "local")


def make_rootfs(rootfs: Path) -> None:
    """A Debian-like skeleton; the host's /usr/* (and any non-merged top dir) are
    bind-mounted read-only over it."""
    for name in ("dev", "proc", "sys", "tmp", "etc", "opt", "run", "root", "home",
                 "var/tmp", "var/lib", "usr/local/bin", "usr/local/lib", "usr/local/sbin",
                 "usr/local/share"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)  # runc gives a tmpfs its mount point's mode
    for entry in Path("/usr").iterdir():
        if entry.is_symlink():
            (rootfs / "usr" / entry.name).symlink_to(entry.readlink())
    for d in _usr_dirs():
        (rootfs / "usr" / d.name).mkdir(exist_ok=True)
    for name in TOP_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            target = str(host.readlink())
            if target.lstrip("/").startswith("usr/"):
                (rootfs / name).symlink_to(target.lstrip("/"))
        elif host.is_dir():
            (rootfs / name).mkdir()
    (rootfs / "var/run").symlink_to("../run")
    etc = rootfs / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    if Path("/etc/ld.so.cache").is_file():
        shutil.copyfile("/etc/ld.so.cache", etc / "ld.so.cache")


def build_spec(*, args: Sequence[str], env: Mapping[str, str], uid: int, gid: int,
               hostname: str, cgroups_path: str, binds: Sequence[Bind],
               devices: Sequence[DeviceNode], annotations: Mapping[str, str],
               cwd: str = "/") -> dict[str, Any]:
    """The OCI config.json of one container (see the module docstring)."""
    cri = ordered_mounts(binds)
    overridden = {os.path.normpath(b.container) for b in cri}
    mounts = [m for m in _runtime_mounts() if m["destination"] not in overridden]
    for b in cri:
        if not Path(b.host).exists():
            raise HarnessError(
                f"mount {b.container}: host path {b.host} does not exist (containerd would "
                f"create an empty directory there; the harness refuses)")
        mounts.append(_bind(os.path.realpath(b.host), b.container, b.read_only))
    rules: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    rules += [{"allow": True, "type": d.kind, "major": d.major, "minor": d.minor,
               "access": d.permissions} for d in devices]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(args),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd,
            "capabilities": {k: list(CAPABILITIES)
                             for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": False,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "annotations": dict(annotations),
        "linux": {
            "cgroupsPath": cgroups_path,
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "devices": [{"path": d.container, "type": d.kind, "major": d.major,
                         "minor": d.minor, "fileMode": d.mode, "uid": d.uid, "gid": d.gid}
                        for d in devices],
            "resources": {"devices": rules},
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }


# -- containers -----------------------------------------------------------------------------


@dataclass(repr=False)
class Container:
    """One Kubernetes container of a pod on the :class:`Node`, as an OCI bundle."""

    node: Node
    name: str
    pod_uid: str
    qos: QoS
    bundle: Path
    args: list[str]
    env: dict[str, str]
    mounts: list[Bind]
    devices: list[DeviceNode]
    cdi_devices: tuple[str, ...]
    annotations: dict[str, str]
    spec: dict[str, Any]
    id: str = ""
    restarts: int = 0
    process: Process | None = None
    _execs: list[Process] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._new_id()

    def __repr__(self) -> str:
        return (f"Container({self.name!r}, pod {self.pod_uid}, id {self.id[:12]}, "
                f"restarts {self.restarts})")

    def _new_id(self) -> None:
        self.id = secrets.token_hex(32)
        self.spec["linux"]["cgroupsPath"] = self.cgroups_path
        (self.bundle / "config.json").write_text(json.dumps(self.spec, indent=1))

    @property
    def pod_cgroup(self) -> str:
        qos = "" if self.qos == "guaranteed" else f"/{self.qos}"
        return f"/{self.node.prefix}/kubepods{qos}/pod{self.pod_uid}"

    @property
    def cgroups_path(self) -> str:
        return f"{self.pod_cgroup}/{self.id}"

    def _runc(self, *args: str) -> list[str]:
        return self.node.runc.argv(self.node.state, *args)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, *, stdin: str | bytes | None = None, interactive: bool = False) -> Process:
        """``runc run`` in the foreground: ``args`` become PID 1, stdio is ours."""
        if self.process is not None and self.process.returncode is None:
            raise HarnessError(f"container {self.name} is already running")
        pid_file = self.bundle / f"init-{self.restarts}.pid"
        argv = self._runc("run", *(["--no-pivot"] if self.node.runc.no_pivot else []),
                          "--bundle", str(self.bundle), "--pid-file", str(pid_file), self.id)
        self.process = Process(argv, label=f"container {self.name} {self.args}", stdin=stdin,
                               interactive=interactive, pid_file=pid_file)
        return self.process

    def state(self) -> dict[str, Any] | None:
        """``runc state`` (None when runc no longer knows the container)."""
        r = subprocess.run(self._runc("state", self.id), capture_output=True, text=True,
                           check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def host_pid(self, timeout: float = 10.0) -> int:
        """PID 1's host PID, from ``runc state`` (waits for the container to be running)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.state()
            if st is not None and st.get("status") == "running" and st.get("pid"):
                return int(st["pid"])
            p = self.process
            if p is None or p.returncode is not None or time.monotonic() > deadline:
                raise HarnessError(f"container {self.name} is not running (state {st}; "
                                   f"stderr: {p.stderr.strip() if p else ''!r})")
            time.sleep(0.005)

    def host_pids(self) -> list[int]:
        """Host PIDs of every process in the container's cgroup."""
        for mp in cgroup_mounts():
            procs = mp / self.cgroups_path.lstrip("/") / "cgroup.procs"
            if procs.exists():
                return sorted(int(p) for p in procs.read_text().split())
        return []

    def kill(self, sig: int = signal.SIGTERM, *, all_processes: bool = False) -> None:
        """``runc kill``: signal PID 1 (or every process of the container)."""
        r = subprocess.run(self._runc("kill", *(["--all"] if all_processes else []), self.id,
                                      str(int(sig))),
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise HarnessError(f"runc kill {self.name}: {r.stderr.strip()}")

    def wait(self, timeout: float = 30.0) -> Completed:
        """Wait for PID 1 to exit; its exit status and output."""
        if self.process is None:
            raise HarnessError(f"container {self.name} was never started")
        return self.process.wait(timeout)

    def exec(self, args: Sequence[str], *, env: Mapping[str, str] | None = None,
             user: int | tuple[int, int] | None = None, stdin: str | bytes | None = None,
             timeout: float = 30.0) -> Completed:
        """``runc exec`` to completion (the container's env, plus ``env``)."""
        p = self.spawn(args, env=env, user=user, stdin=stdin)
        try:
            return p.wait(timeout)
        finally:
            p.stop(timeout=1)

    def spawn(self, args: Sequence[str], *, env: Mapping[str, str] | None = None,
              user: int | tuple[int, int] | None = None, stdin: str | bytes | None = None,
              interactive: bool = False) -> Process:
        """``runc exec`` in the background: another process in the same container."""
        opts: list[str] = []
        for k, v in (env or {}).items():
            opts += ["--env", f"{k}={v}"]
        if user is not None:
            uid, gid = _ids(user)
            opts += ["--user", f"{uid}:{gid}"]
        pid_file = self.bundle / f"exec-{secrets.token_hex(4)}.pid"
        p = Process(self._runc("exec", *opts, "--pid-file", str(pid_file), self.id, *args),
                    label=f"exec in {self.name} {list(args)}", stdin=stdin,
                    interactive=interactive, pid_file=pid_file)
        self._execs.append(p)
        return p

    def delete(self, timeout: float = 10.0) -> None:
        """``runc delete --force`` (kills what runs), then reap our runc clients."""
        r = subprocess.run(self._runc("delete", "--force", self.id), capture_output=True,
                           text=True, check=False)
        gone = r.returncode == 0 or "does not exist" in r.stderr
        for p in [*self._execs, *([self.process] if self.process else [])]:
            p.stop(timeout)
        self._execs.clear()
        if not gone and self.state() is not None:
            raise HarnessError(f"runc delete {self.name}: {r.stderr.strip()}")

    def restart(self, *, stdin: str | bytes | None = None,
                interactive: bool = False) -> Process:
        """What kubelet does when a container restarts: the old one is removed and a new
        one (new id and cgroup, same pod) is created from the same spec and mounts."""
        self.delete()
        self.restarts += 1
        self._new_id()
        return self.start(stdin=stdin, interactive=interactive)


def _ids(user: int | tuple[int, int]) -> tuple[int, int]:
    return (user, 0) if isinstance(user, int) else user


class Node:
    """A node's container runtime for one test: temp dir, runc state root, cgroup prefix."""

    def __init__(self, runc: Runc) -> None:
        self.runc = runc
        # short: unix socket paths under it must fit in 108 bytes
        self.root = Path(tempfile.mkdtemp(prefix="vgoci-", dir="/tmp"))
        self.state = self.root / "runc"
        self.state.mkdir()
        self.prefix = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(4)}"
        self.containers: list[Container] = []

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, name: str) -> Path:
        """A fresh directory under the node's (short) root, for tests' own files."""
        p = self.root / "files" / name
        p.mkdir(parents=True, exist_ok=False)
        return p

    def container(
        self,
        name: str,
        args: Sequence[str],
        *,
        allocate: pb.ContainerAllocateResponse | Sequence[pb.ContainerAllocateResponse] = (),
        pod_env: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        pod_uid: str | None = None,
        qos: QoS = "besteffort",
        driver: Path | None = None,
        extra_mounts: Sequence[Bind] = (),
        image_env: Mapping[str, str] | None = None,
        user: int | tuple[int, int] | None = None,
        cwd: str = "/",
    ) -> Container:
        """An OCI bundle for Kubernetes container ``name`` of pod ``pod_uid`` (a new
        UUID by default) with the plugin's ``allocate`` response(s) applied as kubelet
        would; ``driver`` is mounted read-only at :data:`DRIVER_DIR` with
        ``LD_LIBRARY_PATH`` there; ``extra_mounts``/``image_env`` are the harness extras."""
        responses = [allocate] if not isinstance(allocate, Sequence) else list(allocate)
        opts = DeviceRunOptions.from_responses(*responses)
        pod_uid = pod_uid or str(uuid.uuid4())
        if any(c.pod_uid == pod_uid and c.name == name for c in self.containers):
            raise HarnessError(f"pod {pod_uid} already has a container {name!r}")
        hostname = f"pod-{pod_uid[:8]}"
        binds = list(opts.mounts)
        image = {"PATH": DEFAULT_PATH}
        if driver is not None:
            binds.append(Bind(Path(driver).absolute(), DRIVER_DIR, True))
            image["LD_LIBRARY_PATH"] = DRIVER_DIR
        binds += extra_mounts
        env = layered_env({"HOSTNAME": hostname}, image, image_env or {}, opts.envs, pod_env)
        devices = [resolve_device(d) for d in opts.devices]
        annotations = {**dict(opts.annotations),
                       "io.kubernetes.cri.container-type": "container",
                       "io.kubernetes.cri.container-name": name,
                       "io.kubernetes.cri.sandbox-uid": pod_uid}
        uid, gid = _ids(user) if user is not None else (0, 0)
        spec = build_spec(args=args, env=env, uid=uid, gid=gid, hostname=hostname,
                          cgroups_path="", binds=binds, devices=devices,
                          annotations=annotations, cwd=cwd)
        bundle = self.root / "pods" / pod_uid / name
        bundle.mkdir(parents=True)
        make_rootfs(bundle / "rootfs")
        c = Container(self, name, pod_uid, qos, bundle, list(args), env,
                      ordered_mounts(binds), devices, opts.cdi_devices, annotations, spec)
        self.containers.append(c)
        return c

    def run(self, args: Sequence[str], *, stdin: str | bytes | None = None,
            timeout: float = 30.0, **kw: Any) -> Completed:
        """Create a container, run ``args`` as PID 1 to completion, delete it."""
        c = self.container(f"run-{len(self.containers)}", args, **kw)
        try:
            c.start(stdin=stdin)
            return c.wait(timeout)
        finally:
            c.delete()

    def cgroup_dirs(self) -> list[Path]:
        """The node's cgroup directories that exist now, in every hierarchy."""
        return [mp / self.prefix for mp in cgroup_mounts() if (mp / self.prefix).exists()]

    def close(self) -> None:
        """Delete every container, remove the prefix's cgroups and the temp dir; raise
        :class:`HarnessError` if anything could not be cleaned up."""
        problems = []
        for c in self.containers:
            try:
                c.delete()
            except Exception as e:  # keep cleaning up the rest
                problems.append(f"container {c.name}: {e}")
        for d in self.cgroup_dirs():
            problems += _rmdir_tree(d, kill=True)
        problems += [f"{d}: left behind" for d in self.cgroup_dirs()]
        leftover = subprocess.run(self.runc.argv(self.state, "list", "-q"),
                                  capture_output=True, text=True, check=False).stdout.split()
        problems += [f"runc still lists container {i}" for i in leftover]
        shutil.rmtree(self.root, ignore_errors=True)
        if problems:
            raise HarnessError("cleanup failed:\n" + "\n".join(problems))
