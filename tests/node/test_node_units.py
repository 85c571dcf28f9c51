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

from tests.kube.clocks import ManualClock
from vgpud.node import procfs
from vgpud.node.registration import (
    KNOWN_ENV,
    OTHER_ENV,
    Claim,
    Registered,
    Registrar,
    Registry,
    SocketOwner,
    judge,
    parse_claim,
)
from vgpud.node.watchdog import Kill, Report, Usage, Watchdog, Watched, usage, victims

MIB = 1 << 20
OWNER = SocketOwner("k1", "ns", "p", "main", "1234-abcd")
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


def fake_proc(tmp_path: Path, *keys: str) -> tuple[Path, list[Path]]:
    """A /proc tree where this process is in OWNER's pod, with the directory of each of
    ``keys``' allocations mounted; (the tree, those directories)."""
    me = os.getpid()
    proc = tmp_path / "proc"
    (proc / str(me)).mkdir(parents=True)
    (proc / str(me) / "stat").write_text(f"{me} (python) S " + " ".join(["0"] * 18) + " 5 0\n")
    (proc / str(me) / "cgroup").write_text(POD_CG)
    (proc / str(me) / "status").write_text(f"Name:\tpython\nNSpid:\t{me}\n")
    dirs = [tmp_path / k / "etc" for k in keys]
    for d in dirs:
        d.mkdir(parents=True)
    (proc / str(me) / "mountinfo").write_text("".join(
        f"{23 + i} 22 8:1 {d} /etc/vgpud ro - ext4 x rw\n" for i, d in enumerate(dirs)))
    return proc, dirs


def register(sock: Path, ignored: str = "-") -> str:
    """One registration, as the shim makes it (blocking: run it in a thread)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(f"vgpud-register 1 pid=1 start=1 slot=0 ignored={ignored}\n".encode())
        return s.recv(200).decode()


@pytest.mark.anyio
async def test_registration_round_trip_uses_the_kernels_pid(tmp_path: Path) -> None:
    """The peer's PID comes from SO_PEERCRED, its cgroup from (here, a fake) /proc; the
    claim in the request does not matter. Prints the round-trip latency."""
    me = os.getpid()
    proc, (alloc,) = fake_proc(tmp_path, "k1")
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
        registrar.set_owner("k1", SocketOwner("k1", "ns", "q", "main", "other-uid"))
        (refused,), _ = await anyio.to_thread.run_sync(client, 1)
        tg.cancel_scope.cancel()
    assert set(answers) == {f"ok {me}\n"}  # the kernel's PID, not the claimed 1
    assert refused.startswith("refused process") and "ns/q" in refused
    assert registry.by_pid[me].start_time == 5 and registry.refused == 1
    times.sort()
    print(f"registration round trip: p50 {times[25] * 1e3:.2f} ms, "
          f"max {times[-1] * 1e3:.2f} ms")


@pytest.mark.anyio
async def test_made_up_variable_names_make_no_series(tmp_path: Path) -> None:
    """Every VGPUD_* name a registration gave became a label of
    vgpud_container_env_ignored_total, forever (2,000 registrations made 14,000 series).
    Only the names the shim reads are counted by name; any other is ``other``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from vgpud.node.allocations import AllocationStore
    from vgpud.node.devices import NodeDevices
    from vgpud.node.metrics import NodeCollector

    proc, (alloc,) = fake_proc(tmp_path, "k1")
    registry = Registry()
    registrar = Registrar(registry, proc=proc)

    def flood(n: int) -> set[str]:
        return {register(alloc / "register.sock", ",".join(
            [f"VGPUD_MADE_UP_{i}_{j}" for j in range(7)] + ["VGPUD_MEMORY_LIMIT_3"]))
            for i in range(n)}

    async with anyio.create_task_group() as tg:
        await tg.start(registrar.run)
        await registrar.open("k1", alloc, OWNER)
        answers = await anyio.to_thread.run_sync(flood, 200)
        tg.cancel_scope.cancel()
    assert answers == {f"ok {os.getpid()}\n"}  # made-up names do not cost a registration
    assert registry.ignored_env == {"VGPUD_MEMORY_LIMIT_3": 200, OTHER_ENV: 200}
    assert "VGPUD_MEMORY_LIMIT_15" in KNOWN_ENV and "VGPUD_MEMORY_LIMIT_16" not in KNOWN_ENV
    assert parse_claim("vgpud-register 1 pid=1 ignored=VGPUD_X,VGPUD_CONFIG,VGPUD_X,VGPUD_Y"
                       ) == Claim(1, 0, -1, ("VGPUD_CONFIG",), 2)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector("n1", NodeDevices((), split=1, memory_scaling=1.0,
                                                   core_scaling=1.0),
                                 AllocationStore(tmp_path / "state"), dict,
                                 lambda state, uuids: None, registry=registry))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    env = fams["vgpud_container_env_ignored"].samples
    assert sorted(s.labels["variable"] for s in env if s.name.endswith("_total")) == [
        "VGPUD_MEMORY_LIMIT_3", OTHER_ENV]


@pytest.mark.anyio
async def test_connections_past_the_bound_are_refused_at_once(tmp_path: Path) -> None:
    """800 idle clients held 1,610 descriptors. Past ``max_connections`` a connection is
    answered ``refused busy`` and closed at once, while those already open are served;
    once they are done the socket serves again."""
    proc, (alloc,) = fake_proc(tmp_path, "k1")
    registry = Registry()
    registrar = Registrar(registry, proc=proc, max_connections=4, read_timeout=30)
    sock = str(alloc / "register.sock")
    me = os.getpid()
    async with anyio.create_task_group() as tg:
        await tg.start(registrar.run)
        await registrar.open("k1", alloc, OWNER)
        idle = [await anyio.connect_unix(sock) for _ in range(4)]  # accepted in turn
        with anyio.fail_after(1):
            extra = await anyio.connect_unix(sock)
            answer = await extra.receive()
            assert answer.startswith(b"refused busy: 4 registrations"), answer
            with pytest.raises(anyio.EndOfStream):
                await extra.receive()  # and closed: its descriptor is given back
            await extra.aclose()
            for s in idle:  # the first four are still served
                await s.send(b"vgpud-register 1 pid=1 start=1 slot=0 ignored=-\n")
                assert await s.receive() == f"ok {me}\n".encode()
                await s.aclose()
            # a new client is served once those are done (their handlers end just after
            # their answers: it may have to try again, as the shim does)
            while (reply := await anyio.to_thread.run_sync(
                    register, alloc / "register.sock")) != f"ok {me}\n":
                assert reply.startswith("refused busy"), reply
        tg.cancel_scope.cancel()
    assert registry.accepted == 5


@pytest.mark.anyio
async def test_an_idle_client_is_dropped_after_the_timeout(tmp_path: Path) -> None:
    """A client that connects and says nothing is told so and closed after
    ``read_timeout`` (it was closed without a word); the socket keeps serving."""
    proc, (alloc,) = fake_proc(tmp_path, "k1")
    registry = Registry()
    registrar = Registrar(registry, proc=proc, read_timeout=0.2)
    async with anyio.create_task_group() as tg:
        await tg.start(registrar.run)
        await registrar.open("k1", alloc, OWNER)
        with anyio.fail_after(1.5):
            idle = await anyio.connect_unix(str(alloc / "register.sock"))
            assert await idle.receive() == b"refused no request line within 0.2 s\n"
            with pytest.raises(anyio.EndOfStream):
                await idle.receive()
        assert (await anyio.to_thread.run_sync(register, alloc / "register.sock")
                ).startswith("ok ")
        tg.cancel_scope.cancel()
    assert (registry.accepted, registry.refused) == (1, 1)


@pytest.mark.anyio
async def test_ignored_variable_events_are_paced_per_allocation(tmp_path: Path) -> None:
    """Each registration that gave ignored names posted an event. Now a token bucket per
    allocation on the injected clock: a burst, then one per period, each saying how many
    were held back; every registration is still counted."""
    proc, (a1, a2) = fake_proc(tmp_path, "k1", "k2")
    registry = Registry()
    clock = ManualClock()
    events: list[tuple[str, int]] = []

    async def notify(owner: SocketOwner, r: Registered, held: int = 0) -> None:
        events.append((r.key, held))

    registrar = Registrar(registry, proc=proc, on_ignored_env=notify, clock=clock,
                          report_burst=2, report_every=60.0)

    def registrations(sock: Path, n: int) -> None:
        for _ in range(n):
            assert register(sock, "VGPUD_CONFIG").startswith("ok ")

    async with anyio.create_task_group() as tg:
        await tg.start(registrar.run)
        await registrar.open("k1", a1, OWNER)
        await registrar.open("k2", a2, SocketOwner("k2", "ns", "p", "side", "1234-abcd"))
        await anyio.to_thread.run_sync(registrations, a1 / "register.sock", 20)
        assert events == [("k1", 0), ("k1", 0)]
        await anyio.to_thread.run_sync(registrations, a2 / "register.sock", 1)
        assert events[2:] == [("k2", 0)]  # each allocation has its own bucket
        clock.advance(59)
        await anyio.to_thread.run_sync(registrations, a1 / "register.sock", 1)
        clock.advance(1)
        await anyio.to_thread.run_sync(registrations, a1 / "register.sock", 1)
        assert events[3:] == [("k1", 19)]  # one per minute, with the count held back
        tg.cancel_scope.cancel()
    assert registry.ignored_env == {"VGPUD_CONFIG": 23}


def test_registered_processes_are_bounded_per_allocation() -> None:
    r = Registry(max_processes=3)
    for pid in range(10, 20):
        r.add(Registered("k1", pid, 7, "/cg1", Claim(pid, 7, 0, ())))
    r.add(Registered("k2", 99, 7, "/cg2", Claim(1, 7, 0, ())))
    assert sorted(r.by_pid) == [17, 18, 19, 99]  # the latest three of k1
    r.add(Registered("k2", 19, 7, "/cg2", Claim(1, 7, 0, ())))  # a PID reused elsewhere
    r.forget("k1")
    assert sorted(r.by_pid) == [19, 99] and r.accepted == 12
