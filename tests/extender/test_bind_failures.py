"""The extender's bind when the API write fails, through the in-memory binder
(tests/doubles.py): no API server, each failure as kube-apiserver answers it.

What bind promises (vgpud/extender/routes.py): the placement is assumed in the ledger
before the write, so a write in flight holds its GPUs; a failed write answers
kube-scheduler an ``Error`` that says why and forgets the placement, so the room is
free for the next pod (kube-scheduler retries this one); the extender's own counters
come back to rest.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests import builders
from tests.builders import node
from tests.doubles import (
    Faults,
    MemoryBinder,
    MemoryKube,
    Objects,
    forbidden,
    invalid,
    reset,
    timeout,
)
from vgpud.core.allocate import Allocator
from vgpud.core.codec import ASSIGNMENT, decode_assignment
from vgpud.core.ledger import State
from vgpud.extender.metrics import Metrics
from vgpud.extender.routes import Extender
from vgpud.extender.wire import BindingArgs, ExtenderArgs
from vgpud.kube.cache import Added
from vgpud.kube.writes import PodBinder, RetryPolicy
from vgpud.scheduling.projections import project_pod
from vgpud.scheduling.state import SchedulerState

pytestmark = pytest.mark.anyio

NS = "team"
GPU_MEMORY = 40000


def gpu_pod(name: str, memory: int = GPU_MEMORY) -> dict[str, Any]:
    """A pod asking one vGPU with ``memory`` MiB (the default: a whole GPU)."""
    return builders.gpu_pod(name, {"nvidia.com/vgpu-number": "1",
                                   "nvidia.com/vgpu-memory": str(memory)},
                            namespace=NS, annotations=None, phase="Pending")


class Setup:
    """One node with one GPU, the extender writing through ``binder``."""

    def __init__(self, binder: Any = None) -> None:
        self.alloc = Allocator()
        self.alloc.set_node(node("n1", 1, GPU_MEMORY))
        self.state = SchedulerState(self.alloc)
        self.binder = binder if binder is not None else MemoryBinder()
        self.objects: Objects = self.binder.objects
        self.faults: Faults = self.binder.faults
        self.ext = Extender(self.state, writer=self.binder,  # type: ignore[arg-type]
                            events=None,
                            metrics=Metrics(self.alloc))

    async def filtered(self, name: str, memory: int = GPU_MEMORY) -> dict[str, Any]:
        """Create the pod and run it through filter (which remembers its request)."""
        pod = self.objects.add_pod(gpu_pod(name, memory))
        got = await self.ext.filter(ExtenderArgs(pod, ("n1",), None))
        assert got["NodeNames"] == ["n1"], got
        return pod

    async def bind(self, pod: dict[str, Any], node: str = "n1") -> str:
        meta = pod["metadata"]
        got = await self.ext.bind(BindingArgs(meta["name"], NS, meta["uid"], node))
        return got["Error"]

    def holds(self, pod: dict[str, Any]) -> bool:
        return self.alloc.ledger.get(pod["metadata"]["uid"]) is not None


async def test_a_bind_writes_the_assignment_with_the_node() -> None:
    s = Setup()
    a = await s.filtered("a")
    assert await s.bind(a) == ""
    stored = s.objects.pod(NS, "a")
    assert stored["spec"]["nodeName"] == "n1"
    assert decode_assignment(stored["metadata"]["annotations"][ASSIGNMENT]).node == "n1"
    assert s.holds(a) and s.ext.binds_in_flight == 0


# -- failures the API server answers -----------------------------------------------------


def bound_elsewhere(s: Setup, pod: dict[str, Any]) -> None:
    s.objects.bind(NS, pod["metadata"]["name"], "n2", None, None)


def deleted(s: Setup, pod: dict[str, Any]) -> None:
    s.objects.delete_pod(NS, pod["metadata"]["name"])


def replaced(s: Setup, pod: dict[str, Any]) -> None:
    s.objects.delete_pod(NS, pod["metadata"]["name"])
    s.objects.add_pod(gpu_pod(pod["metadata"]["name"]))  # a new uid


def deleting(s: Setup, pod: dict[str, Any]) -> None:
    s.objects.mark_deleting(NS, pod["metadata"]["name"])


def refused(error: Any) -> Any:
    def script(s: Setup, pod: dict[str, Any]) -> None:
        s.faults.fail("bind", error)
    return script


FAILURES = {
    # what happens between filter and bind: the extender's answer says it
    "already bound (409)": (bound_elsewhere, "409 Conflict", "already assigned to node \"n2\""),
    "pod gone (404)": (deleted, "404 NotFound", 'pods "a" not found'),
    "pod replaced (409 uid)": (replaced, "409 Conflict", "Precondition failed: UID"),
    "being deleted (409)": (deleting, "409 Conflict", "is being deleted"),
    "forbidden (403)": (refused(forbidden("create", "pods/binding", "a")), "403 Forbidden",
                        'cannot create resource "pods/binding"'),
    "invalid (422)": (refused(invalid("a")), "422 Invalid", "metadata.annotations"),
    "timeout (504)": (refused(timeout()), "504 Timeout", "unable to return a response"),
    "connection reset": (refused(reset()), "connection reset", "connection reset"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_a_failed_bind_says_why_and_frees_the_room(failure: str) -> None:
    s = Setup()
    a = await s.filtered("a")
    b = await s.filtered("b")  # filtered while the GPU was free: it waits for the same room
    happen, status, words = FAILURES[failure]
    happen(s, a)
    error = await s.bind(a)
    assert error.startswith(f"could not bind {NS}/a to n1: "), error
    assert status in error and words in error, error
    assert not s.holds(a), "the failed bind's placement was not released"
    assert s.ext.binds_in_flight == 0
    # the room is free: the pod that waited for it binds
    assert await s.bind(b) == ""
    assert s.holds(b) and s.objects.pod(NS, "b")["spec"]["nodeName"] == "n1"


async def test_a_bind_in_flight_holds_its_room_and_a_failed_one_gives_it_back() -> None:
    s = Setup()
    a, b = await s.filtered("a"), await s.filtered("b")
    release = s.faults.hold("bind")
    s.faults.fail("bind", reset())
    answers: dict[str, str] = {}

    async def bind(pod: dict[str, Any]) -> None:
        answers[pod["metadata"]["name"]] = await s.bind(pod)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bind, a)
        await s.faults.arrived["bind"].wait()
        assert s.holds(a) and s.ext.binds_in_flight == 1
        # while a's write is in flight, b cannot take the GPU a assumed
        error = await s.bind(b)
        assert "cannot hold its GPUs on n1" in error or "no longer fits n1" in error, error
        assert not s.holds(b)
        release()
    assert answers["a"].startswith(f"could not bind {NS}/a to n1")
    assert not s.holds(a) and s.ext.binds_in_flight == 0
    assert await s.bind(b) == ""


async def test_a_retried_bind_to_a_full_node_fails_before_writing() -> None:
    """kube-scheduler retries a bind the extender answered late: the GPU is the pod's own
    now, so the place finds no room and no write is made (the first bind stands)."""
    s = Setup()
    a = await s.filtered("a")
    assert await s.bind(a) == ""
    s.state.on_pod(Added(f"{NS}/a", project_pod(s.objects.pod(NS, "a"))))  # the watch
    writes = s.faults.calls["bind"]
    error = await s.bind(a)
    assert error, "a second bind of a bound pod succeeded"
    assert s.faults.calls["bind"] == writes
    assert s.holds(a), "the bound pod's confirmed placement was dropped"


async def test_a_retried_bind_of_a_bound_pod_keeps_its_placement() -> None:
    """Was a bug: with room left on the GPU the retry re-assumed, the Binding answered
    409 and the pod's confirmed placement was forgotten. A confirmed pod's retry is
    answered as the Binding would be, with nothing written and nothing dropped."""
    s = Setup()
    a = await s.filtered("a", memory=GPU_MEMORY // 4)  # room left on the GPU
    assert await s.bind(a) == ""
    s.state.on_pod(Added(f"{NS}/a", project_pod(s.objects.pod(NS, "a"))))  # the watch
    writes = s.faults.calls["bind"]
    assert await s.bind(a) == f"pod {NS}/a is already bound to n1"  # kube-scheduler's retry
    assert s.faults.calls["bind"] == writes
    assert s.holds(a), "the bound pod's confirmed placement was dropped"
    entry = s.alloc.ledger.get(a["metadata"]["uid"])
    assert entry is not None and entry.state is State.CONFIRMED


# -- the answer lost ---------------------------------------------------------------------


def real_binder() -> tuple[Setup, Objects, Faults]:
    """The real PodBinder (its retries) over the in-memory API."""
    objects, faults = Objects(), Faults()
    binder = PodBinder(MemoryKube(objects, faults),  # type: ignore[arg-type]
                       retry=RetryPolicy(attempts=3, initial=0.001, jitter=0.0))
    binder.objects, binder.faults = objects, faults  # type: ignore[attr-defined]
    return Setup(binder), objects, faults


async def test_a_lost_answer_is_retried_by_the_binder_and_is_a_success() -> None:
    """The real PodBinder over the in-memory API: the first POST binds but its answer is
    lost (connection reset); the retry gets 409 "already assigned" to our node, which
    PodBinder reads as success, and so does the extender."""
    s, objects, faults = real_binder()
    a = await s.filtered("a")
    faults.fail("POST pods/binding", reset(), applied=True)
    assert await s.bind(a) == ""
    assert faults.calls["POST pods/binding"] == 2
    assert s.holds(a) and objects.pod(NS, "a")["spec"]["nodeName"] == "n1"
    assert ASSIGNMENT in objects.pod(NS, "a")["metadata"]["annotations"]


async def test_a_first_attempt_conflict_is_not_read_as_success() -> None:
    """A 409 on the first attempt is someone else's binding: the pod is not ours."""
    s, objects, faults = real_binder()
    a = await s.filtered("a")
    objects.bind(NS, "a", "n2", None, None)
    error = await s.bind(a)
    assert "already assigned to node \"n2\"" in error and not s.holds(a)
    assert faults.calls["POST pods/binding"] == 1


async def test_a_bind_whose_answer_was_lost_is_read_back() -> None:
    """Was a bug: every attempt unanswered but the first one landed, the extender freed
    the room and another pod was bound into the same GPU before the watch told. The pod
    is read back: bound here with this placement is a success, and the room stays held."""
    s = Setup()
    a, b = await s.filtered("a"), await s.filtered("b")
    s.faults.fail("bind", timeout(), applied=True)  # written, then no answer
    assert await s.bind(a) == ""
    assert s.objects.pod(NS, "a")["spec"]["nodeName"] == "n1" and s.holds(a)
    assert await s.bind(b) != "", "b was bound into the GPU a holds"
    assert s.objects.pod(NS, "b")["spec"].get("nodeName") is None


async def test_a_bind_of_unknown_outcome_keeps_its_room_until_the_watch_tells() -> None:
    """Unanswered, and the read-back unanswered too: whether it landed is unknown, so
    the room stays held (the watch confirms it, or the ledger's TTL frees it), and the
    answer says so. kube-scheduler's retry writes the same placement again."""
    s = Setup()
    a, b = await s.filtered("a"), await s.filtered("b")
    s.faults.fail("bind", timeout(), applied=True)
    s.faults.fail("read_pod", timeout())
    error = await s.bind(a)
    assert "504 Timeout" in error and "whether it landed is unknown" in error, error
    assert s.holds(a)
    assert await s.bind(b) != "", "b was bound into the GPU a may hold"
    assert await s.bind(a) == ""  # the retry: 409 from its own Binding, read back


async def test_a_bind_of_unknown_outcome_is_counted_again_once_watched() -> None:
    """Unknown outcome held, then the watch shows the pod bound: confirmed."""
    s = Setup()
    a = await s.filtered("a")
    s.faults.fail("bind", timeout(), applied=True)
    s.faults.fail("read_pod", timeout())
    assert "504 Timeout" in await s.bind(a)
    s.state.on_pod(Added(f"{NS}/a", project_pod(s.objects.pod(NS, "a"))))
    assert s.holds(a)


# -- a pod the extender did not filter (a restart since) -----------------------------------


async def test_an_unfiltered_pod_gone_or_unreadable_or_replaced_is_not_bound() -> None:
    s = Setup()
    pod = s.objects.add_pod(gpu_pod("a"))
    uid = pod["metadata"]["uid"]
    got = await s.ext.bind(BindingArgs("gone", NS, "uid-x", "n1"))
    assert got["Error"] == f"pod {NS}/gone not found"
    s.faults.fail("read_pod", timeout())
    got = await s.ext.bind(BindingArgs("a", NS, uid, "n1"))
    assert got["Error"].startswith(f"cannot read pod {NS}/a: 504 Timeout")
    got = await s.ext.bind(BindingArgs("a", NS, "uid-old", "n1"))
    assert got["Error"] == f"pod {NS}/a was replaced (uid {uid}, expected uid-old)"
    assert s.faults.calls["bind"] == 0 and len(s.alloc.ledger) == 0
    # read again, it binds
    assert (await s.ext.bind(BindingArgs("a", NS, uid, "n1")))["Error"] == ""


# -- retries of a bind whose outcome is unknown (a hostile review's four ways past the room) --


def two_nodes(binder: Any = None) -> Setup:
    s = Setup(binder)
    s.alloc.set_node(node("n2", 1, GPU_MEMORY))
    return s


async def filtered_on_both(s: Setup, name: str) -> dict[str, Any]:
    pod = s.objects.add_pod(gpu_pod(name))
    got = await s.ext.filter(ExtenderArgs(pod, ("n1", "n2"), None))
    assert set(got["NodeNames"]) == {"n1", "n2"}, got
    return pod


async def unknown_outcome(s: Setup, pod: dict[str, Any], node: str = "n1", *,
                          landed: bool) -> None:
    """Bind ``pod``: every attempt unanswered (``landed``: the first one applied) and the
    read-back unanswered too; the room stays held."""
    s.faults.fail("bind", timeout(), applied=landed)
    s.faults.fail("read_pod", timeout())
    assert "whether it landed is unknown" in await s.bind(pod, node)
    assert s.holds(pod)


async def test_a_retry_elsewhere_after_a_landed_unknown_bind_is_refused() -> None:
    """The pod's own held room steers kube-scheduler's retry to n2; before, the retry
    forgot n1's room, got 409 and freed n2's too, and c was bound into the GPU a runs on.
    Now the pod is read before the earlier room is given up: bound on n1, refused."""
    s = two_nodes()
    a, c = await filtered_on_both(s, "a"), await filtered_on_both(s, "c")
    await unknown_outcome(s, a, landed=True)
    assert await s.bind(a, "n2") == f"pod {NS}/a is already bound to n1"
    assert s.holds(a) and s.objects.pod(NS, "a")["spec"]["nodeName"] == "n1"
    assert await s.bind(c, "n1") != "", "c was bound into the GPU a runs on"
    s.state.on_pod(Added(f"{NS}/a", project_pod(s.objects.pod(NS, "a"))))
    assert s.alloc.ledger.violations() == []


async def test_a_retry_elsewhere_after_an_unknown_bind_that_did_not_land_goes_on() -> None:
    s = two_nodes()
    a, c = await filtered_on_both(s, "a"), await filtered_on_both(s, "c")
    await unknown_outcome(s, a, landed=False)
    assert await s.bind(a, "n2") == ""
    entry = s.alloc.ledger.get(a["metadata"]["uid"])
    assert entry is not None and entry.placement.node == "n2"
    assert await s.bind(c, "n1") == ""  # n1's room was given up once the pod showed it free


async def test_a_retry_elsewhere_with_the_pod_unreadable_keeps_the_earlier_room() -> None:
    s = two_nodes()
    a = await filtered_on_both(s, "a")
    await unknown_outcome(s, a, landed=True)
    s.faults.fail("read_pod", timeout())
    error = await s.bind(a, "n2")
    assert "an earlier bind to n1 ended unanswered" in error, error
    entry = s.alloc.ledger.get(a["metadata"]["uid"])
    assert entry is not None and entry.placement.node == "n1"
    assert s.faults.calls["bind"] == 1  # nothing written to n2


async def test_a_409_to_a_retry_with_the_pod_unreadable_keeps_the_room() -> None:
    """The 409 says the earlier Binding landed; the read-back failing must not free it."""
    s = Setup()
    a, b = await s.filtered("a"), await s.filtered("b")
    await unknown_outcome(s, a, landed=True)
    s.faults.fail("read_pod", timeout())
    assert "409 Conflict" in await s.bind(a)
    assert s.holds(a)
    assert await s.bind(b) != "", "b was bound into the GPU a runs on"


class SlowFirst(MemoryBinder):
    """The first bind waits for ``go``, then goes unanswered (not applied)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = anyio.Event()
        self.parked = anyio.Event()
        self.n = 0

    async def bind(self, namespace: str, name: str, node: str, **kw: Any) -> None:
        self.n += 1
        if self.n == 1:
            self.parked.set()
            await self.go.wait()
            raise timeout()
        await super().bind(namespace, name, node, **kw)


async def test_a_retry_while_the_first_bind_is_in_flight_is_refused() -> None:
    """kube-scheduler gave up on a slow bind (its HTTP timeout) and retried on another
    node: before, the retry bound a to n2 and the first call, failing late, forgot a's
    entry by uid (the n2 placement of a running pod). A bind of a pod whose bind is still
    in flight is refused, and a bind's failure releases only the placement it assumed."""
    binder = SlowFirst()
    s = two_nodes(binder)
    a, d = await filtered_on_both(s, "a"), await filtered_on_both(s, "d")
    answers: dict[str, str] = {}

    async def first() -> None:
        answers["first"] = await s.bind(a, "n1")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await binder.parked.wait()
        answers["retry"] = await s.bind(a, "n2")
        binder.go.set()
    assert answers["retry"] == f"a bind of pod {NS}/a is still in flight; try again once it " \
                               f"has ended"
    assert answers["first"].startswith(f"could not bind {NS}/a to n1: 504 Timeout")
    assert not s.holds(a) and s.objects.pod(NS, "a")["spec"].get("nodeName") is None
    assert await s.bind(a, "n2") == ""  # the next retry, once the first has ended
    assert await s.bind(d, "n2") != "", "d was bound into the GPU a holds"


async def test_a_retried_unknown_bind_is_assumed_afresh() -> None:
    """A retry reuses the earlier placement; before, it kept the first attempt's deadline,
    so the ledger's expiry dropped it while the retry's Binding was in flight, and b took
    the same GPU. The retry assumes the placement afresh: its TTL counts from the retry."""
    s = Setup()
    now = [0.0]
    s.alloc.clock = lambda: now[0]
    a, b = await s.filtered("a"), await s.filtered("b")
    await unknown_outcome(s, a, landed=False)
    now[0] = 119.0  # kube-scheduler's retry, after its backoffs
    release = s.faults.hold("bind")
    answers: dict[str, str] = {}

    async def retry() -> None:
        answers["a"] = await s.bind(a)

    async with anyio.create_task_group() as tg:
        tg.start_soon(retry)
        await s.faults.arrived["bind"].wait()
        now[0] = 121.0
        assert s.alloc.expire() == []  # the service's expiry loop, meanwhile
        release()
    assert answers["a"] == "" and s.holds(a)
    assert await s.bind(b) != "", "b was bound into the GPU a holds"
