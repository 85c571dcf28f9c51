"""Polling with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def eventually(
    predicate: Callable[[], bool], *, within: float = 10.0, what: str = "condition"
) -> None:
    """Wait (real time) until ``predicate()`` holds; fail the test after ``within`` s."""
    with anyio.move_on_after(within):
        # Polling is the point: the predicate reads state that has no event to await.
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.005)
        return
    raise AssertionError(f"timed out after {within}s waiting for {what}")
