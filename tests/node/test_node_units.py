"""vgpud.node's decisions without containers: registration claims and verdicts, the
registry's mapping of GPU processes, the watchdog's incidents, and one registrar round
trip over a real unix socket (the kernel's SO_PEERCRED) against a fake /proc tree."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import anyio
import pytest

from vgpud.node import procfs
from vgpud.node.registration import (
    Claim,
    Owner,
    Registered,
    Registrar,
    Registry,
    judge,
    parse_claim,
)
from vgpud.node.watchdog import Kill, Report, Usage, Watchdog, Watched, usage, victims

MIB = 1 << 20
OWNER = Owner("k1", "ns", "p", "main", "1234-abcd")
POD_CG = "0::/kubepods/besteffort/pod1234-abcd/ctr-1\n"
ALLOC = Path("/var/lib/vgpud/allocations/k1/etc")
# /proc/<pid>/mountinfo of a process of the allocation's container: /etc/vgpud is a bind
# of the allocation's directory (its root is a path within the host filesystem)
MOUNTINFO = ("22 1 0:21 / / rw - overlay overlay rw\n"
             "23 22 8:1 /var/lib/vgpud/allocations/k1/etc /etc/vgpud ro - ext4 /dev/sda1 rw\n"
             "24 22 8:1 /var/lib/vgpud/allocations/k1/state /var/run/vgpud rw - ext4 /dev/sda1 "
             "rw\n")
MINE = ("/", "/var/lib/vgpud/allocations/k1/etc", "/var/lib/vgpud/allocations/k1/state")


def facts(pid: int = 42, cg: str = POD_CG, start: int = 7) -> procfs.ProcessFacts:
    return procfs.ProcessFacts(pid, start, procfs.cgroup_path(cg), cg, (pid, 1))


def test_claims_are_parsed_and_malformed_ones_named() -> None:
    got = parse_claim("vgpud-register 1 pid=1 start=99 slot=3 ignored=VGPUD_CONFIG,PATH\n")
    assert got == Claim(1, 99, 3, ("VGPUD_CONFIG",))  # only VGPUD_* names are kept
    assert parse_claim("vgpud-register 1 pid=7 start=1 slot=0 ignored=-") == Claim(7, 1, 0, ())
    for bad in ("", "hello", "vgpud-register 2 pid=1", "vgpud-register 1 pid=x"):
        assert isinstance(parse_claim(bad), str)


def test_a_process_is_accepted_only_in_its_allocations_pod() -> None:
    claim = Claim(1, 7, 0, ())
    ok = judge(OWNER, facts(), claim, MINE, ALLOC)
    assert isinstance(ok, Registered) and ok.host_pid == 42 and ok.cgroup.endswith("ctr-1")
    systemd = "0::/kubepods.slice/kubepods-besteffort.slice/" \
              "kubepods-besteffort-pod1234_abcd.slice/cri-containerd-x.scope\n"
    assert isinstance(judge(OWNER, facts(cg=systemd), claim, MINE, ALLOC), Registered)
    other = judge(OWNER, facts(cg="0::/kubepods/besteffort/pod9999/ctr\n"), claim, MINE, ALLOC)
    assert isinstance(other, str) and "not in pod ns/p's cgroup" in other
    assert "PreStartContainer" in str(judge(None, facts(), claim, MINE, ALLOC))
    assert "gone" in str(judge(OWNER, None, claim, MINE, ALLOC))
    assert "gone" in str(judge(OWNER, facts(), claim, None, ALLOC))


def test_a_process_of_another_container_of_the_pod_is_refused() -> None:
    """Issue 22, finding 17: a sidecar of the same pod (same pod cgroup) reaching the
    socket through /proc/<pid>/root, with process namespace sharing, registered as the
    GPU container. Its mount namespace has no bind of the allocation's directory."""
    claim = Claim(1, 7, 0, ())
    sidecar = ("/", "/var/lib/kubelet/pods/1234-abcd/volumes/kubernetes.io~empty-dir/x")
    verdict = judge(OWNER, facts(cg="0::/kubepods/besteffort/pod1234-abcd/ctr-2\n"), claim,
                    sidecar, ALLOC)
    assert isinstance(verdict, str) and "not in container 'main' of pod ns/p" in verdict
    other_alloc = ("/", "/var/lib/vgpud/allocations/k2/etc")  # another GPU container's
    assert isinstance(judge(OWNER, facts(), claim, other_alloc, ALLOC), str)
    # the root is a path within the filesystem the directory lives on (here a tmpfs
    # mounted at /var/lib/vgpud): matched by the directory's last two names
    assert isinstance(judge(OWNER, facts(), claim, ("/", "/allocations/k1/etc"), ALLOC),
                      Registered)


def test_mountinfo_is_read_with_its_escapes(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "mountinfo").write_text(
        MOUNTINFO + "25 22 8:1 /a\\040dir/k1/etc /x ro - ext4 /dev/sda1 rw\n")
    roots = procfs.mount_roots(7, tmp_path)
    assert roots is not None and roots[:2] == ("/", "/var/lib/vgpud/allocations/k1/etc")
    assert roots[-1] == "/a dir/k1/etc"
    assert procfs.mount_roots(8, tmp_path) is None


def test_the_registry_maps_gpu_processes_by_registration_then_cgroup() -> None:
    r = Registry()
    r.add(Registered("k1", 42, 7, "/kubepods/pod1/ctr-1", Claim(1, 7, 0, ("VGPUD_CONFIG",))))
    assert r.allocation_of(42, facts(42, start=7)) == "k1"
    assert r.allocation_of(42, facts(42, cg="0::/x\n", start=8)) is None  # a reused PID
    # an unregistered process in the same container (a static binary, no shim)
    assert r.allocation_of(77, facts(77, cg="0::/kubepods/pod1/ctr-1\n")) == "k1"
    assert r.ignored_env == {"VGPUD_CONFIG": 1} and r.accepted == 1
    r.forget("k1")
    assert r.allocation_of(42, facts(42, start=7)) is None


def test_the_watchdog_reports_once_per_incident_and_kills_the_largest_first() -> None:
    watched = {"k1": Watched(OWNER, {"GPU-0": 1024 * MIB})}
    procs = [(1, 700 * MIB), (2, 500 * MIB), (3, 100 * MIB)]
    found = usage(watched, [_proc("GPU-0", p, b) for p, b in procs], lambda pid: "k1")
    (u,) = found
    assert u.used == 1300 * MIB and u.over == 276 * MIB
    assert victims(u) == [1]  # 700 MiB gone: 600 left, under the limit
    w = Watchdog(Registry(), lambda: watched, action="kill", grace=5.0, tolerance=32 * MIB)
    assert w.decide(0.0, found) == []  # over, but within the grace period
    acts = w.decide(5.0, found)
    assert acts == [Report(u), Kill(u, (1,))]
    assert w.decide(6.0, found) == [Kill(u, (1,))]  # reported once, killed while it lasts
    assert w.decide(7.0, []) == [] and w.over == []  # back under: the incident is over
    assert w.decide(8.0, found) == []  # a new incident has its own grace period
    small = Usage("k1", "GPU-0", 1024 * MIB + 31 * MIB, 1024 * MIB, ((1, 1055 * MIB),))
    assert Watchdog(Registry(), lambda: watched, grace=0).decide(0, [small]) == []  # tolerance


def _proc(uuid: str, pid: int, b: int):  # type: ignore[no-untyped-def]
    from vgpud.node.watchdog import GpuProcess
    return GpuProcess(uuid, pid, b)


@pytest.mark.anyio
async def test_registration_round_trip_uses_the_kernels_pid(tmp_path: Path) -> None:
    """The peer's PID comes from SO_PEERCRED, its cgroup from (here, a fake) /proc; the
    claim in the request does not matter. Prints the round-trip latency."""
    me = os.getpid()
    proc = tmp_path / "proc"
    (proc / str(me)).mkdir(parents=True)
    (proc / str(me) / "stat").write_text(f"{me} (python) S " + " ".join(["0"] * 18) + " 5 0\n")
    (proc / str(me) / "cgroup").write_text(POD_CG)
    (proc / str(me) / "status").write_text(f"Name:\tpython\nNSpid:\t{me}\n")
    alloc = tmp_path / "k1" / "etc"
    alloc.mkdir(parents=True)
    (proc / str(me) / "mountinfo").write_text(f"23 22 8:1 {alloc} /etc/vgpud ro - ext4 x rw\n")
    registry = Registry()
    registrar = Registrar(registry, proc=proc)
    async with anyio.create_task_group() as tg:
        await tg.start(registrar.run)
        await registrar.open("k1", alloc, OWNER)

        def client(n: int) -> tuple[list[str], list[float]]:
            answers, times = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(alloc / "register.sock"))
                    s.sendall(b"vgpud-register 1 pid=1 start=1 slot=0 ignored=-\n")
                    answers.append(s.recv(100).decode())
                times.append(time.perf_counter() - t0)
            return answers, times

        answers, times = await anyio.to_thread.run_sync(client, 50)
        registrar.set_owner("k1", Owner("k1", "ns", "q", "main", "other-uid"))
        (refused,), _ = await anyio.to_thread.run_sync(client, 1)
        tg.cancel_scope.cancel()
    assert set(answers) == {f"ok {me}\n"}  # the kernel's PID, not the claimed 1
    assert refused.startswith("refused process") and "ns/q" in refused
    assert registry.by_pid[me].start_time == 5 and registry.refused == 1
    times.sort()
    print(f"registration round trip: p50 {times[25] * 1e3:.2f} ms, "
          f"max {times[-1] * 1e3:.2f} ms")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
