"""The ledger's state machine and its invariants under random operation sequences."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.builders import container, node, pod
from tests.fuzz import examples
from vgpud.core.allocate import Allocator
from vgpud.core.ledger import State
from vgpud.core.model import Defaults, GpuUsage
from vgpud.core.requests import parse_pod


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_assume_is_idempotent_and_confirm_makes_it_permanent() -> None:
    clock = Clock()
    a = Allocator(Defaults(assume_ttl=30), clock)
    a.set_node(node("n", 1, 10000))
    r = parse_pod(pod("a", memory=4000), a.defaults)
    d = a.schedule(r)
    assert d.placement is not None
    assert a.assume(r, d.placement) is None  # again: no double charge
    assert a.cluster.usage("n", "GPU-n-0").memory == 4000
    a.confirm(r.uid, r.key, d.placement)
    entry = a.ledger.get(r.uid)
    assert entry is not None and entry.state is State.CONFIRMED
    clock.now = 1000
    assert a.expire() == []
    assert a.forget(r.uid) and not a.forget(r.uid)
    assert a.cluster.usage("n", "GPU-n-0").memory == 0


def test_unconfirmed_assumptions_expire() -> None:
    clock = Clock()
    a = Allocator(Defaults(assume_ttl=30), clock)
    a.set_node(node("n", 1, 10000))
    r = parse_pod(pod("a", memory=10000), a.defaults)
    assert a.schedule(r).placement is not None
    assert a.schedule(parse_pod(pod("b", memory=10000), a.defaults)).placement is None
    clock.now = 29.9
    assert a.expire() == []
    clock.now = 30
    assert [e.uid for e in a.expire()] == [r.uid]
    assert a.schedule(parse_pod(pod("b", memory=10000), a.defaults)).placement is not None


def test_confirm_records_reality_and_replaces_a_changed_assignment() -> None:
    a = Allocator()
    a.set_node(node("n", 2, 10000))
    r = parse_pod(pod("a", memory=4000), a.defaults)
    d = a.place(r, "n")
    assert not isinstance(d, type(None))
    a.confirm("u1", "default/a", d)  # never assumed here (a restart)
    assert a.cluster.usage("n", "GPU-n-0").memory == 4000
    other = a.place(parse_pod(pod("x", memory=4000, annotations={
        "nvidia.com/include-gpu-uuid": "GPU-n-1"}), a.defaults), "n")
    a.confirm("u1", "default/a", other)  # the plugin moved it
    assert a.cluster.usage("n", "GPU-n-0").memory == 0
    assert a.cluster.usage("n", "GPU-n-1").memory == 4000
    assert a.ledger.violations() == []


def test_same_uid_cannot_hold_two_different_placements() -> None:
    a = Allocator()
    a.set_node(node("n", 2, 10000))
    r = parse_pod(pod("a", memory=4000), a.defaults)
    assert a.schedule(r).placement is not None
    p2 = a.place(parse_pod(pod("a", memory=5000), a.defaults), "n")
    why = a.assume(r, p2)  # type: ignore[arg-type]
    assert why is not None and why.code == "already-placed"


def test_a_shrunk_inventory_keeps_holders_and_admits_nothing_more() -> None:
    a = Allocator()
    a.set_node(node("n", 1, 10000))
    assert a.schedule(parse_pod(pod("a", memory=8000), a.defaults)).placement is not None
    a.set_node(node("n", 1, 6000))  # e.g. memory scaling lowered
    assert a.cluster.usage("n", "GPU-n-0").memory == 8000
    assert any("exceeds capacity" in v for v in a.ledger.violations())
    got = a.filter(parse_pod(pod("b", memory=1), a.defaults), ["n"])
    assert got.feasible == [] and got.failed["n"].resolvable


def test_an_exclusive_init_container_shares_its_gpu_only_with_its_own_phases() -> None:
    """Found by hypothesis (issue 8): an init container asking for a whole GPU and two
    app containers asking for 1 MiB each land on one GPU. The pod holds the maximum of
    its phases (2 vGPUs, the whole memory, 100 % cores, exclusively) — its phases never
    run together, so that is no violation; another pod still cannot join."""
    a = Allocator()
    a.set_node(node("n", 1, 10000))
    r = parse_pod(pod("a", containers=[container("c0", memory=1), container("c1", memory=1)],
                      init=[container("i0", cores=100)]), a.defaults)
    d = a.schedule(r)
    assert d.placement is not None
    assert {dev.uuid for c in d.placement.containers for dev in c.devices} == {"GPU-n-0"}
    assert a.cluster.usage("n", "GPU-n-0") == GpuUsage(vgpus=2, memory=10000, cores=100,
                                                       exclusive=1)
    assert a.ledger.violations() == []
    other = a.schedule(parse_pod(pod("b", memory=1), a.defaults))
    assert other.placement is None and other.reason is not None
    assert "held whole" in other.reason.message


shapes = st.fixed_dictionaries({
    "number": st.integers(1, 3),
    "memory": st.one_of(st.none(), st.integers(1, 50000)),
    "cores": st.integers(0, 100),
}, optional={"percent": st.integers(1, 100)})


class LedgerMachine(RuleBasedStateMachine):
    """Random clusters, pods, binds, confirms, forgets, expiries and node changes."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.alloc = Allocator(Defaults(assume_ttl=10), self.clock)
        self.uids: list[str] = []
        self.count = 0
        self.specs: dict[str, tuple[int, int, int, float]] = {}

    @rule(name=st.sampled_from(["a", "b", "c", "d"]), n=st.integers(0, 4),
          memory=st.sampled_from([8000, 16000, 40000]), split=st.integers(1, 4),
          scaling=st.sampled_from([1.0, 1.5, 3.0]))
    def set_node(self, name: str, n: int, memory: int, split: int, scaling: float) -> None:
        # Inventories only grow here: a shrink may overcommit what pods already hold
        # (reality, tested on its own below); what must never happen is that the
        # ledger *admits* an overcommit.
        old = self.specs.get(name, (0, 0, 0, 0.0))
        spec = self.specs[name] = (max(n, old[0]), max(memory, old[1]), max(split, old[2]),
                                   max(scaling, old[3]))
        n, memory, split, scaling = spec
        self.alloc.set_node(node(name, n, memory, split=split, scaling=scaling,
                                 numa=tuple(i % 2 for i in range(n))))

    @rule(name=st.sampled_from(["a", "b", "c", "d"]))
    def remove_node(self, name: str) -> None:
        self.alloc.remove_node(name)

    @rule(shape=shapes, second=st.one_of(st.none(), shapes), init=st.one_of(st.none(), shapes),
          topology=st.sampled_from(["", "numa", "link"]),
          policy=st.sampled_from(["binpack", "spread"]))
    def schedule(self, shape: dict, second: dict | None, init: dict | None, topology: str,
                 policy: str) -> None:
        self.count += 1
        cs = [container("c0", **{k: v for k, v in shape.items() if v is not None})]
        if second:
            cs.append(container("c1", **{k: v for k, v in second.items() if v is not None}))
        inits = ([container("i0", **{k: v for k, v in init.items() if v is not None})]
                 if init else None)
        if shape.get("memory") is not None and "percent" in shape:
            del cs[0]["resources"]["limits"]["nvidia.com/vgpu-memory-percentage"]
        for c in [*cs, *(inits or [])]:
            lim = c["resources"]["limits"]
            if "nvidia.com/vgpu-memory" in lim and "nvidia.com/vgpu-memory-percentage" in lim:
                del lim["nvidia.com/vgpu-memory-percentage"]
        ann = {"nvidia.com/device-scheduler-policy": policy}
        if topology:
            ann["nvidia.com/device-topology-mode"] = topology
        r = parse_pod(pod(f"p{self.count}", containers=cs, init=inits, annotations=ann),
                      self.alloc.defaults)
        d = self.alloc.schedule(r)
        if d.placement is not None:
            self.uids.append(r.uid)
            # what filter said feasible, place must agree with
            assert d.reason is None

    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        if self.uids:
            uid = data.draw(st.sampled_from(self.uids))
            e = self.alloc.ledger.get(uid)
            if e is not None:
                self.alloc.confirm(uid, e.key, e.placement)

    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        if self.uids:
            uid = data.draw(st.sampled_from(self.uids))
            self.alloc.forget(uid)

    @rule(dt=st.floats(0, 20))
    def tick(self, dt: float) -> None:
        self.clock.now += dt
        for e in self.alloc.expire():
            assert e.state is State.ASSUMED and e.deadline is not None
            assert e.deadline <= self.clock.now

    @invariant()
    def invariants_hold(self) -> None:
        # capacity, split and exclusivity per GPU, and the arrays equal the entries' sum
        assert self.alloc.ledger.violations() == []


LedgerMachine.TestCase.settings = settings(max_examples=examples(150, 2000),
                                           stateful_step_count=30)
TestLedger = pytest.mark.property(LedgerMachine.TestCase)
