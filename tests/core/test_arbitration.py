"""The node's priority decision per GPU, and the shares it implies."""

from __future__ import annotations

from vgpud.core.arbitration import Arbiter, Contender, Share, shares
from vgpud.core.model import ComputePolicy

MEMBERS = {"g": [("hi", 10), ("mid", 5), ("lo", 0)]}


def busy(*keys: str) -> list[Contender]:
    prio = dict(MEMBERS["g"])
    return [Contender(k, "g", prio[k], 40) for k in keys]


def test_the_highest_active_priority_holds_the_lower_ones() -> None:
    a = Arbiter(floor_permille=50, hold=1.0)
    r = a.decide(0.0, ["g"], MEMBERS, busy("hi", "lo"))["g"]
    assert (r.active, r.top_priority, r.held, r.running) == (True, 10, ("lo", "mid"), ("hi",))
    assert r.floor_permille == 50


def test_idle_for_longer_than_the_hold_lets_the_next_one_in() -> None:
    a = Arbiter(hold=1.0)
    a.decide(0.0, ["g"], MEMBERS, busy("hi", "mid", "lo"))
    # hi quiet (0 %) but within the hold: still on top
    r = a.decide(0.9, ["g"], MEMBERS, [Contender("hi", "g", 10, 0), *busy("mid", "lo")])["g"]
    assert r.top_priority == 10
    r = a.decide(1.5, ["g"], MEMBERS, busy("mid", "lo"))["g"]
    assert (r.top_priority, r.held) == (5, ("lo",))
    r = a.decide(5.0, ["g"], MEMBERS, [])["g"]
    assert not r.active and r.held == ()


def test_equal_priorities_do_not_hold_each_other_and_other_gpus_are_apart() -> None:
    a = Arbiter()
    members = {"g": [("a", 1), ("b", 1)], "h": [("c", 0)]}
    out = a.decide(0.0, ["g", "h"], members,
                   [Contender("a", "g", 1, 50), Contender("b", "g", 1, 50),
                    Contender("c", "h", 0, 90)])
    assert out["g"].held == () and out["g"].running == ("a", "b")
    assert out["h"].top_priority == 0 and out["h"].held == ()


def test_a_container_that_left_is_forgotten() -> None:
    a = Arbiter(hold=10.0)
    a.decide(0.0, ["g"], MEMBERS, busy("hi"))
    r = a.decide(1.0, ["g"], {"g": [("mid", 5), ("lo", 0)]}, busy("lo"))["g"]
    assert r.top_priority == 0 and r.held == ()


def test_shares_sixty_sixty_under_balance() -> None:
    hi = Share("hi", 10, 60, ComputePolicy.BALANCE, busy=True)
    lo = Share("lo", 0, 60, ComputePolicy.BALANCE, busy=True)
    assert shares([hi, lo]) == {"hi": 95.0, "lo": 5.0}
    assert shares([Share("hi", 10, 60, ComputePolicy.BALANCE, busy=False), lo]) == {
        "hi": 0.0, "lo": 100.0}
    fixed = Share("hi", 10, 60, ComputePolicy.FIXED, busy=True)
    assert shares([fixed, lo]) == {"hi": 60.0, "lo": 5.0}
    # equal priorities over-subscribed: in proportion to their limits
    assert shares([Share("a", 0, 60, ComputePolicy.FIXED, True),
                   Share("b", 0, 60, ComputePolicy.FIXED, True)]) == {"a": 50.0, "b": 50.0}
