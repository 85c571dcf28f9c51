"""Pods scored but not yet bound (intents): scoring counts them, filter does not, and
prioritize reuses the filter's work for the same pod while nothing changed."""

from __future__ import annotations

from tests.builders import node, pod
from vgpud.core.allocate import INTENT_TTL, Allocator
from vgpud.core.model import Defaults, Placement, Policy
from vgpud.core.requests import parse_pod


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_node_the_pod_no_longer_fits_once_intents_count_scores_zero() -> None:
    clock = Clock()
    a = Allocator(Defaults(), clock=clock)
    a.set_node(node("full", 1, 10000))  # one GPU: room for one 6000 MiB pod
    a.set_node(node("roomy", 2, 10000))
    held = a.schedule(parse_pod(pod("old", memory=2000), a.defaults), ["full"])
    assert held.placement is not None  # binpack now prefers "full"
    first = parse_pod(pod("first", memory=6000), a.defaults)
    second = parse_pod(pod("second", memory=6000), a.defaults)
    _, scores = a.score_array(first, ["full", "roomy"])
    assert scores[0] > scores[1] > 0  # binpack: the fuller node
    a.intend(first, ["full"])
    _, scores = a.score_array(second, ["full", "roomy"])
    assert scores[0] == 0 and scores[1] > 0  # "full" is spoken for
    # filter stays exact: an intent is not a hold
    assert a.filter(second, ["full", "roomy"]).feasible == ["full", "roomy"]
    # the intent's own pod is not discounted by itself
    _, own = a.score_array(first, ["full", "roomy"])
    assert own[0] > own[1]
    # the bind (assume) ends it; so does time
    clock.now += INTENT_TTL + 1
    _, later = a.score_array(second, ["full", "roomy"])
    assert later[0] > 0 and a.intents() == 0


def test_an_intent_ends_at_the_bind_and_spread_pods_are_not_pushed_off() -> None:
    a = Allocator(Defaults(node_policy=Policy.SPREAD))
    a.set_node(node("n1", 2, 10000))
    a.set_node(node("n2", 2, 10000))
    p = parse_pod(pod("p", memory=1000), a.defaults)
    q = parse_pod(pod("q", memory=1000), a.defaults)
    a.intend(p, ["n1"])
    _, scores = a.score_array(q, ["n1", "n2"])
    assert (scores > 0).all()  # room for both: nothing is zeroed
    placed = a.place(p, "n1")
    assert isinstance(placed, Placement) and a.assume(p, placed) is None
    assert a.intents() == 0


def test_prioritize_reuses_the_filter_for_the_same_pod_and_state() -> None:
    a = Allocator(Defaults())
    for i in range(3):
        a.set_node(node(f"n{i}", 4, 20000, numa=(0, 0, 1, 1)))
    two = parse_pod(pod("two", number=2, memory=1000), a.defaults)
    a.filter(two, ["n0", "n1", "n2"])
    assert a._reuse(two, a._indices(["n0", "n2"])[0]) is not None  # type: ignore[arg-type]
    other = parse_pod(pod("other", memory=1000), a.defaults)
    assert a._reuse(other, a._indices(["n0"])[0]) is None  # type: ignore[arg-type]
    a.schedule(other, ["n0"])  # usage changed: the filter's view is stale
    assert a._reuse(two, a._indices(["n0"])[0]) is None  # type: ignore[arg-type]
    # and a reused result scores as a fresh one would
    a.filter(two, ["n0", "n1", "n2"])
    _, reused = a.score_array(two, ["n0", "n1", "n2"])
    a._last = None
    _, fresh = a.score_array(two, ["n0", "n1", "n2"])
    assert reused.tolist() == fresh.tolist()
