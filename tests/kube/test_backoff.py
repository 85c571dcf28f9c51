"""``Backoff``: the one capped exponential backoff, on an injected clock."""

from __future__ import annotations

import pytest

from tests.kube.clocks import JumpClock
from vgpud.kube.backoff import Backoff


def test_doubles_to_the_cap_and_reset_starts_over() -> None:
    b = Backoff(0.5, 4.0, jitter=0.0)
    assert [b.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.next_delay() == 0.5


def test_jitter_stays_within_its_fraction_and_never_above_the_cap() -> None:
    low = Backoff(1.0, 2.0, jitter=0.25, random=lambda: 0.0)
    high = Backoff(1.0, 2.0, jitter=0.25, random=lambda: 0.999999)
    assert low.next_delay() == 0.75 and high.next_delay() == pytest.approx(1.25, abs=1e-5)
    assert [high.next_delay() for _ in range(3)] == [2.0, 2.0, 2.0]


def test_a_long_outage_stays_at_the_cap() -> None:
    b = Backoff(0.2, 30.0, jitter=0.0)
    b.attempt = 5000  # 0.2 * 2**5000 is past the largest float
    assert b.next_delay() == 30.0


@pytest.mark.parametrize("args", [(0.0, 1.0), (2.0, 1.0), (1.0, 2.0, 0.5), (1.0, 2.0, 2.0, 1.0)])
def test_refuses_a_shape_that_is_not_a_backoff(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Backoff(*args)


@pytest.mark.anyio
async def test_sleeps_on_its_clock_at_least_what_the_server_asked() -> None:
    clock = JumpClock()
    b = Backoff(1.0, 8.0, jitter=0.0, clock=clock)
    assert await b.sleep() == 1.0
    assert await b.sleep(at_least=5.0) == 5.0
    assert clock.sleeps == [1.0, 5.0]
