"""GPUs that come and go (NVML side): FAKECUDA_ABSENT and the lost / remove / add / replace
lines of FAKECUDA_EVENTS, seen as the real NVML sees them: through a device list fixed at
nvmlInit (reference counted) until the last nvmlShutdown."""

from __future__ import annotations

import pathlib
from typing import Any

from tests.fakes_selftest.conftest import NVML_PRELUDE, Fake

GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST (nvml.h)
NOT_FOUND = 6
INVALID_ARGUMENT = 2
UNINITIALIZED = 1
TIMEOUT = 10


def uuid(dev: int, gen: int = 0) -> str:
    return f"GPU-fa4ecda0-{gen:04x}-4000-8000-{dev:012x}"


PRELUDE = NVML_PRELUDE


def lost(code: Any) -> bool:
    return code == {"code": GPU_IS_LOST}


def write(fake: Fake, *lines: str) -> None:
    with open(fake.env["FAKECUDA_EVENTS"], "a") as f:
        f.writelines(line + "\n" for line in lines)


def test_lost_gpu_answers_gpu_is_lost_and_raises_xid_79(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096"
    fake.env["LOST_UUID"] = uuid(1)
    out = fake.python(
        PRELUDE
        + """
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h[1], n.nvmlEventTypeXidCriticalError, s)
event("lost 1")
e = n.nvmlEventSetWait_v2(s, 2000)
again = n.nvmlDeviceGetHandleByIndex(1)
print(json.dumps({
    "event": [addr(e.device) == addr(h[1]), e.eventType, e.eventData],
    "count": n.nvmlDeviceGetCount(),
    "same_handle": addr(again) == addr(h[1]),
    "uuid": val(n.nvmlDeviceGetUUID, h[1]),
    "name": val(n.nvmlDeviceGetName, h[1]),
    "index": val(n.nvmlDeviceGetIndex, h[1]),
    "minor": val(n.nvmlDeviceGetMinorNumber, h[1]),
    "memory": val(lambda: n.nvmlDeviceGetMemoryInfo(h[1]).total),
    "procs": val(lambda: len(n.nvmlDeviceGetComputeRunningProcesses(h[1]))),
    "by_uuid": val(lambda: n.nvmlDeviceGetHandleByUUID(os.environ["LOST_UUID"]) and 0),
    "register": val(n.nvmlDeviceRegisterEvents, h[1], n.nvmlEventTypeXidCriticalError, s),
    "others": [val(n.nvmlDeviceGetUUID, h[0]), val(n.nvmlDeviceGetIndex, h[2])],
}))
"""
    )
    assert out["event"] == [True, 8, 79]  # nvmlEventTypeXidCriticalError, Xid 79
    assert out["count"] == 3 and out["same_handle"]  # still on the bus until removed
    for query in ("uuid", "name", "index", "minor", "memory", "procs", "by_uuid", "register"):
        assert lost(out[query]), (query, out[query])
    assert out["others"] == [uuid(0), 2]


def test_remove_add_replace(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096,2048"
    nv = fake.nvml()
    assert nv.do("hold old 1") == {}
    assert nv.do("hold last 3") == {}
    before = nv.do("list")
    assert [d["uuid"] for d in before["devices"]] == [uuid(d) for d in range(4)]

    write(fake, "remove 1")
    during = nv.do("list")  # the session's list is fixed: GPU 1 still counts, lost
    assert during["count"] == 4 and lost(during["devices"][1]["uuid"])
    assert [d["uuid"] for k, d in enumerate(during["devices"]) if k != 1] == [
        uuid(0), uuid(2), uuid(3)]
    assert lost(nv.do(f"hold x {uuid(1)}"))
    old = nv.do("ask old")
    assert all(lost(old[k]) for k in ("uuid", "index", "minor", "name", "memory")), old
    assert nv.do("ask last")["index"] == 3

    assert nv.do("reinit") == {}
    after = nv.do("list")
    assert after["count"] == 3
    # later devices shift down; minors (/dev/nvidiaN) do not renumber
    assert [(d["uuid"], d["index"], d["minor"]) for d in after["devices"]] == [
        (uuid(0), 0, 0),
        (uuid(2), 1, 2),
        (uuid(3), 2, 3),
    ]
    assert nv.do(f"hold x {uuid(1)}") == {"code": NOT_FOUND}
    stale = nv.do("ask last")  # a handle of the session before: not to be used
    assert all(stale[k] == {"code": INVALID_ARGUMENT} for k in ("uuid", "index", "memory"))
    assert nv.do("hold x 3") == {"code": INVALID_ARGUMENT}  # past the end now

    write(fake, "add 1")
    assert nv.do("count") == {"count": 3}  # not before the next session
    assert nv.do(f"hold x {uuid(1)}") == {"code": NOT_FOUND}
    assert nv.do("reinit") == {}
    assert nv.do("hold one 1") == {} and nv.do("hold last 3") == {}
    assert nv.do("ask one")["uuid"] == uuid(1)  # the same board is back
    assert nv.do("ask last")["index"] == 3

    write(fake, "replace 1")
    assert lost(nv.do("ask one")["uuid"])  # the board the session knew is gone
    assert nv.do(f"hold x {uuid(1, gen=1)}") == {"code": NOT_FOUND}
    assert nv.do("reinit") == {} and nv.do("hold one 1") == {}
    new = nv.do("ask one")
    assert new["uuid"] == uuid(1, gen=1) and new["index"] == 1 and new["minor"] == 1
    assert nv.do(f"hold x {uuid(1)}") == {"code": NOT_FOUND}
    assert nv.do(f"hold x {uuid(1, gen=1)}") == {}


def test_init_and_shutdown_are_reference_counted(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096"
    fake.env["FAKECUDA_ABSENT"] = "2"
    nv = fake.nvml()  # one init
    assert nv.do("init") == {}  # two
    assert nv.do("hold one 1") == {}
    write(fake, "add 2")
    # a nested shutdown ends nothing: the same session, the same list, the same handles
    assert nv.do("shutdown") == {} and nv.do("init") == {} and nv.do("shutdown") == {}
    assert nv.do("count") == {"count": 2}
    assert nv.do("ask one")["uuid"] == uuid(1)
    assert nv.do("shutdown") == {}  # the last reference: the session ends
    assert nv.do("count")["code"] == UNINITIALIZED
    assert nv.do("ask one")["uuid"] == {"code": UNINITIALIZED}
    assert nv.do("shutdown") == {"code": UNINITIALIZED}
    assert nv.do("init") == {}  # a new session sees the bus as it is now
    assert [d["uuid"] for d in nv.do("list")["devices"]] == [uuid(0), uuid(1), uuid(2)]
    assert nv.do("ask one")["uuid"] == {"code": INVALID_ARGUMENT}  # the same GPU, an old handle


def test_a_gpu_added_after_init_is_found_by_no_path_until_a_new_session(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096"
    fake.env["FAKECUDA_ABSENT"] = "1"
    nv, other = fake.nvml(), fake.nvml()
    write(fake, "add 1")
    for probe in (nv, other):
        assert probe.do("count") == {"count": 2}
        assert probe.do("hold x 2") == {"code": INVALID_ARGUMENT}
        assert probe.do(f"hold x {uuid(1)}") == {"code": NOT_FOUND}
        assert probe.do("hold x 00000000:01:00.0") == {"code": NOT_FOUND}
    assert nv.do("hold two 00000000:02:00.0") == {}
    assert nv.do("ask two")["index"] == 1
    assert nv.do("reinit") == {}
    assert nv.do("hold x 00000000:01:00.0") == {}
    assert [d["uuid"] for d in nv.do("list")["devices"]] == [uuid(0), uuid(1), uuid(2)]
    assert other.do("count") == {"count": 2}  # each process has its own session
    # a process started now sees the bus as it is
    assert fake.nvml().do("count") == {"count": 3}


def test_event_sets_end_with_the_session(fake: Fake) -> None:
    out = fake.python(
        PRELUDE
        + """
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeXidCriticalError, s)
n.nvmlInit()
n.nvmlShutdown()
nested = val(lambda: n.nvmlEventSetWait_v2(s, 10) and 0)
event("xid 0 31")  # before the next session: history for its sets
n.nvmlShutdown()
n.nvmlInit()
event("xid 0 48")
s2 = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeXidCriticalError, s2)
e = n.nvmlEventSetWait_v2(s2, 1000)
print(json.dumps({"nested": nested, "after": val(lambda: n.nvmlEventSetWait_v2(s, 10) and 0),
                  "free": val(n.nvmlEventSetFree, s), "new": e.eventData,
                  "then": val(lambda: n.nvmlEventSetWait_v2(s2, 10) and 0)}))
"""
    )
    assert out["nested"] == {"code": TIMEOUT}  # still the set's session
    assert out["after"] == out["free"] == {"code": INVALID_ARGUMENT}
    assert out["new"] == 48 and out["then"] == {"code": TIMEOUT}


def test_absent_at_start_then_added(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096,2048"
    fake.env["FAKECUDA_ABSENT"] = "1,3"
    nv = fake.nvml()
    listed = nv.do("list")
    assert listed["count"] == 2
    assert [d["uuid"] for d in listed["devices"]] == [uuid(0), uuid(2)]
    assert nv.do(f"hold x {uuid(3)}") == {"code": NOT_FOUND}
    write(fake, "add 3", "add 3", "lost 2")  # a second add is a no-op
    listed = nv.do("list")
    assert listed["count"] == 2 and lost(listed["devices"][1]["uuid"])
    assert nv.do("reinit") == {}
    listed = nv.do("list")
    assert listed["count"] == 3
    assert listed["devices"][0]["uuid"] == uuid(0)
    assert lost(listed["devices"][1]["uuid"])  # device 2, lost, still enumerated
    assert listed["devices"][2] == {**listed["devices"][2], "uuid": uuid(3), "index": 2}


def test_state_follows_the_file_and_processes_agree(fake: Fake) -> None:
    fake.env["FAKECUDA_DEVICES"] = "8192,4096,4096"
    a, b = fake.nvml(), fake.nvml()
    write(fake, "xid 0 13", "remove 0", "bogus 1", "lost", "replace 7", "add x", "replace 2")
    assert a.do("reinit") == b.do("reinit") == {}
    seen_a, seen_b = a.do("list"), b.do("list")
    assert seen_a == seen_b
    assert [d["uuid"] for d in seen_a["devices"]] == [uuid(1), uuid(2, gen=1)]
    # truncating the file is a new history: everything back to the start-up state
    pathlib.Path(fake.env["FAKECUDA_EVENTS"]).write_text("")
    assert a.do("reinit") == b.do("reinit") == {}
    assert [d["uuid"] for d in a.do("list")["devices"]] == [uuid(0), uuid(1), uuid(2)]
    # a line still being written (no newline yet) does not count
    with open(fake.env["FAKECUDA_EVENTS"], "a") as f:
        f.write("remove 1")
    assert b.do("reinit") == {} and b.do("list")["count"] == 3
    with open(fake.env["FAKECUDA_EVENTS"], "a") as f:
        f.write("\n")
    assert a.do("reinit") == b.do("reinit") == {}
    assert a.do("list")["count"] == b.do("list")["count"] == 2


def test_xid_ecc_healthy_events_still_delivered_around_bus_lines(fake: Fake) -> None:
    write(fake, "remove 0", "xid 1 48", "add 0", "ecc 1", "healthy 1", "replace 1")
    out = fake.python(
        PRELUDE
        + """
h = n.nvmlDeviceGetHandleByIndex(1)
s = n.nvmlEventSetCreate()
kinds = (n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
         | n.nvmlEventTypeGpuRecoveryAction)
n.nvmlDeviceRegisterEvents(h, kinds, s)
event("lost 1")
got = []
while True:
    try:
        e = n.nvmlEventSetWait_v2(s, 200)
    except n.NVMLError_Timeout:
        break
    got.append([e.eventType, e.eventData])
print(json.dumps(got))
"""
    )
    assert out == [[8, 48], [2, 0], [0x8000, 0], [8, 79]]
