"""Selftests of the OCI harness: every property later tests rely on, with real runc.

The programs are the host's ``sh`` and a small C ``probe`` (``progs/probe.c``) that
answers one JSON line per stdin line, mounted as the "driver" directory at
/opt/fakecuda. The first two tests need no runc.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.oci import runtime
from tests.oci.kubelet import (
    Bind,
    DeviceRunOptions,
    DeviceSpec,
    HarnessError,
    layered_env,
    ordered_mounts,
)
from tests.oci.runtime import DRIVER_DIR, Node, Runc, RuncUnavailable
from vgpud.plugin._pb import v1beta1 as pb

PROGS = Path(__file__).resolve().parent / "progs"
PROBE = f"{DRIVER_DIR}/probe"
SHIM_DIR = "/usr/local/vgpud/lib"


# -- a plugin-shaped allocation on the host ------------------------------------------------


@dataclass
class Allocation:
    lib: Path  # the "shim" (preload.so)
    preload: Path  # the ld.so.preload file naming it
    etc: Path  # /etc/vgpud
    state: Path  # /var/run/vgpud

    def response(self, **envs: str) -> pb.ContainerAllocateResponse:
        """What vgpud's Allocate returns (env mode), built by hand."""
        return pb.ContainerAllocateResponse(
            envs={"NVIDIA_VISIBLE_DEVICES": "GPU-fa4ecda0-0000-4000-8000-000000000000",
                  "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "VGPUD_CONFIG": "/etc/vgpud/config",
                  **envs},
            mounts=[
                pb.Mount(container_path=f"{SHIM_DIR}/libpreload.so", host_path=str(self.lib),
                         read_only=True),
                pb.Mount(container_path="/etc/ld.so.preload", host_path=str(self.preload),
                         read_only=True),
                pb.Mount(container_path="/etc/vgpud", host_path=str(self.etc), read_only=True),
                pb.Mount(container_path="/var/run/vgpud", host_path=str(self.state),
                         read_only=False),
            ])


@pytest.fixture
def allocation(node: Node, compile_c: Callable[..., Path]) -> Allocation:
    lib = compile_c(PROGS / "preload.c", "-shared", "-fPIC")
    root = node.path("alloc")
    preload = root / "ld.so.preload"
    preload.write_text(f"{SHIM_DIR}/libpreload.so\n")
    (root / "etc").mkdir()
    (root / "etc/config").write_text("version=1\n")
    (root / "state").mkdir()
    return Allocation(lib, preload, root / "etc", root / "state")


@contextlib.contextmanager
def unix_server(path: Path) -> Iterator[list[str]]:
    """A host unix socket answering "pong" to each connection; yields what it got."""
    got: list[str] = []
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen()
    srv.settimeout(0.05)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                got.append(conn.recv(64).decode())
                conn.sendall(b"pong\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join(5)
        srv.close()


# -- conversion (no runc) ------------------------------------------------------------------


def test_responses_merge_like_kubelet() -> None:
    first = pb.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-a", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        mounts=[pb.Mount(container_path="/etc/ld.so.preload", host_path="/h/preload",
                         read_only=True),
                pb.Mount(container_path="/etc/vgpud", host_path="/h/etc", read_only=True),
                pb.Mount(container_path="/etc/vgpud", host_path="/h/other", read_only=False),
                pb.Mount(container_path="/var/run/vgpud", host_path="/h/state")],
        devices=[pb.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/null",
                               permissions="rw")],
        cdi_devices=[pb.CdiDevice(name="nvidia.com/gpu=GPU-a")],
        annotations={"a": "1"})
    second = pb.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-b", "X": "2"},
        devices=[pb.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/zero",
                               permissions="r"),
                 pb.DeviceSpec(container_path="/dev/nvidiactl", host_path="/dev/zero",
                               permissions="rwm")],
        cdi_devices=[pb.CdiDevice(name="nvidia.com/gpu=GPU-a"),
                     pb.CdiDevice(name="nvidia.com/gpu=GPU-b")],
        annotations={"a": "2", "b": "3"})
    opts = DeviceRunOptions.from_responses(first, second)
    assert dict(opts.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a",
                               "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "X": "2"}
    assert opts.mounts == (Bind(Path("/h/preload"), "/etc/ld.so.preload", True),
                           Bind(Path("/h/etc"), "/etc/vgpud", True),
                           Bind(Path("/h/state"), "/var/run/vgpud", False))
    assert opts.devices == (DeviceSpec(Path("/dev/null"), "/dev/nvidia0", "rw"),
                            DeviceSpec(Path("/dev/zero"), "/dev/nvidiactl", "rwm"))
    assert opts.cdi_devices == ("nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b")
    assert dict(opts.annotations) == {"a": "1", "b": "3"}
    with pytest.raises(HarnessError, match="absolute"):
        DeviceRunOptions.from_responses(pb.ContainerAllocateResponse(
            mounts=[pb.Mount(container_path="etc/x", host_path="/h")]))


def test_env_layers_and_mount_order() -> None:
    env = layered_env({"HOSTNAME": "h", "PATH": "/bin"}, {"A": "image", "B": "image"},
                      [("A", "plugin"), ("C", "plugin")], {"C": "pod"})
    assert list(env.items()) == [("HOSTNAME", "h"), ("PATH", "/bin"), ("A", "plugin"),
                                 ("B", "image"), ("C", "pod")]
    ms = [Bind(Path("/a"), "/var/run/vgpud"), Bind(Path("/b"), "/etc"),
          Bind(Path("/c"), "/etc/vgpud"), Bind(Path("/d"), "/opt")]
    assert [m.container for m in ordered_mounts(ms)] == ["/etc", "/opt", "/etc/vgpud",
                                                          "/var/run/vgpud"]


# -- the runtime ---------------------------------------------------------------------------


def test_pid1_in_own_namespaces_without_host_proc(node: Node, probe: Path) -> None:
    c = node.container("main", [PROBE], driver=probe)
    t0 = time.monotonic()
    p = c.start(interactive=True)
    me = p.ask_json("id")
    started = time.monotonic() - t0
    assert me["pid"] == 1 and me["uid"] == 0 and me["gid"] == 0
    ns = p.ask_json("ns")
    assert ns["pid"] != str(Path("/proc/self/ns/pid").readlink())
    assert ns["mnt"] != str(Path("/proc/self/ns/mnt").readlink())
    assert p.ask_json("procs")["pids"] == [1]  # the container's own /proc only
    host_pid = c.host_pid()
    assert host_pid == p.host_pid() != 1
    status = Path(f"/proc/{host_pid}/status").read_text()
    assert re.search(r"^NSpid:\s+\d+\s+1$", status, re.M), status
    assert c.host_pids() == [host_pid]
    assert started < 5, f"the container took {started:.2f}s to answer"


def test_cgroups_path_is_kubelets_layout(node: Node, probe: Path) -> None:
    uid = "1234-5678"
    c = node.container("main", [PROBE], driver=probe, pod_uid=uid)
    assert re.fullmatch(rf"/{node.prefix}/kubepods/besteffort/pod{uid}/[0-9a-f]{{64}}",
                        c.cgroups_path)
    p = c.start(interactive=True)
    lines = p.ask_json("read /proc/self/cgroup")["data"].splitlines()
    assert lines and all(line.endswith(":" + c.cgroups_path) for line in lines), lines
    host = Path(f"/proc/{c.host_pid()}/cgroup").read_text().splitlines()
    assert host and all(line.endswith(":" + c.cgroups_path) for line in host), host
    g = node.container("g", ["/bin/sh", "-c", "cat /proc/self/cgroup"], qos="guaranteed")
    g.start()
    out = g.wait().check().stdout
    assert f":/{node.prefix}/kubepods/pod{g.pod_uid}/{g.id}\n" in out


def test_rootfs_read_only_tmp_writable(node: Node, probe: Path) -> None:
    p = node.container("main", [PROBE], driver=probe).start(interactive=True)
    for path in ("/x", "/etc/x", "/usr/x", "/usr/local/x", f"{DRIVER_DIR}/x"):
        assert p.ask_json(f"write {path}") == {"errno": errno.EROFS}, path
    assert p.ask_json("write /tmp/x") == {"ok": True}
    assert p.ask_json("read /tmp/x") == {"data": "x"}


def test_plugin_mounts_env_and_preload(node: Node, probe: Path,
                                       allocation: Allocation) -> None:
    c = node.container("main", [PROBE], driver=probe, allocate=allocation.response(),
                       pod_env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "POD": "1"},
                       image_env={"NVIDIA_VISIBLE_DEVICES": "all", "IMAGE": "1"})
    p = c.start(interactive=True)

    def env(name: str) -> str | None:
        value: str | None = p.ask_json(f"env {name}")["value"]
        return value

    # image < plugin < pod
    assert env("NVIDIA_VISIBLE_DEVICES") == "GPU-fa4ecda0-0000-4000-8000-000000000000"
    assert env("CUDA_DEVICE_ORDER") == "FASTEST_FIRST"
    assert (env("POD"), env("IMAGE"), env("VGPUD_CONFIG")) == ("1", "1", "/etc/vgpud/config")
    assert env("LD_LIBRARY_PATH") == DRIVER_DIR
    # the read-only *file* mount is the host's file, in effect, and refuses writes
    assert p.ask_json("stat /etc/ld.so.preload")["ino"] == allocation.preload.stat().st_ino
    assert env("VGPUD_OCI_PRELOADED") == "1"
    assert p.ask_json("write /etc/ld.so.preload") == {"errno": errno.EROFS}
    assert p.ask_json(f"write {SHIM_DIR}/libpreload.so") == {"errno": errno.EROFS}
    # the read-only directory mount
    assert p.ask_json("read /etc/vgpud/config") == {"data": "version=1\n"}
    assert p.ask_json("write /etc/vgpud/config") == {"errno": errno.EROFS}
    assert p.ask_json("write /etc/vgpud/new") == {"errno": errno.EROFS}
    # the read-write state directory (Debian's /var/run -> /run)
    assert p.ask_json("write /var/run/vgpud/used") == {"ok": True}
    assert (allocation.state / "used").read_text() == "x"
    assert p.ask_json("read /run/vgpud/used") == {"data": "x"}
    assert [m.container for m in c.mounts] == [  # containerd's order: by depth, stable
        "/etc/ld.so.preload", "/etc/vgpud", DRIVER_DIR, "/var/run/vgpud",
        f"{SHIM_DIR}/libpreload.so"]


def test_unix_socket_in_read_only_mount_connects(node: Node, probe: Path) -> None:
    sock_dir = node.path("sock")
    with unix_server(sock_dir / "plugin.sock") as got:
        resp = pb.ContainerAllocateResponse(mounts=[
            pb.Mount(container_path="/var/run/vgpud-sock", host_path=str(sock_dir),
                     read_only=True),
            pb.Mount(container_path="/run/one.sock", host_path=str(sock_dir / "plugin.sock"),
                     read_only=True)])
        p = node.container("main", [PROBE], driver=probe, allocate=resp).start(
            interactive=True)
        assert p.ask_json("connect /var/run/vgpud-sock/plugin.sock") == {"reply": "pong"}
        assert p.ask_json("connect /run/one.sock") == {"reply": "pong"}  # a file mount
        assert got == ["ping\n", "ping\n"]
        assert p.ask_json("bind /var/run/vgpud-sock/new.sock") == {"errno": errno.EROFS}
        assert p.ask_json("write /var/run/vgpud-sock/x") == {"errno": errno.EROFS}


def test_driver_dir_and_shared_state_file(node: Node, probe: Path) -> None:
    shared = node.path("shared") / "fakecuda.state"
    shared.write_text("")
    a = node.container("a", [PROBE], driver=probe, extra_mounts=[Bind.same(shared)],
                       image_env={"FAKECUDA_STATE": str(shared)})
    b = node.container("b", [PROBE], driver=probe, extra_mounts=[Bind.same(shared)],
                       image_env={"FAKECUDA_STATE": str(shared)})
    pa, pb_ = a.start(interactive=True), b.start(interactive=True)
    assert pa.ask_json("env FAKECUDA_STATE") == {"value": str(shared)}
    assert pa.ask_json(f"write {shared}") == {"ok": True}
    assert pb_.ask_json(f"write {shared}") == {"ok": True}
    assert pa.ask_json(f"read {shared}") == {"data": "xx"}
    assert shared.read_text() == "xx"
    assert pa.ask_json(f"write {DRIVER_DIR}/new") == {"errno": errno.EROFS}


def test_devices_and_cdi(node: Node, probe: Path) -> None:
    resp = pb.ContainerAllocateResponse(
        devices=[pb.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/null",
                               permissions="rw")],
        cdi_devices=[pb.CdiDevice(name="nvidia.com/gpu=GPU-0")],
        annotations={"vgpud.io/test": "yes"})
    c = node.container("main", [PROBE], driver=probe, allocate=resp)
    assert c.cdi_devices == ("nvidia.com/gpu=GPU-0",)
    assert c.annotations["vgpud.io/test"] == "yes"
    assert {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"} in \
        c.spec["linux"]["resources"]["devices"]
    p = c.start(interactive=True)
    st = p.ask_json("stat /dev/nvidia0")
    assert stat.S_ISCHR(st["mode"]) and (st["rdev_major"], st["rdev_minor"]) == (1, 3)
    assert p.ask_json("write /dev/nvidia0") == {"ok": True}

    for host, message in (("/dev/nvidia-fake-missing", "does not exist"),
                          ("/etc/hostname", "not a device node")):
        bad = pb.ContainerAllocateResponse(devices=[pb.DeviceSpec(
            container_path="/dev/nvidia1", host_path=host, permissions="rw")])
        with pytest.raises(HarnessError, match=message):
            node.container(f"bad{len(message)}", [PROBE], allocate=bad)
    with pytest.raises(HarnessError, match="does not exist"):
        node.container("nomount", [PROBE], extra_mounts=[Bind(Path("/nonexistent"), "/x")])


def test_exec_shares_mounts_and_pid_namespace(node: Node, probe: Path,
                                              allocation: Allocation) -> None:
    c = node.container("main", [PROBE], driver=probe, allocate=allocation.response(),
                       pod_env={"POD": "1"})
    init = c.start(interactive=True)
    assert init.ask_json("write /var/run/vgpud/from-init") == {"ok": True}
    assert init.ask_json("write /tmp/from-init") == {"ok": True}
    other = c.spawn([PROBE], env={"POD": "exec"}, interactive=True)
    me = other.ask_json("id")
    assert me["pid"] != 1 and me["uid"] == 0
    assert other.ask_json("ns") == init.ask_json("ns")
    assert sorted(other.ask_json("procs")["pids"]) == [1, me["pid"]]
    assert other.ask_json("read /var/run/vgpud/from-init") == {"data": "x"}
    assert other.ask_json("read /tmp/from-init") == {"data": "x"}
    assert other.ask_json("write /etc/vgpud/x") == {"errno": errno.EROFS}
    assert other.ask_json("env POD") == {"value": "exec"}
    assert other.ask_json("env VGPUD_OCI_PRELOADED") == {"value": "1"}
    assert other.host_pid() in c.host_pids()
    other.send("exit 4")
    assert other.wait().returncode == 4
    done = c.exec(["/bin/sh", "-c", "echo $POD $CUDA_DEVICE_ORDER; id -u"], user=1000)
    assert done.check().stdout == "1 PCI_BUS_ID\n1000\n"


def test_user_option(node: Node, probe: Path) -> None:
    p = node.container("u", [PROBE], driver=probe, user=(1000, 1001)).start(interactive=True)
    me = p.ask_json("id")
    assert (me["uid"], me["gid"]) == (1000, 1001)
    assert p.ask_json("write /tmp/mine") == {"ok": True}
    done = node.run(["/usr/bin/id", "-u"], user=65534)
    assert done.check().stdout == "65534\n"


def test_stdin_streaming_and_exit_status(node: Node, probe: Path) -> None:
    c = node.container("main", [PROBE], driver=probe)
    p = c.start(interactive=True)
    for i in range(200):
        assert p.ask_json(f"env NOPE{i}") == {"value": None}
    assert p.ask("bogus") == '{"error":"unknown op"}'
    p.close_stdin()
    assert c.wait().returncode == 0
    with pytest.raises(EOFError, match="exit status 0"):
        p.readline(timeout=1)
    fed = node.run([PROBE], driver=probe, stdin="id\nexit 7\n")
    assert fed.returncode == 7 and json.loads(fed.stdout)["pid"] == 1


def test_kill_and_wait(node: Node) -> None:
    c = node.container("k", ["/bin/sh", "-c",
                             "trap 'exit 3' TERM; echo ready; while :; do sleep 0.02; done"])
    p = c.start()
    assert p.readline() == "ready"
    c.kill(signal.SIGTERM)
    assert c.wait(10).returncode == 3
    c.restart()
    assert c.process is not None and c.process.readline() == "ready"
    c.kill(signal.SIGKILL)
    assert c.wait(10).returncode == 128 + signal.SIGKILL


def test_restart_is_a_new_container_with_the_same_mounts(node: Node, probe: Path,
                                                         allocation: Allocation) -> None:
    c = node.container("main", [PROBE], driver=probe, allocate=allocation.response())
    p = c.start(interactive=True)
    assert p.ask_json("write /var/run/vgpud/kept") == {"ok": True}
    assert p.ask_json("write /tmp/lost") == {"ok": True}
    old_id, old_pid, old_path = c.id, c.host_pid(), c.cgroups_path
    p = c.restart(interactive=True)
    assert p.ask_json("id")["pid"] == 1
    assert p.ask_json("read /var/run/vgpud/kept") == {"data": "x"}
    assert p.ask_json("read /tmp/lost") == {"errno": errno.ENOENT}
    assert c.restarts == 1 and c.id != old_id and c.host_pid() != old_pid
    assert c.cgroups_path.rsplit("/", 1)[0] == old_path.rsplit("/", 1)[0]
    assert not any((d.parent / old_path.lstrip("/")).exists() for d in node.cgroup_dirs())
    assert c.state() is not None and c.state()["status"] == "running"  # type: ignore[index]


def test_cleanup_even_when_the_test_fails(runc: Runc) -> None:
    node = Node(runc)
    with pytest.raises(RuntimeError, match="boom"), node:
        c = node.container("main", ["/bin/sh", "-c", "sleep 60"])
        c.start()
        host_pid = c.host_pid()
        e = node.container("exec", ["/bin/sh", "-c", "sleep 60"])
        e.start()
        e.spawn(["/bin/sh", "-c", "sleep 60"])
        assert len(node.cgroup_dirs()) >= 1
        raise RuntimeError("boom")
    assert node.cgroup_dirs() == []
    assert not node.root.exists()
    with contextlib.suppress(FileNotFoundError):
        assert c.id not in Path(f"/proc/{host_pid}/cgroup").read_text()


def test_unusable_runc_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "runc"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "runc version fake"; exit 0; }\n'
                    'echo "fake runc cannot run containers" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setattr(runtime, "find_runc", lambda: str(fake))
    with pytest.raises(RuncUnavailable) as e:
        runtime.obtain_runc(install=False)
    if os.geteuid() == 0:
        assert "cannot run a trivial container" in str(e.value)
        assert "fake runc cannot run containers" in str(e.value)
    monkeypatch.setattr(runtime, "find_runc", lambda: None)
    with pytest.raises(RuncUnavailable, match="not installed"):
        runtime.obtain_runc(install=False)
