"""GPU-aware victim selection: enough room, minimal, never an equal or higher priority."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import node, pod
from tests.fuzz import examples
from vgpud.core.allocate import Allocator
from vgpud.core.choose import place_released
from vgpud.core.ledger import Entry
from vgpud.core.model import Defaults, Placement, PodRequest
from vgpud.core.preempt import Budget, Holder, Proposal, Requirement, preempt, select_victims
from vgpud.core.requests import parse_pod


class Cluster:
    """An allocator with confirmed pods of given priorities on one node."""

    def __init__(self, gpus: int = 1, memory: int = 10000, split: int = 10) -> None:
        self.a = Allocator(Defaults())
        self.a.set_node(node("n", gpus, memory, split=split))
        self.prio: dict[str, int] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.deleting: set[str] = set()

    def hold(self, name: str, priority: int = 0, labels: dict[str, str] | None = None,
             **limits: int) -> str:
        r = parse_pod(pod(name, **limits), self.a.defaults)
        d = self.a.schedule(r)
        assert d.placement is not None, d.reason
        self.a.confirm(r.uid, r.key, d.placement)
        self.prio[r.uid] = priority
        self.labels[r.uid] = labels or {}
        return r.uid

    def describe(self, e: Entry) -> Holder:
        ns, name = e.key.split("/")
        return Holder(e.uid, ns, name, self.prio[e.uid], e.placement,
                      tuple(sorted(self.labels[e.uid].items())), deleting=e.uid in self.deleting)

    def want(self, **limits: int) -> PodRequest:
        return parse_pod(pod("high", **limits), self.a.defaults)

    def run(self, req: PodRequest, priority: int, victims: tuple[str, ...] = (),
            budgets: tuple[Budget, ...] = (), pdb: int = 0):  # type: ignore[no-untyped-def]
        got = preempt(self.a.cluster, self.a.ledger, req, priority,
                      {"n": Proposal(victims, pdb)}, self.describe, budgets)
        return got["n"]

    def freed(self, uids: tuple[str, ...]) -> dict[str, int]:
        total: dict[str, int] = {}
        for uid in uids:
            e = self.a.ledger.get(uid)
            if e is not None:
                for u in e.placement.charge().values():
                    total["memory"] = total.get("memory", 0) + u.memory
                    total["cores"] = total.get("cores", 0) + u.cores
        return total


def test_adds_exactly_the_gpu_victims_needed_to_what_kube_scheduler_proposed() -> None:
    c = Cluster()
    low = [c.hold(f"low{i}", 0, memory=2500, cores=25) for i in range(4)]
    out = c.run(c.want(memory=5000, cores=50), 100, victims=(low[0],))
    assert out.victims is not None and out.victims[0] == low[0]
    assert len(out.victims) == 2 and len(out.added) == 1
    assert c.freed(out.victims) == {"memory": 5000, "cores": 50}


def test_an_empty_placeholder_is_filled_with_gpu_victims() -> None:
    """kube-scheduler 1.38+ (kubernetes#135486) passes a node only an extender refused as
    a placeholder without victims; the extender fills it, or leaves the node out."""
    c = Cluster()
    low = [c.hold(f"low{i}", 0, memory=2500) for i in range(4)]
    out = c.run(c.want(memory=5000), 100)
    assert out.victims is not None and len(out.victims) == 2 and out.added == out.victims
    assert set(out.victims) <= set(low)
    assert c.run(c.want(memory=12000), 100).victims is None  # more than the GPU: left out


def test_a_proposal_that_already_frees_the_gpu_is_returned_unchanged() -> None:
    c = Cluster()
    low = [c.hold(f"low{i}", 0, memory=5000) for i in range(2)]
    out = c.run(c.want(memory=5000), 10, victims=(low[1],), pdb=1)
    assert out.victims == (low[1],) and out.pdb_violations == 1 and out.added == ()


def test_cpu_only_victims_with_no_gpu_room_to_gain_drop_the_node() -> None:
    c = Cluster()
    c.hold("peer", 100, memory=10000)
    out = c.run(c.want(memory=4000), 100, victims=("uid-cpu-only-pod",))
    assert out.victims is None
    assert "no lower-priority pod" in out.reason


def test_equal_or_higher_priority_holders_are_never_victims() -> None:
    c = Cluster()
    c.hold("same", 50, memory=6000)
    c.hold("lower", 49, memory=4000)
    out = c.run(c.want(memory=8000), 50)
    assert out.victims is None and "still leaves too little" in out.reason
    out = c.run(c.want(memory=4000), 50)
    assert out.victims == ("uid-lower",)


def test_a_proposed_victim_of_higher_priority_drops_the_node() -> None:
    c = Cluster()
    top = c.hold("top", 1000, memory=6000)
    out = c.run(c.want(memory=4000), 10, victims=(top,))
    assert out.victims is None and "not lower" in out.reason


def test_fewest_victims_the_largest_go() -> None:
    c = Cluster()
    small = [c.hold(f"s{i}", 0, memory=1000) for i in range(3)]
    big = c.hold("big", 0, memory=4000)
    out = c.run(c.want(memory=4000), 10)
    assert out.victims == (big,), (out, small)


def test_lowest_priority_goes_first() -> None:
    c = Cluster()
    c.hold("p5", 5, memory=5000)
    p1 = c.hold("p1", 1, memory=5000)
    out = c.run(c.want(memory=5000), 10)
    assert out.victims == (p1,)


def test_budgets_are_honoured_and_violations_counted() -> None:
    c = Cluster()
    guarded = c.hold("guarded", 0, {"app": "db"}, memory=5000)
    free = c.hold("free", 0, {"app": "web"}, memory=5000)
    budget = Budget("default", "db", (("app", "db"),), (), disruptions_allowed=0)
    out = c.run(c.want(memory=5000), 10, budgets=(budget,))
    assert out.victims == (free,) and out.pdb_violations == 0
    out = c.run(c.want(memory=10000), 10, budgets=(budget,))
    assert set(out.victims or ()) == {guarded, free} and out.pdb_violations == 1


def test_budget_selectors_as_the_api_defines_them() -> None:
    b = Budget("ns", "b", (), (Requirement("tier", "In", ("gpu", "cpu")),
                               Requirement("canary", "DoesNotExist")), 1)
    assert b.selects("ns", "x", {"tier": "gpu"})
    assert not b.selects("ns", "x", {"tier": "gpu", "canary": "1"})
    assert not b.selects("other", "x", {"tier": "gpu"})
    assert not b.selects("ns", "x", {})
    assert not Budget("ns", "b", (("a", "b"),), (), 0, frozenset({"x"})).selects(
        "ns", "x", {"a": "b"})
    # policy/v1: an empty selector selects every pod of the namespace, labelled or not;
    # no selector selects none
    everything = Budget("ns", "all", (), (), 0)
    assert everything.selects("ns", "x", {"a": "b"}) and everything.selects("ns", "y", {})
    assert not everything.selects("other", "x", {"a": "b"})
    assert not Budget("ns", "nil", (), (), 0, selects_nothing=True).selects("ns", "x", {})
    # selectors match a pod without labels where the API says they do
    assert Budget("ns", "d", (), (Requirement("canary", "DoesNotExist"),), 0).selects(
        "ns", "x", {})


def test_a_pod_being_deleted_is_counted_as_leaving_not_chosen() -> None:
    c = Cluster()
    going = c.hold("going", 0, memory=5000)
    c.hold("stays", 0, memory=5000)
    c.deleting.add(going)
    out = c.run(c.want(memory=5000), 10, victims=("uid-cpu",))
    assert out.victims == ("uid-cpu",) and out.added == ()


def test_unknown_node() -> None:
    c = Cluster()
    out = select_victims(c.a.cluster, c.want(memory=1), 1, "ghost", Proposal(("x",)), ())
    assert out.victims is None and "no vgpud GPU inventory" in out.reason


@pytest.mark.property
@settings(max_examples=examples(60, 1000), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(0, 40)),
                min_size=1, max_size=12),
       st.integers(1, 16), st.integers(0, 60), st.integers(1, 4))
def test_victims_free_enough_are_minimal_and_all_lower(
        held: list[tuple[int, int, int]], want_mem: int, want_cores: int,
        priority: int) -> None:
    c = Cluster(gpus=2, memory=16000, split=6)
    for i, (prio, mem, cores) in enumerate(held):
        r = parse_pod(pod(f"h{i}", memory=mem * 1000, cores=cores), c.a.defaults)
        d = c.a.schedule(r)
        if d.placement is None:
            continue
        c.a.confirm(r.uid, r.key, d.placement)
        c.prio[r.uid], c.labels[r.uid] = prio, {}
    req = c.want(memory=want_mem * 1000, cores=want_cores)
    out = c.run(req, priority)
    if out.victims is None:
        everyone = {e.uid for e in c.a.ledger.entries() if c.prio[e.uid] < priority}
        released = _charges(c, everyone)
        fits = isinstance(place_released(c.a.cluster, req, "n", released), Placement)
        assert not fits or not everyone or isinstance(c.a.place(req, "n"), Placement)
        return
    assert all(c.prio[u] < priority for u in out.victims)
    assert isinstance(place_released(c.a.cluster, req, "n", _charges(c, set(out.victims))),
                      Placement)
    for spared in out.added:
        rest = set(out.victims) - {spared}
        assert not isinstance(place_released(c.a.cluster, req, "n", _charges(c, rest)),
                              Placement), f"{spared} need not go"


def _charges(c: Cluster, uids: set[str]):  # type: ignore[no-untyped-def]
    out = {}
    for uid in uids:
        e = c.a.ledger.get(uid)
        assert e is not None
        for uuid, u in e.placement.charge().items():
            out[uuid] = out[uuid] + u if uuid in out else u
    return out
