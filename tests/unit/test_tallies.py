"""serving/tallies.py's timing: a tally is written within FLUSH_S of its first observation, and
every tally of a loop on one grid, so that one wake-up of the loop writes them all."""

from __future__ import annotations

import asyncio

import pytest

from serving.tallies import FLUSH_S, Flushes, next_flush


@pytest.mark.parametrize("now", [0.0, 0.01, FLUSH_S - 1e-6, FLUSH_S, 12.3456, 86_400.1])
def test_the_next_flush_is_the_first_instant_of_the_grid_after_now(now: float) -> None:
    at = next_flush(now)
    assert now < at <= now + FLUSH_S
    assert at / FLUSH_S == pytest.approx(round(at / FLUSH_S))


def test_tallies_armed_at_different_moments_are_written_at_one_instant() -> None:
    written: dict[str, float] = {}
    armed: dict[str, float] = {}

    async def arm_two() -> None:
        loop = asyncio.get_running_loop()
        first = Flushes(lambda: written.setdefault("first", loop.time()))
        second = Flushes(lambda: written.setdefault("second", loop.time()))
        # Just after an instant of the grid, so that both are armed before the next one.
        await asyncio.sleep(next_flush(loop.time()) - loop.time() + 0.005)
        first.soon()
        armed["first"] = loop.time()
        await asyncio.sleep(FLUSH_S * 0.4)
        second.soon()
        armed["second"] = loop.time()
        await asyncio.sleep(FLUSH_S * 1.5)

    asyncio.run(arm_two())
    assert written.keys() == {"first", "second"}
    # Timed from each one's arming they would be written FLUSH_S * 0.4 apart; on the grid, in one
    # pass of the loop.
    assert abs(written["second"] - written["first"]) < FLUSH_S * 0.2, written
    for name in written:  # and neither later than FLUSH_S after it was armed (a loop's slack)
        assert armed[name] < written[name] <= armed[name] + FLUSH_S + 0.05, (armed, written)
