"""PID namespaces: process lists as newer drivers report them (the caller's namespace),
host pids learnt from the FAKECUDA_HOST_PID_SOCK oracle for processes in real containers,
and dead-process reaping that only judges the slots a process can see."""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import time
from typing import IO, Any

import pytest

from tests.fakes.hostpid import HostPidOracle

from .conftest import IN_NEW_PID_NS, MIB, Fake

CTX = 300 * MIB
NEW_DRIVER = {"FAKECUDA_NVML_DRIVER_VERSION": "560.35.03"}


def v3(probe_reply: dict[str, Any]) -> dict[str, int]:
    procs: dict[str, int] = probe_reply["v3"]["procs"]
    assert probe_reply["v2"]["procs"] == procs and probe_reply["v1"]["procs"] == procs
    return procs


# ---- simulated containers: FAKECUDA_HOST_PID_OFFSET ----
@pytest.mark.parametrize("driver", ["550.144.03", "560.35.03"])
def test_process_lists_by_driver_version(fake: Fake, driver: str) -> None:
    fake.env["FAKECUDA_NVML_DRIVER_VERSION"] = driver
    a = fake.start("viaproc", env={"FAKECUDA_HOST_PID_OFFSET": "100000"})
    b = fake.start("direct", env={"FAKECUDA_HOST_PID_OFFSET": "200000"})
    a.ok("alloc 0 1g")
    b.ok("alloc 0 512m")
    for p in (a, b):
        p.ok("kernel 20000000")
        p.ok("launch 1 1")
    host_a, host_b = str(a.pid + 100000), str(b.pid + 200000)
    in_a = fake.nvml(env={"FAKECUDA_HOST_PID_OFFSET": "100000"})
    on_host = fake.nvml()
    assert in_a.do("driver") == {"driver": driver}
    from_a, from_host = v3(in_a.do("procs 0")), v3(on_host.do("procs 0"))
    assert from_host == {host_a: CTX + 1024 * MIB, host_b: CTX + 512 * MIB}
    if driver.startswith("560"):
        # the caller's namespace: a by its own pid, b not visible from a's namespace
        assert from_a == {str(a.pid): CTX + 1024 * MIB}
    else:
        assert from_a == from_host  # host pids whatever the caller
    # process utilisation keeps reporting host pids, whatever the driver
    time.sleep(0.25)
    util = in_a.do("util 0 0")["samples"]
    assert set(util) == {host_a, host_b}


def test_same_offset_is_the_same_namespace(fake: Fake) -> None:
    fake.env.update(NEW_DRIVER, FAKECUDA_HOST_PID_OFFSET="100000")
    a, b = fake.start("viaproc"), fake.start("direct")
    a.ok("alloc 0 1m")
    b.ok("use 0")
    got = v3(fake.nvml().do("procs 0"))
    assert set(got) == {str(a.pid), str(b.pid)}


# ---- real containers: the host-PID oracle ----
def test_oracle_gives_the_real_host_pid(
    fake: Fake, pid_namespaces: None, oracle: HostPidOracle
) -> None:
    fake.env["FAKECUDA_HOST_PID_SOCK"] = str(oracle.path)
    c = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    got = c.ok("hostpid")
    assert got["pid"] == 1  # init of its own namespace
    inner = [int(x) for x in subprocess.check_output(["pgrep", "-P", str(c.pid)]).split()]
    assert got["hostpid"] == inner[0] != c.pid  # the child unshare forked, as the host sees it
    assert oracle.answers == [inner[0]]
    c.ok("alloc 0 1g")
    # the host sees it by its host pid; host processes learn theirs (= their pid) too
    got = v3(fake.nvml().do("procs 0"))
    assert got == {str(inner[0]): CTX + 1024 * MIB}
    h = fake.start("direct")
    assert h.ok("hostpid")["hostpid"] == h.pid
    # an offset does not apply to an oracle's answer
    o = fake.start("direct", env={"FAKECUDA_HOST_PID_OFFSET": "5000"})
    assert o.ok("hostpid")["hostpid"] == o.pid


def test_oracle_unreachable_falls_back_with_a_message(fake: Fake) -> None:
    fake.env["FAKECUDA_HOST_PID_SOCK"] = "/nonexistent/hostpid.sock"
    fake.env["FAKECUDA_HOST_PID_OFFSET"] = "7"
    out = subprocess.run(
        [str(fake.build / "direct"), "hostpid; alloc 0 1m"],
        env=fake.env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert '"rc":0' in lines[1]
    pid = int(lines[0].split('"pid":')[1].rstrip("}"))
    assert f'"hostpid":{pid + 7}' in lines[0]
    assert "FAKECUDA_HOST_PID_SOCK=/nonexistent/hostpid.sock" in out.stderr
    assert "No such file or directory" in out.stderr


def test_namespace_pids_in_real_containers(
    fake: Fake, pid_namespaces: None, oracle: HostPidOracle
) -> None:
    fake.env.update(NEW_DRIVER, FAKECUDA_HOST_PID_SOCK=str(oracle.path))
    a = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    b = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    ha, hb = a.ok("hostpid")["hostpid"], b.ok("hostpid")["hostpid"]
    a.ok("alloc 0 1g")
    b.ok("alloc 0 2g")  # both are pid 1 in their namespaces: two slots all the same
    assert v3(fake.nvml().do("procs 0")) == {
        str(ha): CTX + 1024 * MIB,
        str(hb): CTX + 2048 * MIB,
    }
    # from inside a's namespace: a is pid 1, b is not there
    in_a = fake.nvml(wrap=("nsenter", "-t", str(ha), "-p", "-m"))
    assert in_a.do("pid")["pid"] != 1
    assert v3(in_a.do("procs 0")) == {"1": CTX + 1024 * MIB}


# ---- reaping across namespaces ----
def test_containers_do_not_reap_each_other(
    fake: Fake, pid_namespaces: None, oracle: HostPidOracle
) -> None:
    fake.env["FAKECUDA_HOST_PID_SOCK"] = str(oracle.path)
    a = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    b = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    c = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    ha = a.ok("hostpid")["hostpid"]
    a.ok("alloc 0 1g")
    b.ok("alloc 0 1g")
    full = 2 * CTX + 2048 * MIB
    # c is pid 1 too, and no pid of a or b exists in c's namespace: it must not judge them
    assert c.used() == full
    time.sleep(0.05)  # past the 20 ms reap interval
    assert c.used() == full
    h = fake.start("direct")  # the host sees every process by its host pid: all alive
    assert h.used() == full
    os.kill(ha, signal.SIGKILL)  # a dies
    time.sleep(0.05)
    assert c.used() == full  # c cannot see that a died: it leaves a's slot alone
    assert h.used() == CTX + 1024 * MIB  # the host reaps it
    assert c.used() == CTX + 1024 * MIB
    assert b.used() == CTX + 1024 * MIB


def test_simulated_containers_reap_each_other(fake: Fake) -> None:
    # offsets only: one real namespace, where every pid is visible
    a = fake.start("viaproc", env={"FAKECUDA_HOST_PID_OFFSET": "100000"})
    b = fake.start("viaproc", env={"FAKECUDA_HOST_PID_OFFSET": "200000"})
    a.ok("alloc 0 1g")
    b.ok("use 0")
    assert b.used() == 2 * CTX + 1024 * MIB
    a.kill()
    assert b.used() == CTX


def test_robust_lock_across_pid_namespaces(
    fake: Fake, pid_namespaces: None, oracle: HostPidOracle
) -> None:
    # processes in other PID namespaces killed while launching (they take the state lock
    # thousands of times a second): the robust mutex is released by the kernel for them too
    fake.env["FAKECUDA_HOST_PID_SOCK"] = str(oracle.path)
    fake.env["FAKECUDA_LAUNCH_NS"] = "1"
    loops = [fake.start("viaproc", wrap=IN_NEW_PID_NS) for _ in range(3)]
    for p in loops:
        p.ok("kernel 0")
        assert p.proc.stdin
        p.proc.stdin.write("launchfor 5000 1\n")
        p.proc.stdin.flush()
    time.sleep(0.3)
    for p in loops:
        p.proc.send_signal(signal.SIGKILL)  # unshare --kill-child: its child dies too
        p.proc.wait()
    time.sleep(0.1)
    out = fake.run(
        "direct", "alloc 0 1m; launch 10 100; sync; fake_device_used_bytes 0", timeout=10
    )
    assert [o["rc"] for o in out] == [0, 0, 0, 0]
    assert out[3]["value"] == CTX + MIB  # and the dead ones were reaped by the host


def _inner_pid(wrapped: subprocess.Popen[str]) -> int:
    """The program's host pid under IN_NEW_PID_NS (unshare's only child)."""
    children = pathlib.Path(f"/proc/{wrapped.pid}/task/{wrapped.pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.01)
    raise AssertionError("unshare started no child")


def _wait_blocked_in_lock(pid: int, answer: IO[str] | None = None) -> None:
    """Until pid sleeps in the state lock's syscall (fcntl; futex for a pthread mutex);
    answer: its stdout, where a reply means it took the lock without waiting."""
    waiting = {"72", "202"}  # x86_64: fcntl, futex
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        nr = pathlib.Path(f"/proc/{pid}/syscall").read_text().split()[0]
        if nr in waiting:
            return
        if answer and select.select([answer], [], [], 0.01)[0]:
            raise AssertionError(f"took the lock another process holds: {answer.readline()}")
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never waited for the state lock")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers are x86_64's")
def test_a_waiter_killed_in_another_namespace_does_not_steal_the_lock(
    fake: Fake, pid_namespaces: None
) -> None:
    # two containers' first processes: both pid 1, each in its own namespace.  One holds
    # the state lock; the other waits for it and is killed.  A robust pthread mutex knows
    # its owner by namespace-relative TID: the kernel, cleaning up after the killed waiter,
    # sees "owner 1 == me" and releases the lock the other container still holds.
    holder = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    waiter = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    assert holder.ok("pid")["pid"] == waiter.ok("pid")["pid"] == 1
    assert holder.ok("fake_state_lock")["value"] > 0
    assert waiter.proc.stdin
    waiter.proc.stdin.write("fake_state_lock\n")
    waiter.proc.stdin.flush()
    _wait_blocked_in_lock(_inner_pid(waiter.proc))
    waiter.proc.send_signal(signal.SIGKILL)  # unshare --kill-child: its child dies too
    waiter.proc.wait()
    host = fake.start("direct")
    assert host.proc.stdin and host.proc.stdout
    host.proc.stdin.write("fake_state_lock\n")
    host.proc.stdin.flush()
    _wait_blocked_in_lock(host.pid, host.proc.stdout)
    released = holder.ok("fake_state_unlock")["value"]
    acquired = json.loads(host.proc.stdout.readline())
    assert acquired["rc"] == 0
    assert acquired["value"] >= released


def test_a_holder_killed_holding_the_lock_lets_the_next_one_in(
    fake: Fake, pid_namespaces: None
) -> None:
    # the lock word names its holder by lock id; the holder's liveness byte (an OFD lock
    # the kernel drops with the process) says it is gone, and a waiter takes the word over
    holder = fake.start("viaproc", wrap=IN_NEW_PID_NS)
    assert holder.ok("fake_state_lock")["value"] > 0
    host = fake.start("direct")
    assert host.proc.stdin and host.proc.stdout
    host.proc.stdin.write("fake_state_lock\n")
    host.proc.stdin.flush()
    _wait_blocked_in_lock(host.pid, host.proc.stdout)
    killed = time.monotonic()
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    acquired = json.loads(host.proc.stdout.readline())
    assert acquired["rc"] == 0 and time.monotonic() - killed < 5
    assert host.ok("fake_state_unlock")["value"] >= acquired["value"]
    assert host.ok("alloc 0 1m")["rc"] == 0  # and the state works on
